"""The API socket against hostile and broken clients (issue 11), over real Unix sockets, several at once."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.api import MAX_DEPTH, MAX_REQUEST, ApiClient, ApiServer, Caller
from ftconsole.scheduler.errors import PermissionDenied

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
