"""SSHPool against in-process asyncssh servers: host keys, errors, timeouts, reuse of connections."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from ftconsole.scheduler.errors import AuthError, CommandTimeout, HostKeyError, UnreachableError
from ftconsole.scheduler.spec.config import Node, SSHSettings
from ftconsole.scheduler.ssh.transport import SSHPool, local_user


@dataclass
class Server:
    port: int
    host_key: asyncssh.SSHKey
    commands: list[str]
    connections: list[object]


async def _handle(process: asyncssh.SSHServerProcess, spawned: list[asyncio.subprocess.Process]) -> None:
    """A tiny 'node': runs the command line with /bin/sh, like sshd does."""
    command = process.command or ""
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    spawned.append(proc)
    data = await process.stdin.read() if command.startswith("cat") else ""
    out, err = await proc.communicate(data.encode() if data else None)
    process.stdout.write(out.decode())
    process.stderr.write(err.decode())
    process.exit(proc.returncode or 0)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Server, Path]]:
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id"
    client_key.write_private_key(str(key_path))
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    commands: list[str] = []
    connections: list[object] = []
    spawned: list[asyncio.subprocess.Process] = []

    class Tracking(asyncssh.SSHServer):
        def connection_made(self, conn: object) -> None:
            connections.append(conn)

    handlers: set[asyncio.Task[None]] = set()

    async def handle(process: asyncssh.SSHServerProcess) -> None:
        commands.append(process.command or "")
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        with contextlib.suppress(asyncssh.Error, BrokenPipeError):  # the client went away (a timed-out command)
            await _handle(process, spawned)

    acceptor = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_factory=Tracking,
        server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(client_key.export_public_key().decode()),
        process_factory=handle,
    )
    port = acceptor.sockets[0].getsockname()[1]
    try:
        yield Server(port, host_key, commands, connections), key_path
    finally:
        acceptor.close()
        await acceptor.wait_closed()
        for proc in spawned:  # e.g. the `sleep` left behind by the timeout test
            if proc.returncode is None:
                proc.kill()
        if handlers:
            await asyncio.wait(handlers, timeout=5)


def known_hosts_line(port: int, key: asyncssh.SSHKey) -> str:
    alg, b64 = key.export_public_key().decode().split()[:2]
    return f"[127.0.0.1]:{port} {alg} {b64}\n"


def make_pool(tmp_path: Path, key_path: Path, **settings: object) -> SSHPool:
    s = SSHSettings.model_validate({"connect_timeout": 2, "command_timeout": 5, **settings})
    return SSHPool(s, known_hosts=tmp_path / "known_hosts", identity_file=key_path, config_file=None)


def node(port: int, name: str = "n1") -> Node:
    return Node(name=name, host="127.0.0.1", port=port, user=local_user(), pool="default")


async def test_runs_argv_and_reuses_one_connection(server, tmp_path: Path) -> None:
    srv, key = server
    (tmp_path / "known_hosts").write_text(known_hosts_line(srv.port, srv.host_key))
    async with make_pool(tmp_path, key) as pool:
        first = await pool.run(node(srv.port), ["echo", "a b", "$(id)"])
        second = await pool.run(node(srv.port), ["sh", "-c", "exit 7"])
        piped = await pool.run(node(srv.port), ["cat"], input="from stdin")
    assert first.ok and first.stdout == "a b $(id)\n"
    assert second.exit_status == 7 and not second.ok
    assert piped.stdout == "from stdin"
    assert srv.commands[0] == shlex.join(["echo", "a b", "$(id)"])
    assert len(srv.connections) == 1


async def test_aes_gcm_is_preferred_unless_the_ssh_config_chooses_the_ciphers(server, tmp_path: Path) -> None:
    srv, key = server
    (tmp_path / "known_hosts").write_text(known_hosts_line(srv.port, srv.host_key))
    async with make_pool(tmp_path, key) as pool:
        assert (await pool.run(node(srv.port), ["true"])).ok
    assert srv.connections[-1].get_extra_info("recv_cipher") == "aes128-gcm@openssh.com"
    chosen = tmp_path / "ssh_config"
    chosen.write_text("Host *\n  Ciphers chacha20-poly1305@openssh.com\n")
    s = SSHSettings.model_validate({"connect_timeout": 2, "command_timeout": 5})
    pool = SSHPool(s, known_hosts=tmp_path / "known_hosts", identity_file=key, config_file=chosen)
    async with pool:
        assert (await pool.run(node(srv.port), ["true"])).ok
    assert srv.connections[-1].get_extra_info("recv_cipher") == "chacha20-poly1305@openssh.com"


async def test_unknown_host_key_runs_nothing(server, tmp_path: Path) -> None:
    srv, key = server
    async with make_pool(tmp_path, key) as pool:
        with pytest.raises(HostKeyError, match="unknown host key") as info:
            await pool.run(node(srv.port), ["touch", str(tmp_path / "ran")])
    assert not info.value.changed
    assert srv.commands == [] and not (tmp_path / "ran").exists()


async def test_changed_host_key_is_refused_even_with_accept_new(server, tmp_path: Path) -> None:
    srv, key = server
    other = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "known_hosts").write_text(known_hosts_line(srv.port, other))
    async with make_pool(tmp_path, key, host_key_policy="accept-new") as pool:
        with pytest.raises(HostKeyError, match="host key changed") as info:
            await pool.run(node(srv.port), ["true"])
    assert info.value.changed and srv.commands == []
    assert (tmp_path / "known_hosts").read_text() == known_hosts_line(srv.port, other)


async def test_accept_new_records_first_seen_key(server, tmp_path: Path) -> None:
    srv, key = server
    async with make_pool(tmp_path, key, host_key_policy="accept-new") as pool:
        result = await pool.run(node(srv.port), ["true"])
    assert result.ok
    assert (tmp_path / "known_hosts").read_text() == known_hosts_line(srv.port, srv.host_key)
    # and from now on, strict mode trusts it
    async with make_pool(tmp_path, key) as pool:
        assert (await pool.run(node(srv.port), ["true"])).ok


async def test_wrong_client_key_is_an_auth_error(server, tmp_path: Path) -> None:
    srv, _ = server
    (tmp_path / "known_hosts").write_text(known_hosts_line(srv.port, srv.host_key))
    stranger = tmp_path / "stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    async with make_pool(tmp_path, stranger) as pool:
        with pytest.raises(AuthError):
            await pool.run(node(srv.port), ["true"])


async def test_command_timeout(server, tmp_path: Path) -> None:
    srv, key = server
    (tmp_path / "known_hosts").write_text(known_hosts_line(srv.port, srv.host_key))
    async with make_pool(tmp_path, key) as pool:
        with pytest.raises(CommandTimeout, match=r"timed out after 0\.5s"):
            await pool.run(node(srv.port), ["sleep", "2"], timeout=0.5)  # the server waits for it at teardown


async def test_refused_port_is_unreachable_and_backs_off(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = tmp_path / "id"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    async with make_pool(tmp_path, key) as pool:
        with pytest.raises(UnreachableError, match="refused"):
            await pool.run(node(port), ["true"])
        with pytest.raises(UnreachableError, match="next retry in"):
            await pool.run(node(port), ["true"])
        pool.forget("n1")
        with pytest.raises(UnreachableError, match=r"refused$"):
            await pool.run(node(port), ["true"])


async def test_silent_server_times_out_within_connect_timeout(tmp_path: Path) -> None:
    # A listener that accepts TCP but never speaks SSH: what a SIGSTOPped sshd looks like.
    writers: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    srv = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    key = tmp_path / "id"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    try:
        async with make_pool(tmp_path, key, connect_timeout=1) as pool:
            # the message names the connect timeout that fired; the outer bound only keeps the test finite
            async with asyncio.timeout(15):
                with pytest.raises(UnreachableError, match="connect timed out after 1s"):
                    await pool.run(node(port), ["true"])
    finally:
        srv.close()
        for writer in writers:
            writer.close()
            await writer.wait_closed()
        await srv.wait_closed()
