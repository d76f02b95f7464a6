"""The API socket against hostile and broken clients (issue 11), over real Unix sockets, several at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import FtError, PermissionDenied
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve.api import MAX_DEPTH, MAX_REQUEST, ApiClient, ApiServer
from tests.integration.test_scheduler_sshd import as_nobody, job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

WAIT = 10.0
TIMEOUT = 0.5  # the servers' per-request timeout in these tests
NOBODY = 65534


async def echo(caller: Caller, op: str, args: dict[str, Any]) -> Any:
    return {"op": op, "args": args}


@pytest.fixture
async def server(sock_dir: Path) -> AsyncIterator[ApiServer]:
    async with ApiServer(sock_dir / "api.sock", echo, request_timeout=TIMEOUT) as srv:
        yield srv


async def read_reply(reader: asyncio.StreamReader) -> dict[str, Any]:
    reply = json.loads(await asyncio.wait_for(reader.readline(), WAIT))
    assert isinstance(reply, dict)
    return reply


async def closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), WAIT) == b""
    except ConnectionError:
        return True


async def garbage(path: Path) -> None:
    reader, writer = await asyncio.open_unix_connection(str(path))
    for line in (b"\x00\xff\xfe garbage\n", b"[1, 2\n", b'"text"\n', b"{" * 10_000 + b"\n"):
        writer.write(line)
        reply = await read_reply(reader)
        assert reply["id"] is None and reply["error"]["type"] == "UsageError"
    deep = {"id": 7, "op": "echo", "args": {"a": json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))}}
    writer.write(json.dumps(deep).encode() + b"\n")
    assert "nested more than" in (await read_reply(reader))["error"]["message"]
    writer.write(b'{"id": 8, "op": "ok", "args": {}}\n')  # the connection goes on after a bad line
    assert (await read_reply(reader))["result"] == {"op": "ok", "args": {}}
    writer.close()


async def huge_line(path: Path) -> None:
    """Many megabytes without a newline, sent as fast as the server takes them."""
    reader, writer = await asyncio.open_unix_connection(str(path), limit=2**20)
    chunk = b"x" * 65536

    async def flood() -> None:
        try:
            for _ in range(8 * MAX_REQUEST // len(chunk)):
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass

    sender = asyncio.create_task(flood())
    reply = await read_reply(reader)
    assert reply["error"]["message"] == f"bad request: a line over {MAX_REQUEST} bytes"
    assert await closed(reader)
    await asyncio.wait_for(sender, WAIT)
    writer.close()


async def half_line(path: Path) -> None:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b'{"id": 1, "op": "ec')  # and nothing more
    await writer.drain()
    started = time.monotonic()
    reply = await read_reply(reader)
    assert reply["error"]["message"] == f"bad request: the request line did not end within {TIMEOUT:g} s"
    assert TIMEOUT <= time.monotonic() - started < TIMEOUT + 2.0
    assert await closed(reader)
    writer.close()


async def idle_then_call(path: Path) -> None:
    """An idle connection (no byte sent) is not a half request: it may wait past the timeout."""
    async with await ApiClient.connect(path) as client:
        await asyncio.sleep(TIMEOUT * 2)
        assert await asyncio.wait_for(client.call("late"), WAIT) == {"op": "late", "args": {}}


async def good_client(path: Path, stop: asyncio.Event) -> int:
    """Calls over and over while the others misbehave; each answer must come promptly."""
    calls = 0
    async with await ApiClient.connect(path) as client:
        while not stop.is_set():
            assert await asyncio.wait_for(client.call("ping", n=calls), 1.0) == {"op": "ping", "args": {"n": calls}}
            calls += 1
            await asyncio.sleep(0.01)
    return calls


async def test_hostile_clients_are_answered_and_dropped_and_others_go_on(server: ApiServer) -> None:
    stop = asyncio.Event()
    good = [asyncio.create_task(good_client(server.path, stop)) for _ in range(3)]
    hostile = [garbage(server.path), huge_line(server.path), half_line(server.path), half_line(server.path)]
    await asyncio.wait_for(asyncio.gather(*hostile, idle_then_call(server.path)), WAIT * 2)
    stop.set()
    assert all(calls > 5 for calls in await asyncio.gather(*good))
    async with await ApiClient.connect(server.path) as client:  # and the server still serves
        assert await asyncio.wait_for(client.call("after"), WAIT) == {"op": "after", "args": {}}


# -- who owns the socket -------------------------------------------------------------------------------------


async def test_client_refuses_a_socket_owned_by_another_user(server: ApiServer, sock_dir: Path) -> None:
    os.chown(server.path, NOBODY, -1)
    with pytest.raises(PermissionDenied) as err:
        await ApiClient.connect(server.path)
    assert str(server.path) in err.value.message
    assert f"uid {NOBODY}" in err.value.message and "not the scheduler's user" in err.value.message
    # a shared folder (anyone may write there, as /tmp) vouches for no one
    shared = sock_dir / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, -1)
    shared.chmod(0o1777)
    async with ApiServer(shared / "api.sock", echo) as other:
        os.chown(other.path, NOBODY, -1)
        with pytest.raises(PermissionDenied, match=str(other.path)):
            await ApiClient.connect(other.path)


async def test_client_accepts_its_own_user_and_the_schedulers_user(server: ApiServer, sock_dir: Path) -> None:
    async with await ApiClient.connect(server.path) as client:  # owned by this user (root here)
        assert await asyncio.wait_for(client.call("mine"), WAIT) == {"op": "mine", "args": {}}
    state = sock_dir / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, -1)
    os.chown(server.path, NOBODY, -1)  # the scheduler's user: the owner of its state_dir
    async with await ApiClient.connect(server.path, scheduler_dir=state) as client:
        assert await asyncio.wait_for(client.call("theirs"), WAIT) == {"op": "theirs", "args": {}}
    private = sock_dir / "private"  # or, with no state_dir given, of the socket's own private folder
    private.mkdir(mode=0o700)
    os.chown(private, NOBODY, -1)
    async with ApiServer(private / "api.sock", echo) as other:
        os.chown(other.path, NOBODY, -1)
        async with await ApiClient.connect(other.path) as client:
            assert await asyncio.wait_for(client.call("x"), WAIT) == {"op": "x", "args": {}}


# -- requests bounded before they cost anything (issue 26) ---------------------------------------------------


async def test_connections_past_the_cap_are_refused_with_a_message(sock_dir: Path) -> None:
    async with ApiServer(sock_dir / "api.sock", echo, max_connections=4) as srv, contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(await ApiClient.connect(srv.path)) for _ in range(4)]
        for i, client in enumerate(clients):  # each is served (and so counted) before the next one comes
            assert await asyncio.wait_for(client.call("ping", n=i), WAIT) == {"op": "ping", "args": {"n": i}}
        async with await ApiClient.connect(srv.path) as extra:
            with pytest.raises(FtError) as err:
                await asyncio.wait_for(extra.call("ping"), WAIT)
        assert err.value.title == "busy"
        assert (
            err.value.message
            == "too many connections: the scheduler serves 4, the most it takes at once; try again soon"
        )
        await clients.pop().close()
        for _ in range(int(WAIT / 0.05)):  # the closed one is let go, and its place taken by the next
            try:
                async with await ApiClient.connect(srv.path) as again:
                    assert await asyncio.wait_for(again.call("again"), WAIT) == {"op": "again", "args": {}}
                break
            except FtError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("a closed connection's place was never given to a new one")


# As uid 65534: open N connections, send a request on each, print each reply (or what ended it) as a JSON line.
HOLD_CONNECTIONS = """
import json, socket, sys
held = []
for i in range(int(sys.argv[2])):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(sys.argv[1])
    sock.sendall(json.dumps({"id": i, "op": "hold", "args": {}}).encode() + b"\\n")
    print(sock.makefile("rb").readline().decode().strip() or "{}", flush=True)
    held.append(sock)
