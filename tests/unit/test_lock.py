"""StateLock: one scheduler per state directory, held in this process or in another one."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ftconsole.scheduler.errors import AlreadyRunning
from ftconsole.scheduler.serve.lock import StateLock

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys
from pathlib import Path
from ftconsole.scheduler.serve.lock import StateLock
with StateLock(Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.readline()
"""


@contextmanager
def held_by_subprocess(state_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process that holds the lock until the block ends (it then reads a line and exits)."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state_dir)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready, "the child did not take the lock within 30 s"
            assert proc.stdout.readline() == "locked\n"
            yield proc
            if proc.poll() is None:
                proc.stdin.write("\n")
                proc.stdin.flush()
                assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_second_lock_in_the_same_process_names_the_holder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with StateLock(state):
        assert (state / "scheduler.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(AlreadyRunning) as err:
            StateLock(state).acquire()
        assert f"another scheduler (pid {os.getpid()}) already runs on {state}" in err.value.message
        assert err.value.title == "already running"
        assert err.value.exit_code == 1
        assert StateLock.holder(state) == os.getpid()
    assert StateLock.holder(state) is None
    with StateLock(state):  # free again once released
        pass


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    with held_by_subprocess(tmp_path) as proc:
        assert StateLock.holder(tmp_path) == proc.pid
        with pytest.raises(AlreadyRunning, match=rf"\(pid {proc.pid}\)"):
            StateLock(tmp_path).acquire()
    assert StateLock.holder(tmp_path) is None
    with StateLock(tmp_path):
        assert StateLock.holder(tmp_path) == os.getpid()


def test_lock_of_a_killed_process_is_free_despite_its_pid_file(tmp_path: Path) -> None:
    with held_by_subprocess(tmp_path) as proc:
        proc.kill()
        proc.wait(timeout=30)
        assert (tmp_path / "scheduler.lock").read_text() == f"{proc.pid}\n"  # stale pid left behind
        assert StateLock.holder(tmp_path) is None
        with StateLock(tmp_path):
            assert (tmp_path / "scheduler.lock").read_text() == f"{os.getpid()}\n"


def test_free_lock(tmp_path: Path) -> None:
    assert StateLock.holder(tmp_path / "never-created") is None
    lock = StateLock(tmp_path / "a" / "b")
    lock.acquire()
    lock.acquire()  # already ours: nothing to do
    assert (tmp_path / "a" / "b" / "scheduler.lock").exists()
    lock.release()
    lock.release()
    assert StateLock.holder(tmp_path / "a" / "b") is None
