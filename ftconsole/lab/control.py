"""The background lab's control socket (``lab.sock``): how `lab_fault` reaches the running lab server.

The lab server (`serve`) listens on the Unix socket ``<lab>/lab.sock``, mode 0600 (only its user, and root,
may connect), while it serves; nothing else than the lab server holding ``lab.lock`` binds it, so a socket
file left by a server that died is removed at the next start. One request per connection, one JSON object on
one line each way::

    request  {"op": "fault", "node": "lab03", "fault": {"kind": "gpu-ecc", "gpu": 2}}
    result   {"result": <FaultReport.to_json()>}
    error    {"error": {"type": "NotFound", "title": "not found", "message": "...", "exit_code": 2}}

A request line is at most MAX_REQUEST bytes and must arrive within REQUEST_TIMEOUT. The reply comes once the
fault is done (killing a node's processes may take some seconds). A socket path over the kernel's limit of
107 bytes (a deep lab folder) is reached through ``/proc/self/fd/N/lab.sock``, N the folder opened O_PATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from ftconsole.scheduler.errors import FtError, LabError, NotFound, UsageError

log = logging.getLogger("ftconsole.lab")

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT = 10.0
_SUN_PATH_MAX = 107  # bytes of a socket path the kernel takes (sun_path less its NUL)
_ERRORS: dict[str, type[FtError]] = {cls.__name__: cls for cls in (LabError, NotFound, UsageError)}

# (op, request) -> a JSON value; raises FtError to refuse
Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


class NoAnswer(LabError):
    """Nothing answers on the control socket, or no reply came (not an error the server sent)."""


@contextlib.contextmanager
def _reachable(path: Path) -> Iterator[str]:
    """A path to bind or connect `path` by: itself, or through its folder's descriptor when it is too long."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


class ControlServer:
    """Serves `handler` on the Unix socket at `path` until closed: ``async with ControlServer(path, h): ...``."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise LabError(f"{self.path} exists and is not a socket; remove it")
            self.path.unlink()  # left by a lab server that died: the lab.lock we hold says none other runs
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            with _reachable(self.path) as where:
                sock.bind(where)
        except OSError as exc:
            sock.close()
            raise LabError(f"cannot listen on {self.path}: {exc.strerror or exc}") from exc
        finally:
            os.umask(old_umask)
        try:
            self._server = await asyncio.start_unix_server(self._accept, sock=sock, limit=MAX_REQUEST)
        except BaseException:
            sock.close()
            self.path.unlink(missing_ok=True)
            raise

    async def close(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
        self.path.unlink(missing_ok=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)
                reply = {"result": await self._answer(line)}
            except ValueError:  # a line over MAX_REQUEST
                reply = _error(UsageError(f"bad request: a line over {MAX_REQUEST} bytes"))
            except TimeoutError:
                reply = _error(UsageError(f"bad request: no whole line within {REQUEST_TIMEOUT:g} s"))
            except FtError as exc:
                reply = _error(exc)
            except Exception as exc:
                log.exception("control request failed")
                reply = _error(LabError(f"the lab server failed: {exc!r}; see its log"))
            writer.write(json.dumps(reply).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, line: bytes) -> Any:
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"bad request: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            raise UsageError('bad request: not a JSON object with "op"')
        return await self._handler(request["op"], request)


def _error(exc: FtError) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "title": exc.title, "message": str(exc), "exit_code": exc.exit_code}}


def call(path: Path, request: dict[str, Any], timeout: float) -> Any:
    """Send one request to the control socket at `path` and return its result; the server's FtError is raised.

    NoAnswer when nothing answers there, or no reply comes within `timeout` seconds."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            with _reachable(path) as where:
                sock.connect(where)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NoAnswer(f"nothing answers on {path}: {exc.strerror or exc}") from exc
        except OSError as exc:
            raise NoAnswer(f"cannot connect to {path}: {exc.strerror or exc}") from exc
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError as exc:
            raise NoAnswer(f"no answer on {path} within {timeout:g} s") from exc
        except OSError as exc:
            raise NoAnswer(f"lost the connection to {path}: {exc.strerror or exc}") from exc
    finally:
        sock.close()
    try:
        reply = json.loads(data)
    except ValueError:
        raise NoAnswer(f"the connection to {path} closed without a reply") from None
    if not isinstance(reply, dict) or ("result" not in reply and "error" not in reply):
        raise NoAnswer(f"an unreadable reply on {path}: {data[:200]!r}")
    if "error" in reply:
        error = reply["error"] if isinstance(reply["error"], dict) else {}
        raise _ERRORS.get(str(error.get("type")), LabError)(str(error.get("message", "(no message)")))
    return reply["result"]
