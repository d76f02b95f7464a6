"""One scheduler per state directory: an exclusive ``flock`` on ``<state_dir>/scheduler.lock``.

The kernel drops the lock when the holder exits, however it exits, so a lock file left behind by a crash never
blocks the next start. The file holds the holder's pid, for messages only: whether the lock is held is always
asked of the kernel, never read from a possibly stale pid.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from ftconsole.scheduler.errors import AlreadyRunning

LOCK_NAME = "scheduler.lock"
# holder() takes the lock for an instant to test it; acquire() polls a few times so such a probe never makes a
# starting scheduler believe another one runs
_ACQUIRE_POLLS = 5
_ACQUIRE_POLL_S = 0.01


class StateLock:
    """``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<state_dir>/scheduler.lock``; the file holds the holder's pid."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise AlreadyRunning naming the holder's pid. Creates the state directory."""
        if self._fd is not None:
            return
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: see store.secure_state
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            for attempt in range(_ACQUIRE_POLLS):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt == _ACQUIRE_POLLS - 1:
                        raise AlreadyRunning(_running_message(_read_pid(fd), self.state_dir)) from None
                    time.sleep(_ACQUIRE_POLL_S)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (closing the file drops it); does nothing when not held."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # still ours until the close below: no other holder can have written yet
        finally:
            os.close(fd)

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    @staticmethod
    def holder(state_dir: Path) -> int | None:
        """The pid of the process holding the lock on ``state_dir``, or None when nobody holds it.

        Also None in the instant between a holder taking the lock and writing its pid.
        """
        try:
            fd = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_pid(fd)
            return None  # we could take it: nobody holds it (closing the fd drops our shared lock)
        finally:
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _running_message(pid: int | None, state_dir: Path) -> str:
    who = f"another scheduler (pid {pid})" if pid else "another scheduler"
    return f"{who} already runs on {state_dir}; stop it first, or use the CLI and console against it"
