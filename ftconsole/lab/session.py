"""One SSH session of a lab node: a real local process (pipes or a pty) behind an asyncssh channel."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pty
import signal
import struct
import sys
import termios
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import asyncssh

if TYPE_CHECKING:
    from ftconsole.lab.node import LabNode


log = logging.getLogger("ftconsole.lab")


SHELL = "/bin/sh"
OUTPUT_GRACE_S = 2.0  # after a command exits, how long its output may stay open (a background child holds it)
# A pty session's child: become the controlling process of the pty (stdin), then exec the shell.
_CTTY_EXEC = (
    "import fcntl, os, sys, termios\nfcntl.ioctl(0, termios.TIOCSCTTY, 0)\nos.execv(sys.argv[1], sys.argv[1:])\n"
)


_PTY = -1  # the output "fd" of a pty session

# The signals a session's command starts with at their default, as sshd's children do (sshd resets them in the
# child of each connection). An ignored signal is inherited across exec, a caught one is not: in a process
# started with SIGHUP ignored (nohup, a CI runner, a service manager) every command would outlive its session's
# hangup, and with SIGINT ignored (a background job of a script) a client's break would do nothing.
_SESSION_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)


def _still_ignored(signum: int, frame: object) -> None:
    """This process goes on ignoring the signal (as it was told to); the commands it starts do not inherit it."""
    return


def reset_session_signals() -> None:
    """Catch, and ignore, each of `_SESSION_SIGNALS` this process ignores, so that a session's command starts
    with it at its default. Only from the main thread (elsewhere nothing can be changed: left as it is)."""
    for sig in _SESSION_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            with contextlib.suppress(ValueError):
                signal.signal(sig, _still_ignored)


def _signal_number(name: str) -> int | None:
    sig = getattr(signal, f"SIG{name}", None)
    return int(sig) if isinstance(sig, signal.Signals) else None


def _set_winsize(fd: int, size: tuple[int, int, int, int]) -> None:
    width, height, pixwidth, pixheight = size
    if width and height:
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, pixwidth, pixheight))


class _PtyOutput(asyncio.Protocol):
    def __init__(self, child: _Child) -> None:
        self._child = child

    def data_received(self, data: bytes) -> None:
        self._child.output(data, stderr=False)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:  # EIO: every slave descriptor closed
        self._child.output_closed(_PTY)


class _PtyInput(asyncio.BaseProtocol):
    def __init__(self, child: _Child) -> None:
        self._child = child

    def pause_writing(self) -> None:
        self._child.pause_writing()

    def resume_writing(self) -> None:
        self._child.resume_writing()


class _Child(asyncio.SubprocessProtocol):
    """The local process of one session: its output goes to the channel, its exit status back to the client.

    Finishes when the process has exited and its output is closed, or OUTPUT_GRACE_S after the exit when a
    background process still holds the output open.
    """

    def __init__(self, session: _Session, use_pty: bool) -> None:
        self._session = session
        self.use_pty = use_pty
        self.transport: asyncio.SubprocessTransport | None = None
        self.pid: int | None = None
        self.exited = False
        self._outputs = {_PTY} if use_pty else {1, 2}
        self._grace: asyncio.TimerHandle | None = None
        self._pty_out: asyncio.ReadTransport | None = None
        self._pty_in: asyncio.WriteTransport | None = None
        self.done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, size: tuple[int, int, int, int]
    ) -> None:
        loop = asyncio.get_running_loop()
        if not self.use_pty:
            pipe = asyncio.subprocess.PIPE
            await loop.subprocess_exec(
                lambda: self,
                *argv,
                stdin=pipe,
                stdout=pipe,
                stderr=pipe,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
            return
        master, slave = pty.openpty()
        try:
            _set_winsize(slave, size)
            argv = [sys.executable, "-I", "-S", "-c", _CTTY_EXEC, *argv]
            await loop.subprocess_exec(
                lambda: self,
                *argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        # the transports own these files and close them
        writer = open(os.dup(master), "wb", buffering=0)  # noqa: SIM115
        self._pty_in, _ = await loop.connect_write_pipe(lambda: _PtyInput(self), writer)
        reader = open(master, "rb", buffering=0)  # noqa: SIM115
        self._pty_out, _ = await loop.connect_read_pipe(lambda: _PtyOutput(self), reader)

    # subprocess protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport
        self.pid = transport.get_pid()
        self._session.node.track(self)

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.output(data if isinstance(data, bytes) else data.encode(), stderr=fd == 2)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in (1, 2):
            self.output_closed(fd)

    def process_exited(self) -> None:
        self.exited = True
        if not self._outputs:
            self._finish()
        else:
            self._grace = asyncio.get_running_loop().call_later(OUTPUT_GRACE_S, self._output_timeout)

    def pause_writing(self) -> None:  # the process reads its stdin slower than the client sends
        self._session.pause_input()

    def resume_writing(self) -> None:
        self._session.resume_input()

    # output
    def output(self, data: bytes, *, stderr: bool) -> None:
        self._session.send(data, stderr=stderr)

    def output_closed(self, fd: int) -> None:
        self._outputs.discard(fd)
        if self.exited and not self._outputs:
            self._finish()

    def pause_output(self) -> None:
        for pipe in self._output_pipes():
            pipe.pause_reading()

    def resume_output(self) -> None:
        for pipe in self._output_pipes():
            pipe.resume_reading()

    def _output_pipes(self) -> list[asyncio.ReadTransport]:
        if self._pty_out is not None:
            return [self._pty_out] if not self._pty_out.is_closing() else []
        if self.transport is None:
            return []
        pipes = (self.transport.get_pipe_transport(fd) for fd in (1, 2))
        return [p for p in pipes if isinstance(p, asyncio.ReadTransport) and not p.is_closing()]

    def _output_timeout(self) -> None:
        name, grace = self._session.node.name, OUTPUT_GRACE_S
        log.warning("%s: output of pid %s still open %gs after it exited; closing the session", name, self.pid, grace)
        self._finish()

    # input and control
    def _stdin(self) -> asyncio.WriteTransport | None:
        pipe = self._pty_in if self.use_pty else (self.transport.get_pipe_transport(0) if self.transport else None)
        return pipe if isinstance(pipe, asyncio.WriteTransport) and not pipe.is_closing() else None

    def write(self, data: bytes) -> None:
        pipe = self._stdin()
        if pipe is not None:
            pipe.write(data)

    def write_eof(self) -> None:
        pipe = self._stdin()
        if pipe is not None and not self.use_pty and pipe.can_write_eof():
            pipe.write_eof()

    def resize(self, size: tuple[int, int, int, int]) -> None:
        if self._pty_in is not None and not self._pty_in.is_closing():
            _set_winsize(self._pty_in.get_extra_info("pipe").fileno(), size)

    def signal_group(self, sig: int) -> None:
        """Signal the command's process group (not processes that detached into their own session)."""
        if self.pid is not None and not self.exited:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    # the end
    def _finish(self) -> None:
        if self.done.done():
            return
        returncode = self.transport.get_returncode() if self.transport else None
        self.done.set_result(returncode)
        self._session.exited(returncode)
        self.close()

    def close(self) -> None:
        """Close every transport (a running process gets SIGKILL from asyncio: only at lab shutdown)."""
        if not self.done.done():
            self.done.set_result(None)
        if self._grace is not None:
            self._grace.cancel()
        for transport in (self._pty_out, self._pty_in, self.transport):
            if transport is not None and not transport.is_closing():
                transport.close()
        self._session.node.untrack(self)


