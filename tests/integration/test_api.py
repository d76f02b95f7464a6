"""The local API over a real Unix socket: round trips, errors, streams, socket files, and who the caller is."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import pwd
import socket
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import (
    AlreadyRunning,
    ConfigError,
    FtError,
    NotFound,
    NotRunning,
    PermissionDenied,
    Problem,
    UsageError,
)
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve.api import MAX_REQUEST, ApiClient, ApiServer

WAIT = 10.0  # no single step of these tests takes anywhere near this
PROBLEMS = [Problem("cluster.yaml", 3, "nodes[0].host", "required"), Problem("cluster.yaml", None, "", "empty")]


class Handler:
    """A small scheduler stand-in: records who called, and knows a few ops."""

    def __init__(self) -> None:
        self.callers: list[Caller] = []
        self.stream_closed = asyncio.Event()

    async def __call__(self, caller: Caller, op: str, args: dict[str, Any]) -> Any:
        self.callers.append(caller)
        match op:
            case "whoami":
                return asdict(caller)
            case "echo":
                return args
            case "missing":
                raise NotFound(f"no job {args['job']}")
            case "config":
                raise ConfigError(PROBLEMS)
            case "forbidden":
                raise PermissionDenied("job j-1 belongs to alice")
            case "crash":
                raise RuntimeError("boom")
            case "count":
                return self._count(args["n"], args.get("then", "end"))
        raise UsageError(f"unknown op {op!r}")

    async def _count(self, n: int, then: str) -> AsyncIterator[int]:
        try:
            for i in range(n):
                yield i
            if then == "hang":
                await asyncio.Event().wait()
            elif then == "fail":
                raise NotFound("the job went away")
        finally:
            self.stream_closed.set()


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
async def server(sock_dir: Path, handler: Handler) -> AsyncIterator[ApiServer]:
    async with ApiServer(sock_dir / "api.sock", handler) as srv:
        yield srv


@pytest.fixture
async def client(server: ApiServer) -> AsyncIterator[ApiClient]:
    async with await ApiClient.connect(server.path) as cli:
        yield cli


async def test_call_round_trip_sees_the_real_caller(client: ApiClient, handler: Handler) -> None:
    assert await asyncio.wait_for(client.call("echo", a=1, b=["x", None]), WAIT) == {"a": 1, "b": ["x", None]}
    who = await asyncio.wait_for(client.call("whoami"), WAIT)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert who == {"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "user": me}
    assert handler.callers[0] == Caller(**who)


@pytest.mark.parametrize(
    ("op", "args", "kind", "title", "exit_code", "message"),
    [
        ("missing", {"job": "j-9"}, NotFound, "not found", 2, "no job j-9"),
        ("forbidden", {}, PermissionDenied, "permission denied", 1, "job j-1 belongs to alice"),
        ("nope", {}, UsageError, "bad input", 2, "unknown op 'nope'"),
        ("config", {}, ConfigError, "invalid config", 2, "\n".join(str(p) for p in PROBLEMS)),
    ],
)
async def test_errors_come_back_as_the_same_class(
    client: ApiClient, op: str, args: dict[str, Any], kind: type[FtError], title: str, exit_code: int, message: str
) -> None:
    with pytest.raises(FtError) as err:
        await asyncio.wait_for(client.call(op, **args), WAIT)
    assert type(err.value) is kind
    assert (err.value.title, err.value.exit_code, err.value.message) == (title, exit_code, message)
    if isinstance(err.value, ConfigError):
        assert err.value.problems == PROBLEMS
    assert await asyncio.wait_for(client.call("echo", ok=True), WAIT) == {"ok": True}


async def test_unexpected_exception_is_an_internal_error(client: ApiClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="ftconsole.api"), pytest.raises(FtError) as err:
        await asyncio.wait_for(client.call("crash"), WAIT)
    assert type(err.value) is FtError
    assert err.value.title == "internal error"
    assert "RuntimeError: boom" in err.value.message
    assert any(r.exc_info and isinstance(r.exc_info[1], RuntimeError) for r in caplog.records)
    assert await asyncio.wait_for(client.call("echo", after="crash"), WAIT) == {"after": "crash"}


async def collect(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


async def test_stream_items_arrive_in_order_then_end(client: ApiClient, handler: Handler) -> None:
    assert await asyncio.wait_for(collect(client.stream("count", n=50)), WAIT) == list(range(50))
    assert handler.stream_closed.is_set()
    assert await asyncio.wait_for(collect(client.stream("count", n=0)), WAIT) == []
    assert await asyncio.wait_for(client.call("echo", x=1), WAIT) == {"x": 1}


async def test_stream_error_after_items(client: ApiClient) -> None:
    seen: list[int] = []
    with pytest.raises(NotFound, match="the job went away"):
        async with contextlib.aclosing(client.stream("count", n=3, then="fail")) as items:
            async for item in items:
                seen.append(item)
    assert seen == [0, 1, 2]


async def test_client_leaving_mid_stream_closes_the_servers_iterator(client: ApiClient, handler: Handler) -> None:
    async with contextlib.aclosing(client.stream("count", n=2, then="hang")) as items:
        assert await asyncio.wait_for(anext(items), WAIT) == 0
        assert await asyncio.wait_for(anext(items), WAIT) == 1
    await asyncio.wait_for(handler.stream_closed.wait(), WAIT)
    assert await asyncio.wait_for(client.call("echo", still="here"), WAIT) == {"still": "here"}


async def test_call_on_a_stream_op_is_refused(client: ApiClient, handler: Handler) -> None:
    with pytest.raises(UsageError, match=r"count answers with a stream: use stream\(\)"):
        await asyncio.wait_for(client.call("count", n=5, then="hang"), WAIT)
    await asyncio.wait_for(handler.stream_closed.wait(), WAIT)
    assert await asyncio.wait_for(client.call("echo", x=2), WAIT) == {"x": 2}  # on a fresh connection


async def test_server_close_ends_a_running_stream(sock_dir: Path, handler: Handler) -> None:
    server = ApiServer(sock_dir / "api.sock", handler)
    await server.start()
    async with await ApiClient.connect(server.path) as client:
        items = client.stream("count", n=1, then="hang")
        assert await asyncio.wait_for(anext(items), WAIT) == 0
        await asyncio.wait_for(server.close(), WAIT)
        assert handler.stream_closed.is_set()
        assert not server.path.exists()
        with pytest.raises(FtError, match="closed the connection"):
            await asyncio.wait_for(anext(items), WAIT)


async def raw_exchange(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    """Send lines as they are, on one connection; read one reply for each."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        replies = []
        for line in lines:
            writer.write(line)
            await writer.drain()
            replies.append(json.loads(await asyncio.wait_for(reader.readline(), WAIT)))
        return replies
    finally:
        writer.close()
        await writer.wait_closed()


