"""Processes of the lab: liveness, finding and killing every process of its nodes, the lab.lock pid lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from ftconsole.lab.files import LabPaths
from ftconsole.scheduler.errors import LabError
from ftconsole.scheduler.node.proc import _stat

KILL_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long
STOP_TIMEOUT_S = 10.0


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not); reaps it when it is our exited child."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    if Path("/proc/self").exists():
        stat = _stat(pid)  # (state, pgrp, start time) from /proc/PID/stat
        return stat is not None and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def find_lab_processes(lab_dir: Path | str, node: str | None = None) -> list[int]:
    """Pids of our uid whose environment names this lab (FTCONSOLE_LAB_ROOT), i.e. started on its nodes.

    With `node`, only those started on that node (FTCONSOLE_LAB_NODE).
    """
    marker = f"FTCONSOLE_LAB_ROOT={LabPaths.of(lab_dir).root}".encode()
    node_marker = f"FTCONSOLE_LAB_NODE={node}".encode() if node is not None else None
    uid, me, out = os.getuid(), os.getpid(), []
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        variables = environ.split(b"\0")
        if marker in variables and (node_marker is None or node_marker in variables):
            out.append(int(entry.name))
    return out


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_lab_processes(lab_dir: Path | str, timeout: float = STOP_TIMEOUT_S) -> int:
    """Kill every process of the lab's nodes (SIGTERM, then SIGKILL); the number found. LabError if some stay."""
    found = set(find_lab_processes(lab_dir))
    if not found:
        return 0
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    term_until = time.monotonic() + KILL_GRACE_S
    while True:
        time.sleep(0.05)
        left = find_lab_processes(lab_dir)
        found.update(left)
        if not left:
            return len(found)
        if time.monotonic() > deadline:
            raise LabError(f"lab processes still running after {timeout:g}s: {' '.join(map(str, sorted(left)))}")
        if time.monotonic() > term_until:
            _signal_all(left, signal.SIGKILL)


class PidLock:
    """fcntl.flock on lab.lock, holding the owner's pid: one lab server per lab folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = self.owner()
            who = f" (pid {owner})" if owner else ""
            raise LabError(f"{self.path.parent} is in use by another lab server{who}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def owner(self) -> int | None:
        """The pid written in the lock file, when some process holds the lock; else None."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.read(fd, 64).decode(errors="replace").strip()
                return int(text) if text.isdigit() else None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)


def _raise_nofile_limit() -> None:
    """256 nodes, their connections and sessions need more than the usual 1024 descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
