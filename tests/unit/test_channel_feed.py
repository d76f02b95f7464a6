"""The scheduler's side of a node channel takes its output as the SSH packets bring it (`NodeChannel.feed`, from
the session's callback): a line cut over packets, several lines in one packet, a line over the limit."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from ftconsole.scheduler.errors import CommandTimeout
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh import channel as channel_module
from ftconsole.scheduler.ssh.channel import ChannelClosed, NodeChannel


def _channel() -> tuple[NodeChannel, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    node = Node(name="n1", host="127.0.0.1", port=None, user=None, pool="default")
    return NodeChannel(node, lambda name, e: events.append(e)), events


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


async def test_lines_cut_anywhere_over_packets_are_taken_whole_and_in_order() -> None:
    channel, events = _channel()
    stream = b"".join(
        [
            _line({"event": "hello", "supervisor": 1, "pid": 42, "user": "u"}),
            _line({"event": "run", "run_dir": "~/r1", "state": "exited", "was": "running", "step": None}),
            _line({"event": "heartbeat", "time": 1.0, "watching": 1}),
            _line({"event": "run", "run_dir": "~/r2", "state": "exited", "was": "running", "step": None}),
        ]
    )
    for size in (1, 7, 64, len(stream)):  # one byte a packet, odd cuts, all at once
        channel, events = _channel()
        for start in range(0, len(stream), size):
            channel.feed(stream[start : start + size])
        assert (await channel.hello(1))["pid"] == 42
        assert [e.get("run_dir") for e in events if e["event"] == "run"] == ["~/r1", "~/r2"], size
        assert channel.stirred and channel.closed is None


async def test_an_answer_in_two_packets_answers_its_request_once_whole() -> None:
    channel, _ = _channel()
    future = channel._pending[7] = asyncio.get_running_loop().create_future()
    data = _line({"id": 7, "doc": {"runs": [], "note": "x" * 5000}})
    channel.feed(data[:100])
    assert not future.done()
    channel.feed(data[100:] + b'{"event": "heartbeat"')  # the next line's start comes with it
    assert future.result()["note"] == "x" * 5000
    assert bytes(channel._partial) == b'{"event": "heartbeat"'


async def test_a_line_over_the_limit_ends_the_channel_and_its_pending_requests(monkeypatch) -> None:
    monkeypatch.setattr(channel_module, "MAX_LINE", 1000)
    channel, events = _channel()
    channel.feed(_line({"event": "hello", "supervisor": 1, "pid": 1, "user": "u"}))
    future = channel._pending[3] = asyncio.get_running_loop().create_future()
    channel.feed(b'{"id": 3, "doc": "' + b"y" * 600)
    assert channel.closed is None
    channel.feed(b"y" * 600)
    assert channel.closed == "a line over the limit"
    with pytest.raises(ChannelClosed):
        future.result()
    assert events[-1] == {"event": "closed", "why": "a line over the limit"}
    channel.feed(_line({"event": "run", "run_dir": "~/late"}))  # nothing taken once it ended
    assert not any(e.get("run_dir") == "~/late" for e in events)


async def test_its_stderr_is_kept_bounded_and_said_when_it_breaks(caplog) -> None:
    channel, _ = _channel()
    channel.feed(_line({"event": "hello", "supervisor": 1, "pid": 1, "user": "u"}))
    channel.feed_stderr(b"z" * 10_000 + b"Traceback: the end")
    assert len(channel._stderr) == channel_module.STDERR_KEPT
    with caplog.at_level("INFO", logger="ftconsole.scheduler"):
        channel._end("its process exited")
    assert "Traceback: the end" in caplog.text


class _Chan:
    """An SSH channel that takes every request and answers none (the node side is fed by the test)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        pass


def _silent_channel(monkeypatch: pytest.MonkeyPatch) -> NodeChannel:
    monkeypatch.setattr(channel_module, "STALL_S", 0.2)
    channel, _ = _channel()
    channel.attach(_Chan())  # type: ignore[arg-type]
    channel.feed(_line({"event": "hello", "supervisor": 1, "pid": 1, "user": "u"}))
    return channel


async def test_a_channel_silent_under_a_request_while_its_node_answers_is_closed_and_asked_by_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its process stopped (by its user: it is theirs): the request does not wait out its timeout, which would
    count as the node's silence; the channel ends and the caller asks by command."""
    channel = _silent_channel(monkeypatch)
    asked: list[float] = []

    async def node_answers() -> bool:
        asked.append(time.monotonic())
        return True

    started = time.monotonic()
    with pytest.raises(ChannelClosed):
        await channel.ask({"action": "status"}, 30.0, stalled=node_answers)
    assert len(asked) == 1 and asked[0] - started >= 0.2
    assert channel.closed == channel_module.STALLED


async def test_a_channel_silent_while_its_node_is_silent_too_waits_out_its_timeout_and_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node may be frozen: the request times out as before (the node's silence counts), asking the node
    again after each quiet spell; a keepalive that hangs does not carry the wait past the request's timeout."""
    channel = _silent_channel(monkeypatch)
    asked: list[float] = []

    async def node_silent() -> bool:
        asked.append(time.monotonic())
        return False

    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        await channel.ask({"action": "status"}, 1.0, stalled=node_silent)
    assert len(asked) >= 2 and channel.closed is None

    async def keepalive_hangs() -> bool:
        await asyncio.sleep(60)
        return True

    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        await channel.ask({"action": "status"}, 1.0, stalled=keepalive_hangs)
    assert time.monotonic() - started < 5.0 and channel.closed is None


async def test_an_answer_in_time_never_asks_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _silent_channel(monkeypatch)

    async def never() -> bool:
        raise AssertionError("the node was asked though the channel answered")

    asking = asyncio.ensure_future(channel.ask({"action": "status"}, 5.0, stalled=never))
    await asyncio.sleep(0.05)
    number = json.loads(channel.chan.written[-1])["id"]  # type: ignore[union-attr]
    channel.feed(_line({"id": number, "doc": {"runs": []}}))
    assert await asking == {"runs": []}