async def test_malformed_requests_get_error_replies(server: ApiServer) -> None:
    bad_json, not_object, no_op, bad_utf8, good = await raw_exchange(
        server.path,
        b"{nope\n",
        b"[1,2]\n",
        b'{"id":7,"args":{}}\n',
        b'{"id":8,"op":"echo","args":{"s":"\xff"}}\n',
        b'{"id":9,"op":"echo","args":{"s":"\xc3\xa9"}}\n',
    )
    for reply in (bad_json, not_object, no_op, bad_utf8):
        assert reply["error"]["type"] == "UsageError"
        assert reply["error"]["message"].startswith("bad request: ")
        assert reply["error"]["exit_code"] == 2
    assert (bad_json["id"], no_op["id"]) == (None, 7)
    assert good == {"id": 9, "result": {"s": "é"}}


async def test_a_line_over_the_limit_is_refused(server: ApiServer) -> None:
    (reply,) = await raw_exchange(server.path, b'{"id":1,"op":"echo","args":{"s":"' + b"x" * MAX_REQUEST + b'"}}\n')
    assert reply["error"]["message"] == f"bad request: a line over {MAX_REQUEST} bytes"


async def test_socket_mode_and_group(sock_dir: Path, handler: Handler) -> None:
    async with ApiServer(sock_dir / "api.sock", handler) as server:
        st = server.path.stat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
    group = grp.getgrgid(os.getgid()).gr_name
    async with ApiServer(sock_dir / "g.sock", handler, group=group, mode=0o600) as server:
        st = server.path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o600, os.getgid())
    with pytest.raises(UsageError, match="'no-such-group-ft'"):
        await ApiServer(sock_dir / "x.sock", handler, group="no-such-group-ft").start()
    assert not (sock_dir / "x.sock").exists()


