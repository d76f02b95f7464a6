"""The local API: how the CLI, and any other local tool, talks to a running scheduler.

The scheduler (``ftconsole serve``, or the console in embedded mode) listens on a Unix socket, mode 0660 and
optionally owned by a configured group: who may connect at all is decided by the file system. Who is calling is
taken from the connection's kernel peer credentials (``SO_PEERCRED``), never from anything in a request.

Protocol: newline-delimited JSON objects, UTF-8; a request line is at most 1 MiB (MAX_REQUEST) and must arrive whole
within 10 s of its first byte (REQUEST_TIMEOUT), a reply line at most 16 MiB (MAX_LINE). A request past either
bound is answered with an error (``id`` null) and the connection is closed; a line that is not a JSON object is
answered with an error and the connection goes on. At most 256 connections are served at once (MAX_CONNECTIONS),
64 of one uid (MAX_CONNECTIONS_PER_UID); one more is answered with an error (title "busy") and closed. A connection
carries requests one after another; each is answered before the next is read::

    request  {"id": 1, "op": "show", "args": {"job": "j-12"}}
    result   {"id": 1, "result": <any JSON value>}
    error    {"id": 1, "error": {"type": "NotFound", "title": "not found", "message": "...", "exit_code": 2}}
    stream   {"id": 1, "item": <JSON value>} ... then {"id": 1, "end": true}, or an error reply in place of the end

``id`` is echoed as given (``null`` when a request could not be read). ``type`` names the error class (see
``scheduler.errors``); a ``ConfigError`` also carries ``"problems": [{"file", "line", "path", "message"}]``.
Which ops answer with a stream (``logs --follow``, ``wait``) is up to the op. While a stream runs the connection
carries nothing else, and a client ends a stream early by closing the connection.

The client talks only to a socket file owned by root, by its own user, or by the scheduler's user: the owner of
the scheduler's folder (state_dir, which holds the store), given as ``scheduler_dir``, or else of the socket's
own folder when nobody else may write there. A socket in a shared folder (``/tmp``) made by another user is
refused, and so is a server whose peer credentials name another user.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import grp
import json
import logging
import os
import pwd
import socket
import stat
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ftconsole.scheduler import errors
from ftconsole.scheduler.caller import Caller
from ftconsole.scheduler.errors import AlreadyRunning, ConfigError, FtError, NotRunning, Problem, UsageError

# ops that change something (the CLI refuses them when no scheduler runs to act on them, unless --local)
# (ack, resolve, drain and resume take effect at once, scheduler or not)
WRITE_OPS = frozenset(
    {
        "submit",
        "stop",
        "delete",
        "clone",
        "priority",
        "extend",
        "scale",
        "hold",
        "release",
        "step",
        "step_end",
        "quota",
        "reserve",
        "unreserve",
    }
)

log = logging.getLogger("ftconsole.api")

MAX_LINE = 16 * 1024 * 1024  # a reply line (the client's bound: a job list or a page of logs can be large)
# A request line. Requests are small (the largest, a submit, carries one job spec: some kilobytes, and the scheduler
# takes at most 64 KiB of it as compact JSON, jobspec.MAX_SPEC_BYTES); 1 MiB leaves room for any real spec, and for a
# spec over its bound to be read and refused naming the key at fault, and bounds what a hostile client makes the
# scheduler buffer (at most twice this).
MAX_REQUEST = 1024 * 1024
# How long a request may take to arrive once its first byte has: a client that sends half a line and stops is
# answered and dropped. An idle connection between requests (the console's) waits as long as it likes.
REQUEST_TIMEOUT = 10.0
# How long a client has to take a reply before the connection is dropped (a stream's items are not bounded).
REPLY_TIMEOUT = 30.0
# JSON nesting a request may have (real ones nest 4 or 5 levels): deeper is refused before any handler sees it.
MAX_DEPTH = 64
# Connections open at once (issue 26): each costs a task and its buffers. One past either bound is answered with an
# error (``id`` null, title "busy") and closed; a CLI call or a console holds one, a `logs --follow` or `wait` one more.
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_UID = 64  # so that one user cannot take them all


# (caller, op, args) -> a JSON value, or an AsyncIterator of JSON values for a streaming op; raises FtError to refuse
Handler = Callable[[Caller, str, dict[str, Any]], Awaitable[Any]]


class ApiServer:
    """Serves ``handler`` on the Unix socket at ``path`` until closed."""

    def __init__(
        self,
        path: Path,
        handler: Handler,
        *,
        group: str | None = None,
        mode: int = 0o660,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        max_per_uid: int = MAX_CONNECTIONS_PER_UID,
    ) -> None:
        self.path = path
        self._request_timeout = request_timeout
        self._max_connections = max_connections
        self._max_per_uid = max_per_uid
        self._per_uid: dict[int, int] = {}  # uid -> its connections being served
        self._handler = handler
        self._group = group
        self._mode = mode
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        gid = None
        if self._group is not None:
            try:
                gid = grp.getgrnam(self._group).gr_gid
            except KeyError:
                raise UsageError(f"unknown group {self._group!r} for the API socket {self.path}") from None
        await _clear_stale_socket(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # nobody else can connect in the instant before the chmod below
        try:
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            hint = " (Unix socket paths are limited to 107 bytes: set api.socket to a shorter path)"
            too_long = len(os.fsencode(self.path)) > 107
            raise FtError(f"cannot listen on {self.path}: {exc.strerror or exc}{hint if too_long else ''}") from exc
        finally:
            os.umask(old_umask)
        try:
            os.chmod(self.path, self._mode)
            if gid is not None:
                os.chown(self.path, -1, gid)
            self._server = await asyncio.start_unix_server(self._accept, sock=sock, limit=MAX_REQUEST)
        except BaseException as exc:
            sock.close()
            self.path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise FtError(f"cannot set up the API socket {self.path}: {exc.strerror or exc}") from exc
            raise

    async def close(self) -> None:
        """Stop accepting, end every connection and running stream, remove the socket file."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        connections = dict(self._connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        for writer in connections.values():  # a task cancelled before it ran never closed its writer
            writer.close()
        await server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._connections[task] = writer
        task.add_done_callback(lambda t: self._connections.pop(t, None))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = None  # counted in _per_uid while it is served
        try:
            caller = _peer(writer)
            busy = self._busy(caller)
            if busy is not None:
                await _refuse(reader, writer, busy, title="busy", error=FtError)
                return
            uid = caller.uid
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            while True:
                try:
                    first = await reader.readexactly(1)  # an idle connection may wait here as long as it likes
                except asyncio.IncompleteReadError:
                    return
                try:
                    line = first + await asyncio.wait_for(reader.readline(), self._request_timeout)
                except ValueError:  # a line over MAX_REQUEST: the stream is out of step, answer and hang up
                    await _refuse(reader, writer, f"bad request: a line over {MAX_REQUEST} bytes")
                    return
                except TimeoutError:
                    why = f"bad request: the request line did not end within {self._request_timeout:g} s"
                    await _refuse(reader, writer, why)
                    return
                writer.write(await self._answer(caller, line, reader, writer))
                await asyncio.wait_for(writer.drain(), REPLY_TIMEOUT)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            if uid is not None:
                self._per_uid[uid] -= 1
                if not self._per_uid[uid]:
                    del self._per_uid[uid]
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _busy(self, caller: Caller) -> str | None:
        """Why a new connection of `caller` is refused (too many open, in all or of its user), or None."""
        mine = self._per_uid.get(caller.uid, 0)
        if mine >= self._max_per_uid:
            return (
                f"too many connections: {caller.user} has {mine} open, the most one user may have; close some "
                "(a console, a `logs --follow`) and try again"
            )
        served = sum(self._per_uid.values())
        if served >= self._max_connections:
            return f"too many connections: the scheduler serves {served}, the most it takes at once; try again soon"
        return None

    async def _answer(
        self, caller: Caller, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes:
        """The reply to one request line (for a stream: after sending its items)."""
        rid = None
        try:
            try:
                request = json.loads(line)
            except ValueError as exc:  # not JSON, not UTF-8
                raise UsageError(f"bad request: {exc}") from None
            except RecursionError:
                raise UsageError(f"bad request: nested more than {MAX_DEPTH} levels deep") from None
            if not isinstance(request, dict):
                raise UsageError("bad request: not a JSON object")
            if _depth(request) > MAX_DEPTH:
                raise UsageError(f"bad request: nested more than {MAX_DEPTH} levels deep")
            rid, op, args = request.get("id"), request.get("op"), request.get("args", {})
            if not isinstance(op, str) or not isinstance(args, dict):
                raise UsageError('bad request: needs "op" (a string) and "args" (an object)')
            result = await self._handler(caller, op, args)
            if isinstance(result, AsyncIterator):
                return await _stream(rid, result, reader, writer)
            return _encode({"id": rid, "result": result})
        except Exception as exc:
            return _error_reply(rid, exc)


class ApiClient:
    """A connection to a running scheduler. Use ``connect``; ``call`` for one result, ``stream`` for a stream."""

    def __init__(self, path: Path, timeout: float, scheduler_dir: Path | None = None) -> None:
        self.path = path
        self._timeout = timeout
        self._scheduler_dir = scheduler_dir
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._streams: set[asyncio.StreamWriter] = set()

    @classmethod
    async def connect(cls, path: Path, *, timeout: float = 5.0, scheduler_dir: Path | None = None) -> ApiClient:
        """Connect to the scheduler at ``path``; NotRunning when nothing listens there, PermissionDenied when the
        socket is not owned by root, this user or the owner of ``scheduler_dir`` (the scheduler's state_dir)."""
        client = cls(path, timeout, scheduler_dir)
        client._conn = await _open(path, timeout, scheduler_dir)
        return client

    async def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its result; raises the FtError the scheduler raised."""
        async with self._lock:
            if self._conn is None:  # dropped after an interrupted call, whose reply would come out of step
                self._conn = await _open(self.path, self._timeout, self._scheduler_dir)
            reader, writer = self._conn
            self._next_id += 1
            try:
                await _send(writer, {"id": self._next_id, "op": op, "args": args})
                reply = await _receive(reader, self.path)
                if "item" in reply or "end" in reply:  # the rest of the stream would come out of step
                    raise UsageError(f"{op} answers with a stream: use stream()")
            except BaseException:
                self._conn = None
                writer.close()
                raise
        return _unwrap(reply)

    async def stream(self, op: str, **args: Any) -> AsyncGenerator[Any, None]:
        """Yield the items of a streaming op until the scheduler ends it. Runs on a connection of its own."""
        reader, writer = await _open(self.path, self._timeout, self._scheduler_dir)
        self._streams.add(writer)
        try:
            await _send(writer, {"id": 1, "op": op, "args": args})
            while True:
                reply = await _receive(reader, self.path)
                if reply.get("end"):
                    return
                yield reply["item"] if "item" in reply else _unwrap(reply)
        finally:
            self._streams.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def close(self) -> None:
        writers = [*self._streams, *([self._conn[1]] if self._conn else [])]
        self._conn = None
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _peer(writer: asyncio.StreamWriter) -> Caller:
    sock = writer.get_extra_info("socket")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Caller(uid=uid, gid=gid, pid=pid, user=user)


async def _stream(
    rid: Any, items: AsyncIterator[Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bytes:
    """Send a stream's items; return its last line (the end, or an error). Always closes ``items``.

    The client sends nothing while a stream runs, so anything read meanwhile (EOF, mostly) means it has given up:
    this task is then cancelled wherever it waits, which ends the stream and the connection.
    """
    me = asyncio.current_task()
    assert me is not None

    def give_up(_: asyncio.Future[bytes]) -> None:
        me.cancel()

    gone = asyncio.ensure_future(reader.read(1))
    gone.add_done_callback(give_up)
    try:
        while True:
            try:
                data = _encode({"id": rid, "item": await anext(items)})
            except StopAsyncIteration:
                return _encode({"id": rid, "end": True})
            except Exception as exc:
                return _error_reply(rid, exc)
            writer.write(data)
            await writer.drain()
    finally:
        gone.remove_done_callback(give_up)
        gone.cancel()
        try:
            if (aclose := getattr(items, "aclose", None)) is not None:
                await aclose()
        finally:
            await asyncio.wait([gone])  # it must stop waiting on the reader before the next readline
            if not gone.cancelled():
                gone.exception()  # retrieved: a reset connection is no error worth logging


async def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file nobody listens on any more; refuse when something answers there or it is no socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"{path} exists and is not a socket; remove it, or give the API socket another path")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), timeout=2.0)
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    except (OSError, TimeoutError):
        writer = None  # it exists and does not refuse: treat it as alive
    pid = None
    if writer is not None:
        pid = _peer(writer).pid
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    who = f"another scheduler (pid {pid})" if pid else "another scheduler"
    raise AlreadyRunning(f"{who} already answers on {path}; stop it first, or use the CLI and console against it")


async def _refuse(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    message: str,
    *,
    title: str | None = None,
    error: type[FtError] = UsageError,
) -> None:
    """Answer an unreadable request (or a connection over the bounds) and end the connection so that the client
    reads the answer: close our side, then take (and drop) what the client still sends for a moment; closing with
    unread input would reset the connection and could lose the reply."""
    log.warning("API client: %s; closing the connection", message)
    exc = error(message)
    if title is not None:
        exc.title = title
    writer.write(_error_reply(None, exc))
    with contextlib.suppress(ConnectionError, TimeoutError, OSError):
        await asyncio.wait_for(writer.drain(), 1.0)
        writer.write_eof()
        async with asyncio.timeout(1.0):
            while await reader.read(65536):
                pass


def _depth(value: Any) -> int:
    """How deeply a JSON value nests (a scalar: 0), counted without recursion."""
    deepest = 0
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_DEPTH:
                return deepest
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def trusted_owners(path: Path, scheduler_dir: Path | None) -> dict[int, str]:
    """The uids a scheduler's socket may be owned by, each with why: root, this process's user, and the
    scheduler's user, which is the owner of ``scheduler_dir`` (its state_dir), or with none given the owner of the
    socket's own folder when no one else may write there."""
    owners = {0: "root", os.getuid(): "this user"}
    folder = scheduler_dir if scheduler_dir is not None else path.parent
    try:
        st = folder.stat()
    except OSError:
        return owners
    if scheduler_dir is not None or not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        owners.setdefault(st.st_uid, f"the owner of {folder}")
    return owners


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_owner(path: Path, uid: int, owners: dict[int, str], what: str) -> None:
    if uid not in owners:
        allowed = ", ".join(f"{_user(u)}: {why}" for u, why in owners.items())
        raise errors.PermissionDenied(
            f"refusing the API socket {path}: {what} {_user(uid)}, not the scheduler's user ({allowed}); "
            "another user may have put it there: check api.socket and state_dir in the config"
        )


async def _open(
    path: Path, timeout: float, scheduler_dir: Path | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    owners = trusted_owners(path, scheduler_dir)
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise NotRunning(f"no scheduler answers on {path}; start `ftconsole serve` or the console") from exc
    except OSError:
        st = None  # connecting says why
    if st is not None:
        _check_owner(path, st.st_uid, owners, "it is owned by")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path), limit=MAX_LINE), timeout)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise NotRunning(f"no scheduler answers on {path}; start `ftconsole serve` or the console") from exc
    except TimeoutError as exc:
        raise FtError(f"the scheduler at {path} did not accept a connection within {timeout:g} s") from exc
    except OSError as exc:
        raise FtError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
    try:  # the file could be swapped between the check and the connect: the listening process's user decides
        _check_owner(path, _peer(writer).uid, owners, "the process listening there runs as")
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(_encode(message))
    await writer.drain()