class _Session(asyncssh.SSHServerSession[bytes]):
    """One session channel of a lab node; the process behind it is a `_Child`."""

    def __init__(self, node: LabNode, conn: asyncssh.SSHServerConnection) -> None:
        self.node = node
        self._conn = conn
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._child: _Child | None = None
        self._pending: list[bytes] = []
        self._eof = False
        self._closed = False

    # what the client may ask for
    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        return False

    def session_started(self) -> None:
        self.node.start_task(self._start())

    async def _start(self) -> None:
        chan = self._chan
        assert chan is not None
        command, term = chan.get_command(), chan.get_terminal_type()
        argv = [SHELL, "-c", command] if command is not None else [SHELL, "-i"] if term else [SHELL]
        if self._closed:
            return  # the client went away before the command started
        child = _Child(self, use_pty=term is not None)
        try:
            await child.start(argv, self._env(term), self.node.home, chan.get_terminal_size())
        except OSError as exc:
            child.close()
            self._fail(f"lab node {self.node.name}: cannot start {SHELL}: {exc.strerror or exc}", 127)
            return
        except Exception as exc:
            log.exception("%s: cannot start a session", self.node.name)
            child.close()
            self._fail(f"lab node {self.node.name}: cannot start {SHELL}: {exc}", 255)
            return
        self._child = child
        for data in self._pending:
            child.write(data)
        self._pending.clear()
        if self._eof:
            child.write_eof()
        if self._closed:
            child.signal_group(signal.SIGHUP)

    def _env(self, term: str | None) -> dict[str, str]:
        env = self.node.session_env(self._chan.get_environment() if self._chan else {})
        peer = self._conn.get_extra_info("peername") or ("", 0)
        local = self._conn.get_extra_info("sockname") or ("", 0)
        env["SSH_CLIENT"] = f"{peer[0]} {peer[1]} {local[1]}"
        env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} {local[0]} {local[1]}"
        if term:
            env["TERM"] = term
        return env

    def _fail(self, message: str, status: int) -> None:
        if self._chan is not None and not self._chan.is_closing():
            with contextlib.suppress(OSError):
                self._chan.write_stderr(f"{message}\n".encode())
            self._chan.exit(status)

    # data from the client
    def data_received(self, data: bytes, datatype: int | None) -> None:
        if self._child is not None:
            self._child.write(data)
        else:
            self._pending.append(data)

    def eof_received(self) -> bool:
        if self._child is not None:
            self._child.write_eof()
        else:
            self._eof = True
        return True  # stay half open: the output still flows

    def signal_received(self, signal: str) -> None:
        sig = _signal_number(signal)
        if self._child is not None and sig is not None:
            self._child.signal_group(sig)

    def break_received(self, msec: int) -> bool:
        if self._child is not None:
            self._child.signal_group(signal.SIGINT)
        return True

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self._child is not None:
            self._child.resize((width, height, pixwidth, pixheight))

    def connection_lost(self, exc: Exception | None) -> None:
        """The channel closed (the client went away): hang up on a command that still runs."""
        self._closed = True
        if self._child is not None:
            self._child.signal_group(signal.SIGHUP)

    # flow control
    def pause_writing(self) -> None:
        if self._child is not None:
            self._child.pause_output()

    def resume_writing(self) -> None:
        if self._child is not None:
            self._child.resume_output()

    def pause_input(self) -> None:
        if self._chan is not None and not self._closed:
            self._chan.pause_reading()

    def resume_input(self) -> None:
        # Not from inside the pipe's callback: resuming delivers the channel's buffered data (and EOF) at once,
        # which asyncio's pipe transport does not expect while it is finishing a write.
        asyncio.get_running_loop().call_soon(self._resume_input)

    def _resume_input(self) -> None:
        if self._chan is not None and not self._closed and not self._chan.is_closing():
            self._chan.resume_reading()

    # output and exit status to the client
    def send(self, data: bytes, *, stderr: bool) -> None:
        if self._chan is None or self._closed or self._chan.is_closing():
            return
        with contextlib.suppress(OSError):
            self._chan.write(data, asyncssh.EXTENDED_DATA_STDERR if stderr else None)

    def exited(self, returncode: int | None) -> None:
        chan = self._chan
        if chan is None or self._closed or chan.is_closing():
            return
        if returncode is None:
            chan.exit(255)
        elif returncode >= 0:
            chan.exit(returncode)
        else:
            try:
                chan.exit_with_signal(signal.Signals(-returncode).name.removeprefix("SIG"))
            except ValueError:
                chan.exit(128 - returncode)


class _NodeServer(asyncssh.SSHServer):
    """asyncssh's per-connection server object: tracks connections and opens sessions."""

    def __init__(self, node: LabNode) -> None:
        self._node = node
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._node.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._node.connections.discard(self._conn)

    def session_requested(self) -> _Session | bool:
        if self._node.stopping or self._conn is None:
            return False
        return _Session(self._node, self._conn)