async def test_second_server_on_the_same_path_is_refused(server: ApiServer, handler: Handler) -> None:
    with pytest.raises(AlreadyRunning, match=rf"\(pid {os.getpid()}\) already answers on {server.path}"):
        await ApiServer(server.path, handler).start()
    async with await ApiClient.connect(server.path) as client:  # the first one is unharmed
        assert await asyncio.wait_for(client.call("echo"), WAIT) == {}


def stale_socket(path: Path) -> None:
    """A socket file that nobody listens on, as a crashed scheduler leaves behind."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
    assert stat.S_ISSOCK(path.stat().st_mode)


async def test_stale_socket_is_replaced_and_a_file_is_refused(sock_dir: Path, handler: Handler) -> None:
    stale_socket(sock_dir / "api.sock")
    async with ApiServer(sock_dir / "api.sock", handler) as server, await ApiClient.connect(server.path) as client:
        assert await asyncio.wait_for(client.call("echo", n=1), WAIT) == {"n": 1}
    (sock_dir / "file").write_text("not a socket")
    with pytest.raises(UsageError, match=f"{sock_dir / 'file'} exists and is not a socket"):
        await ApiServer(sock_dir / "file", handler).start()
    assert (sock_dir / "file").read_text() == "not a socket"


async def test_not_running(sock_dir: Path) -> None:
    with pytest.raises(NotRunning, match=f"no scheduler answers on {sock_dir / 'api.sock'}; start `ftconsole serve`"):
        await ApiClient.connect(sock_dir / "api.sock")
    stale_socket(sock_dir / "api.sock")
    with pytest.raises(NotRunning) as err:
        await ApiClient.connect(sock_dir / "api.sock")
    assert (err.value.title, err.value.exit_code) == ("not running", 3)


# Connects as another user with the plain socket module and prints what happened, as one JSON line.
WHOAMI = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
try:
    sock.connect(sys.argv[1])
except PermissionError as exc:
    print(json.dumps({"refused": exc.errno}))
    sys.exit(0)
sock.sendall(b'{"id":1,"op":"whoami","args":{}}\\n')
print(sock.makefile("rb").readline().decode().strip())
"""


async def run_as_nobody(path: Path, extra_groups: list[int]) -> dict[str, Any]:
    # the venv's interpreter may sit under a directory that user cannot enter; the child needs only the stdlib
    for python in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]):
        try:
            proc = await asyncio.create_subprocess_exec(
                python, "-I", "-c", WHOAMI, str(path), stdout=asyncio.subprocess.PIPE,
                user=65534, group=65534, extra_groups=extra_groups, cwd="/",
            )  # fmt: skip
        except (PermissionError, FileNotFoundError):
            continue
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0
        return dict(json.loads(out))
    pytest.skip("no Python interpreter that uid 65534 may run")


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as another uid needs root")
async def test_identity_comes_from_the_kernel_not_the_request(sock_dir: Path, handler: Handler) -> None:
    sock_dir.chmod(0o755)  # the other user must be able to reach the socket
    async with ApiServer(sock_dir / "api.sock", handler) as server:
        assert server.path.stat().st_gid == 0
        reply = await run_as_nobody(server.path, extra_groups=[0])
        assert reply["id"] == 1
        who = reply["result"]
        assert (who["uid"], who["gid"]) == (65534, 65534)
        assert who["user"] == pwd.getpwuid(65534).pw_name
        assert who["pid"] not in (os.getpid(), 0)
        # without the socket's group the kernel refuses the connection before we ever see it
        assert await run_as_nobody(server.path, extra_groups=[]) == {"refused": 13}
        assert [c.uid for c in handler.callers] == [65534]