sys.stdin.read()
"""


async def as_nobody_holding(path: Path, count: int) -> asyncio.subprocess.Process:
    for python in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]):
        try:
            return await asyncio.create_subprocess_exec(
                python, "-I", "-c", HOLD_CONNECTIONS, str(path), str(count), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, user=NOBODY, group=NOBODY, extra_groups=[0], cwd="/",
            )  # fmt: skip
        except (PermissionError, FileNotFoundError):
            continue
    pytest.skip(f"no Python interpreter that uid {NOBODY} may run")


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_one_user_cannot_take_every_connection(sock_dir: Path) -> None:
    sock_dir.chmod(0o755)
    async with ApiServer(sock_dir / "api.sock", echo, max_connections=4, max_per_uid=2) as srv:
        proc = await as_nobody_holding(srv.path, 3)
        assert proc.stdout is not None and proc.stdin is not None
        try:
            replies = [json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT)) for _ in range(3)]
            assert [r.get("result") for r in replies[:2]] == [{"op": "hold", "args": {}}] * 2
            error = replies[2]["error"]
            assert (error["title"], replies[2]["id"]) == ("busy", None)
            assert error["message"].startswith("too many connections: ") and "has 2 open" in error["message"]
            async with await ApiClient.connect(srv.path) as mine:  # another user still gets in
                assert await asyncio.wait_for(mine.call("root"), WAIT) == {"op": "root", "args": {}}
        finally:
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), WAIT)


async def serving() -> int:
    """How many connections this process's API servers serve now (each has a task of its own)."""
    return sum(1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "ApiServer._serve")


@pytest.mark.sshd
async def test_a_follow_stream_ends_when_its_client_hangs_up_before_any_output(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        silent = await client.call("submit", spec=job("silent", "sleep 300"))
        await until(client, silent["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "start")
        before = await serving()
        _, writer = await asyncio.open_unix_connection(str(loaded.socket_path))
        request = {"id": 1, "op": "logs", "args": {"job": silent["id"], "follow": True}}
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        await poll(serving, lambda n: n == before + 1, "the stream to be served")
        await asyncio.sleep(1.0)  # it waits for the run's first output (a poll every 0.5 s)
        writer.close()  # and its client goes before any comes
        await poll(serving, lambda n: n == before, "the stream's task to end")
        await client.call("stop", jobs=[silent["id"]])


@pytest.mark.sshd
@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_a_node_set_bomb_is_refused_by_its_size_while_others_are_served(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    bomb = "n[1-20000000]"
    async with running(loaded) as (_, client):
        for op, args in (
            ("nodes", {"nodeset": bomb}),
            ("probe", {"nodeset": bomb}),
            ("events", {"node": bomb}),
            ("submit", {"spec": job("bomb", "true", node_names=bomb)}),
        ):
            refused, jobs = await asyncio.gather(as_nobody(loaded.socket_path, op, **args), client.call("jobs"))
            assert refused["error"]["type"] == "UsageError", (op, refused)
            limit = "10,000" if op == "submit" else "1,024"
            assert f"'{bomb}' names up to 20,000,000 nodes, over the limit of {limit}" in refused["error"]["message"]
            assert isinstance(jobs, list)
        for args in ({"limit": 10**9}, {"limit": -1}):  # listing limits are capped too
            for op in ("events", "alerts"):
                refused = await as_nobody(loaded.socket_path, op, **args)
                assert "limit must be a whole number from 1 to 10,000" in refused["error"]["message"], refused