async def _receive(reader: asyncio.StreamReader, path: Path) -> dict[str, Any]:
    try:
        line = await reader.readline()
    except (ConnectionError, ValueError) as exc:
        raise FtError(f"lost the connection to the scheduler at {path}: {exc}") from exc
    if not line:
        raise FtError(f"the scheduler at {path} closed the connection")
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise FtError(f"the scheduler at {path} sent a reply that is not a JSON object")
    return reply


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _error_reply(rid: Any, exc: Exception) -> bytes:
    if not isinstance(exc, FtError):
        log.exception("the API handler failed", exc_info=exc)
        exc = FtError(f"internal error: {type(exc).__name__}: {exc}")
        exc.title = "internal error"
    body: dict[str, Any] = {"type": type(exc).__name__, "title": exc.title, "message": exc.message}
    body["exit_code"] = exc.exit_code
    if isinstance(exc, ConfigError):
        body["problems"] = [dataclasses.asdict(p) for p in exc.problems]
    return _encode({"id": rid, "error": body})


def _unwrap(reply: dict[str, Any]) -> Any:
    """The result of a reply, or the FtError it carries raised again, as the same class where we know it."""
    if "error" not in reply:
        return reply.get("result")
    body = reply["error"]
    cls = getattr(errors, str(body.get("type")), None)
    message = str(body.get("message", ""))
    exc: FtError
    if cls is ConfigError:
        exc = ConfigError([Problem(**p) for p in body.get("problems", [])])
    elif isinstance(cls, type) and issubclass(cls, FtError) and cls.__init__ is FtError.__init__:
        exc = cls(message)
    else:  # a class we cannot rebuild (or do not know): keep what the user sees
        exc = FtError(message)
    exc.title = str(body.get("title", exc.title))
    exc.exit_code = int(body.get("exit_code", exc.exit_code))
    raise exc
