"""The scheduler's side of the node channels (`scheduler/node/channel.py`): one long-lived supervisor per node and
user, over the SSH connection the pool keeps, answering the supervisor's actions without a Python start each,
and pushing what changes in the node's runs.

`Channels` is a transport (it runs commands through the pool it wraps) that also keeps the channels: the
supervisor's calls (`runs._answer`) ask it first, and fall back to a command of their own where it has no
channel (`ask` answers None): the channel could not start (no `python3 -c`, a user sudo must switch to...), it
is being reopened after it broke, or it broke during the request. A channel that breaks is reopened by the next
request; one that cannot be opened is tried again `RETRY_S` later.

Events go to `on_event(node name, event)`: the executor wakes the loop on a run's change, so a rank's exit is
acted on at once instead of at the next tick.

Quiet nodes: a channel knows which runs it watches (those of its last status read, as the node does) and when it
was last heard (any line: an answer, an event, its heartbeat every `HEARTBEAT_S`). `quiet` says whether a node's
read may be left out this tick: each user's runs are watched by a live channel, nothing changed since the last
read, that read is recent, and the heartbeat is on time; the executor then reads the node only every so often,
as a safety net. A heartbeat that is late (`overdue`) is a node that may be frozen: it is read again, and its
silence counts from when it was last heard (a node frozen for good is given up `node_timeout` after it froze, at
most; one frozen for less than `node_timeout` less a heartbeat costs nothing).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from typing import Any

import asyncssh

from ftconsole.scheduler.errors import CommandTimeout, FtError
from ftconsole.scheduler.node.bundle import python_stdin_script, script
from ftconsole.scheduler.node.channel import HEARTBEAT_S, MAX_WATCHED, loader
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh.transport import CommandResult, SSHPool

log = logging.getLogger("ftconsole.scheduler")

OPEN_TIMEOUT_S = 10.0  # at most this long for a channel to say hello
RETRY_S = 30.0  # a channel that could not be opened is tried again this long after (per command meanwhile)
MAX_LINE = 64 * 1024 * 1024
STDERR_KEPT = 4096  # the last bytes of a channel's stderr, said when it ends
CLOSED_BY_US = "closed by the scheduler"
IDLE_S = 60.0  # a channel that watches no run and was asked nothing this long is closed (`close_idle`)
HEARTBEAT_LATE_S = 2.0  # a heartbeat this much after it was due is late: the node may be frozen
STALL_S = HEARTBEAT_S + HEARTBEAT_LATE_S  # a channel silent this long under a request: is it the node, or it?
PING_S = 2.0  # at most this long for a node's sshd to answer a keepalive on the connection (`Channels.alive`)
STALLED = "it said nothing while its node answers (its process stopped?)"

Key = tuple[str, str | None, bool]  # (node, user, through sudo)


class ChannelClosed(Exception):
    """The channel ended (its process exited, its connection went): what it was asked is asked again by command."""


FOLLOW_QUEUE = 256  # chunks of a followed file not yet taken (16 MiB): more, and the follower reads by request


class Followed:
    """A file the node pushes as it grows (`Channels.follow`): `next` gives (offset, bytes) chunks in order, or
    None once the push ended (the channel closed, or its reader fell too far behind): read on by request."""

    def __init__(self, channel: NodeChannel, number: int) -> None:
        self.channel = channel
        self.number = number
        self.queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()

    def put(self, chunk: tuple[int, bytes] | None) -> None:
        if chunk is not None and self.queue.qsize() >= FOLLOW_QUEUE:
            self.channel._follows.pop(self.number, None)
            chunk = None  # the rest is read by request, from where the reader is
        self.queue.put_nowait(chunk)

    async def next(self, timeout: float) -> tuple[int, bytes] | None:
        """The next chunk; TimeoutError after `timeout` without one."""
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def close(self, timeout: float) -> None:
        """Stop the push (the node forgets it; nothing is waited for past `timeout`)."""
        if self.channel._follows.pop(self.number, None) is None or self.channel.closed is not None:
            return
        with contextlib.suppress(ChannelClosed, CommandTimeout, asyncssh.Error, OSError):
            params = {"action": "unfollow", "follow": self.number, "user": self.channel.user}
            await self.channel.ask(params, timeout)


class NodeChannel:
    """One channel: requests answered in order, events handed to `on_event`. Its output comes as the SSH
    packets do (`feed`, from its session's callback): no reader task to wake for each line."""

    def __init__(
        self,
        node: Node,
        on_event: Callable[[str, dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.on_event = on_event
        self.clock = clock
        self.chan: asyncssh.SSHClientChannel[bytes] | None = None  # set once its session is open (`attach`)
        self.closed: str | None = None  # why it ended
        self.pid: int | None = None  # its process on the node, as its hello says
        self.heard = clock()  # its last line
        self.watching: frozenset[str] = frozenset()  # the run folders it watches (its last status read's)
        self.watched_at: float | None = None  # when that read was answered
        self.stirred = False  # a run it watches changed since that read
        self.asked = 0  # requests sent to it
        self.asked_at = clock()  # when the last was
        self.user: str | None = None  # whom it runs as (its hello)
        self._follows: dict[int, Followed] = {}  # request id of a follow -> its chunks
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reads: set[int] = set()  # the pending status reads by run folder (their answer sets `watching`)
        loop = asyncio.get_running_loop()
        self._hello: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._ended: asyncio.Future[None] = loop.create_future()
        self._partial = bytearray()  # output after its last full line
        self._stderr = bytearray()  # the last of what it wrote to stderr (said when it ends)
        self._writable = asyncio.Event()  # the SSH channel takes more (its window is open)
        self._writable.set()

    def session(self) -> _Session:
        """The SSH session that hands this channel its output (`SSHPool.open_session`'s factory)."""
        return _Session(self)

    def attach(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:
        self.chan = chan
        if self.closed is not None:
            chan.close()

    async def hello(self, timeout: float) -> dict[str, Any]:
        return await asyncio.wait_for(asyncio.shield(self._hello), timeout)

    async def ask(
        self,
        params: dict[str, Any],
        timeout: float,
        *,
        follow: Followed | None = None,
        stalled: Callable[[], Awaitable[bool]] | None = None,
    ) -> dict[str, Any]:
        """The channel's answer to `params`; ChannelClosed when it ends first, CommandTimeout after `timeout`.
        With `follow`, a follow request whose chunks go to it (numbered by this request). With `stalled`, see
        `_answer`."""
        if self.closed is not None:
            raise ChannelClosed(self.closed)
        number = next(self._ids)
        if follow is not None:
            follow.number = number
            self._follows[number] = follow
        self.asked += 1
        self.asked_at = self.clock()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        if params.get("action") == "status" and params.get("run_dirs") is not None:
            self._reads.add(number)
        try:
            await self.write(json.dumps({"id": number, "params": params}).encode() + b"\n")
            if stalled is None:
                return await asyncio.wait_for(asyncio.shield(future), timeout)
            return await self._answer(future, timeout, stalled)
        except TimeoutError as exc:
            raise CommandTimeout(self.node.name, f"{params.get('action')} timed out after {timeout:g}s") from exc
        except (asyncssh.Error, OSError, BrokenPipeError) as exc:
            self._end(f"cannot write to it: {exc}")
            raise ChannelClosed(self.closed) from exc
        finally:
            self._pending.pop(number, None)
            self._reads.discard(number)

    async def _answer(
        self, future: asyncio.Future[dict[str, Any]], timeout: float, stalled: Callable[[], Awaitable[bool]]
    ) -> dict[str, Any]:
        """`future`'s answer within `timeout`. Once the channel has said nothing for `STALL_S` (or half of
        `timeout`) since the request, `stalled()` says whether the node itself still answers: if it does, the
        channel alone is stuck (its process stopped: by its user perhaps, whose process it is), so it is closed
        and the request is asked by command; a stuck channel is its user's claim, never the node's silence. If
        the node does not answer either, the wait goes on to `timeout` (the node may be frozen)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet_for = min(STALL_S, timeout / 2)
        sent = self.clock()
        while not future.done():
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            quiet = self.clock() - max(sent, self.heard)
            if quiet < quiet_for:  # asked again when the channel says nothing for quiet_for, or answered
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(future), min(left, quiet_for - quiet))
                continue
            try:
                answers = await asyncio.wait_for(stalled(), left)  # never past the request's own deadline
            except TimeoutError:
                if future.done():
                    break
                raise
            if answers and not future.done():
                self._end(STALLED)
            sent = self.clock()  # the node is silent too: ask it again after another quiet spell
        return future.result()

    @property
    def busy(self) -> bool:
        """A request is under way (its own timeout counts, not the heartbeat: it is answered in turn)."""
        return bool(self._pending)

    async def write(self, data: bytes) -> None:
        """Send `data` to its stdin, waiting while the SSH channel's window is full."""
        if self.chan is None or self.closed is not None:
            raise ChannelClosed(self.closed or "not open")
        self.chan.write(data)
        await self._writable.wait()

    def close(self) -> None:
        self._end(CLOSED_BY_US)

    async def finished(self) -> None:
        """Until it has ended (after `close`, or once its process or connection went) and its SSH channel closed."""
        await asyncio.shield(self._ended)
        if self.chan is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.chan.wait_closed(), 2)

    def _end(self, why: str) -> None:
        if self.closed is not None:
            return
        self.closed = why
        if self.chan is not None:
            with contextlib.suppress(Exception):
                self.chan.close()
        self._writable.set()  # a writer waiting for the window goes on, and finds it closed
        for future in [self._hello, *self._pending.values()]:
            if not future.done():
                future.set_exception(ChannelClosed(why))
                future.exception()  # told to whoever awaits it; no one may (a waiter that gave up): not logged
        self._pending.clear()
        for followed in self._follows.values():
            followed.put(None)
        self._follows.clear()
        if self._stderr and why != CLOSED_BY_US:
            log.info("%s: node channel's stderr: %s", self.node.name, self._stderr.decode(errors="replace").strip())
        if not self._ended.done():
            self._ended.set_result(None)
        if why != CLOSED_BY_US and self._hello.done():  # it broke: its node is read (and its silence told) at once
            self.on_event(self.node.name, {"event": "closed", "why": why})

    def _log(self, doc: dict[str, Any]) -> None:
        number = doc.get("follow")
        followed = self._follows.get(number) if isinstance(number, int) else None
        if followed is None or not isinstance(doc.get("offset"), int) or not isinstance(doc.get("data"), str):
            return
        try:
            followed.put((doc["offset"], base64.b64decode(doc["data"], validate=True)))
        except ValueError:
            followed.put(None)

    def feed(self, data: bytes) -> None:
        """Output as it came: each full line taken, the rest kept for the next packet."""
        if self.closed is not None:
            return
        start = 0
        if self._partial:
            end = data.find(b"\n")
            if end < 0:
                self._partial += data
                if len(self._partial) > MAX_LINE:
                    self._end("a line over the limit")
                return
            line, start = bytes(self._partial + data[: end + 1]), end + 1
            self._partial.clear()
            self._take_guarded(line)
        while self.closed is None:
            end = data.find(b"\n", start)
            if end < 0:
                self._partial += data[start:]
                if len(self._partial) > MAX_LINE:
                    self._end("a line over the limit")
                return
            self._take_guarded(data[start : end + 1])
            start = end + 1

    def feed_stderr(self, data: bytes) -> None:
        self._stderr += data
        del self._stderr[: max(0, len(self._stderr) - STDERR_KEPT)]

    def _take_guarded(self, line: bytes) -> None:
        try:
            self._take(line)
        except Exception:  # a bug in reading one line must not stop the channel's callback
            log.exception("%s: node channel: a line not understood: %.200r", self.node.name, line)

    def _take(self, line: bytes) -> None:
        try:
            doc = json.loads(line)
        except ValueError:
            log.warning("%s: the channel said something that is not JSON: %.200r", self.node.name, line)
            return
        if not isinstance(doc, dict):
            return
        self.heard = self.clock()
        if "event" in doc:
            if doc["event"] == "hello":
                self.pid = doc.get("pid") if isinstance(doc.get("pid"), int) else None
                self.user = doc.get("user") if isinstance(doc.get("user"), str) else None
                if not self._hello.done():
                    self._hello.set_result(doc)
                return
            if doc["event"] == "log":
                self._log(doc)
                return
            if doc["event"] == "run":
                self.stirred = True
            elif doc["event"] == "output":  # only the runs it watches (its user's), with a time
                pushed = doc.get("runs")
                moved: dict[Any, Any] = pushed if isinstance(pushed, dict) else {}
                doc = {"event": "output", "runs": {
                    d: float(t) for d, t in moved.items()
                    if d in self.watching and isinstance(t, (int, float)) and math.isfinite(t)
                }}  # fmt: skip
            self.on_event(self.node.name, doc)
            return
        number = doc.get("id")
        future = self._pending.get(number) if isinstance(number, int) else None
        answer = doc.get("doc")
        if future is not None and not future.done() and isinstance(answer, dict):
            if number in self._reads:  # the node watches what this read answered from now on (channel.py)
                listed = answer.get("runs")
                entries: list[Any] = listed[:MAX_WATCHED] if isinstance(listed, list) else []
                given = (r.get("run_dir") for r in entries if isinstance(r, dict))
                self.watching = frozenset(d for d in given if isinstance(d, str))
                self.watched_at, self.stirred = self.heard, False
            future.set_result(answer)
        elif not self._hello.done() and isinstance(doc.get("supervisor"), int):
            self._hello.set_exception(ChannelClosed(f"it did not start: {json.dumps(doc)[:300]}"))  # refused


class Channels:
    """A transport that keeps a channel per node and user (see the module's docstring)."""

    def __init__(
        self,
        pool: SSHPool,
        *,
        on_event: Callable[[str, dict[str, Any]], None] = lambda node, event: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.on_event = on_event
        self.clock = clock
        self._open: dict[Key, NodeChannel] = {}
        self._failed: dict[Key, tuple[float, str]] = {}  # key -> (when to try again, why it failed)
        self._locks: dict[Key, asyncio.Lock] = {}

    async def run(
        self, node: Node, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        return await self.pool.run(node, argv, input=input, timeout=timeout)

    async def knock(self, node: Node, timeout: float) -> str | None:
        return await self.pool.knock(node, timeout)

    async def close(self) -> None:
        """Close the channels and wait for their readers (the pool is its owner's to close)."""
        channels = list(self._open.values())
        self._open.clear()
        for channel in channels:
            channel.close()
        await asyncio.gather(*(c.finished() for c in channels), return_exceptions=True)

    def live(self) -> dict[Key, NodeChannel]:
        """The channels open now."""
        return {k: c for k, c in self._open.items() if c.closed is None}

    async def follow(
        self, node: Node, python: str, params: dict[str, Any], timeout: float, *, sudo: bool
    ) -> Followed | None:
        """The file params["path"] of `node`, pushed from params["offset"] as it grows, by the channel of
        params["user"]; None where there is no channel or it refuses (read by request instead)."""
        key: Key = (node.name, params.get("user"), sudo)
        channel = await self._channel(key, node, python, timeout)
        if channel is None:
            return None
        followed = Followed(channel, 0)
        try:
            doc = await channel.ask({**params, "action": "follow"}, timeout, follow=followed)
        except (ChannelClosed, CommandTimeout):
            channel._follows.pop(followed.number, None)
            return None
        if doc.get("follow") != followed.number:
            channel._follows.pop(followed.number, None)
            return None
        return followed

    def close_idle(self, wanted: Set[str]) -> list[str]:
        """Close the channels that watch no run of `wanted` (the run folders the loop still reads), follow no file
        and were asked nothing for `IDLE_S` (a node whose runs all ended: its heartbeats would cost the scheduler
        for nothing); the next request opens one again. The nodes closed, by name.

        What a channel watches is what its last status read answered: a run whose end was read by another way
        (a command, while the channel was busy) stays in it until the next read, which never comes once the
        node has no run left: so a watch counts only while the loop still wants that run read."""
        now = self.clock()
        idle = [
            key
            for key, c in self._open.items()
            if c.closed is None
            and not (c.watching & wanted)
            and not c._follows
            and not c.busy
            and now - c.asked_at >= IDLE_S
        ]
        for key in idle:
            self._open.pop(key).close()
        return [name for name, _, _ in idle]

    def quiet(self, node: str, groups: Mapping[str | None, Set[str]], every: float) -> float | None:
        """When `node` was last heard, if its read of these runs (user -> run folders) may be left out now: each
        user's runs are exactly what a live channel watches, none changed since that channel's last read, which
        is less than `every` old, and its heartbeat is on time. None: read it."""
        now = self.clock()
        heard = []
        for user, dirs in groups.items():
            channel = self._watcher(node, user)
            if (
                channel is None
                or channel.stirred
                or channel.watching != dirs
                or channel.watched_at is None
                or now - channel.watched_at >= every
                or now - channel.heard > HEARTBEAT_S + HEARTBEAT_LATE_S
            ):
                return None
            heard.append(channel.heard)
        return min(heard) if heard else None

    def overdue(self, node: str) -> float | None:
        """When `node` was last heard, where a heartbeat of it was due and has not come (the earliest, over its
        live channels with no request under way): the node may be frozen, or its connection stalled. None: each
        is on time."""
        now = self.clock()
        heard = [
            c.heard
            for (name, _, _), c in self._open.items()
            if name == node and c.closed is None and not c.busy and now - c.heard > HEARTBEAT_S + HEARTBEAT_LATE_S
        ]
        return min(heard) if heard else None

    async def alive(self, node: Node) -> bool | None:
        """Whether the node's sshd answers a keepalive on the connection within `PING_S` (`SSHPool.ping`): the
        scheduler's own evidence that the node runs, which no job's user can stop (unless jobs run as the very
        account the scheduler connects with: `scheduler.run_as: ssh_user`). None: no connection to ask on."""
        return await self.pool.ping(node, PING_S)

    async def _answers(self, node: Node) -> bool:
        return await self.alive(node) is True

    def drop_late(self, node: str) -> list[str | None]:
        """Close the channels of `node` whose heartbeat is late (`overdue`), where the node itself answered: stuck,
        not the node. The users whose channel it was; their next request opens another."""
        now = self.clock()
        late = [
            key
            for key, c in self._open.items()
            if key[0] == node and c.closed is None and not c.busy and now - c.heard > HEARTBEAT_S + HEARTBEAT_LATE_S
        ]
        for key in late:
            self._open.pop(key)._end(STALLED)
        return [user for _, user, _ in late]

    def _watcher(self, node: str, user: str | None) -> NodeChannel | None:
        for sudo in (False, True):
            channel = self._open.get((node, user, sudo))
            if channel is not None and channel.closed is None:
                return channel
        return None

    async def ask(
        self, node: Node, python: str, params: dict[str, Any], timeout: float, *, sudo: bool, opens: bool = True
    ) -> dict[str, Any] | None:
        """The answer of node's channel for params["user"] to `params`, or None: ask by command instead. Without
        `opens`, only a channel already open answers: a one-off request (a sweep of a user who may have no run
        there) does not leave a channel behind, heartbeating until it is found idle."""
        key: Key = (node.name, params.get("user"), sudo)
        if opens:
            channel = await self._channel(key, node, python, timeout)
        else:
            channel = self._open.get(key)
            channel = channel if channel is not None and channel.closed is None else None
        if channel is None:
            return None
        try:
            return await channel.ask(params, timeout, stalled=lambda: self._answers(node))
        except ChannelClosed as exc:
            whose = params.get("user") or "the SSH account"
            log.info("%s: node channel of %s ended (%s): asking by command", node.name, whose, exc)
            return None
        except CommandTimeout:
            channel.close()  # it may be wedged: the next request opens another (the node may only be slow)
            raise

    async def _channel(self, key: Key, node: Node, python: str, timeout: float) -> NodeChannel | None:
        channel = self._open.get(key)
        if channel is not None and channel.closed is None:
            return channel
        failed = self._failed.get(key)
        if failed is not None and self.clock() < failed[0]:
            return None
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            channel = self._open.get(key)
            if channel is not None and channel.closed is None:
                return channel
            try:
                channel = await self._start(key, node, python, min(timeout, OPEN_TIMEOUT_S))
            except (FtError, ChannelClosed, TimeoutError, asyncssh.Error, OSError) as exc:
                why = str(exc) or type(exc).__name__
                self._failed[key] = (self.clock() + RETRY_S, why)
                log.info("%s: no node channel (%s): asking by command, again in %gs", node.name, why, RETRY_S)
                return None
            self._failed.pop(key, None)
            self._open[key] = channel
            return channel

    async def _start(self, key: Key, node: Node, python: str, timeout: float) -> NodeChannel:
        _, user, sudo = key
        argv = [python, "-c", loader()]
        if sudo:
            argv = ["sudo", "-n", "-H", "-u", str(user), "--", *argv]
        params: dict[str, object] = {"action": "channel", "node": node.name}
        if user is not None:
            params["user"] = user
        program = python_stdin_script(script("supervisor"), params).encode()
        channel = NodeChannel(node, self.on_event, self.clock)
        try:
            channel.attach(await self.pool.open_session(node, argv, channel.session, timeout=timeout))
            await channel.write(f"{len(program)}\n".encode() + program)
            await channel.hello(timeout)
        except BaseException:
            channel.close()
            raise
        return channel


class _Session(asyncssh.SSHClientSession[bytes]):
    """A node channel's SSH session: what its process writes goes straight to the channel, as it comes."""

    def __init__(self, channel: NodeChannel) -> None:
        self.channel = channel

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if datatype == asyncssh.EXTENDED_DATA_STDERR:
            self.channel.feed_stderr(data)
        else:
            self.channel.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel._end("its process exited" if exc is None else f"{type(exc).__name__}: {exc}")

    def pause_writing(self) -> None:
        self.channel._writable.clear()

    def resume_writing(self) -> None:
        self.channel._writable.set()
