"""What a run leaves running on its node (scheduler/node/supervisor_leftovers.py): the processes with its FT_JOB_ID and
FT_ATTEMPT that came in through this node's SSH server end with it, and their descendants; another attempt's, and
another node's sharing the kernel (another SSH server end), are left alone. Real processes on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ftconsole.scheduler.node import supervisor_leftovers as leftovers

HERE = "127.0.0.11 22"  # this node's SSH server end
# each test's own job id (and this process's): processes of the same user are looked for machine-wide, so two tests
# running at once (pytest-xdist's workers) must never carry the same FT_JOB_ID
JOB, SHELL_JOB = f"7{os.getpid()}", f"8{os.getpid()}"
CHILD = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"  # a process and its child


def started(attempt: str, server: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FT_JOB_ID=JOB, FT_ATTEMPT=attempt, SSH_CONNECTION=f"127.0.0.1 40000 {server}")
    env.pop(leftovers.LAB_NODE, None)
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env)


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SSH_CONNECTION", f"127.0.0.1 39999 {HERE}")
    monkeypatch.delenv(leftovers.LAB_NODE, raising=False)
    yield


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = leftovers._proc(int(entry))
            if info is not None and info["ppid"] == pid:
                found.append(int(entry))
    return found


def test_the_run_s_own_leftovers_end_and_no_one_else_s(here: None) -> None:
    mine, other_attempt, other_node = started("2", HERE), started("1", HERE), started("2", "127.0.0.12 22")
    try:
        deadline = time.monotonic() + 10
        while not children(mine.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (grandchild,) = children(mine.pid)
        assert leftovers.end_leftovers({"FT_JOB_ID": JOB, "FT_ATTEMPT": "2"}, grace=5.0) == 2  # it and its child
        assert mine.wait(5) == -15
        assert not leftovers._lives(grandchild, (leftovers._proc(grandchild) or {}).get("start"))
        assert other_attempt.poll() is None and other_node.poll() is None
    finally:
        for p in (mine, other_attempt, other_node):
            p.kill()
            p.wait()


def test_nothing_is_looked_for_where_the_node_s_ssh_server_is_not_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    monkeypatch.delenv(leftovers.LAB_NODE, raising=False)
    assert leftovers.leftovers({"FT_JOB_ID": JOB, "FT_ATTEMPT": "2"}) is None
    assert leftovers.stop_leftovers({"env": {"FT_JOB_ID": JOB, "FT_ATTEMPT": "2"}}) == {"found": None}


def test_a_runs_shells_are_their_terminals_and_the_warning_is_written_on_them(here: None) -> None:
    """`shells`: the terminal of a shell in the run's env (a real pseudo-terminal), when it was last typed at, and
    the idle warning written on it; a process of the run without a terminal and another attempt's shell are not."""
    import pty

    master, slave = pty.openpty()
    name = os.ttyname(slave)
    env = dict(os.environ, FT_JOB_ID=SHELL_JOB, FT_ATTEMPT="2", SSH_CONNECTION=f"127.0.0.1 40000 {HERE}")
    env.pop(leftovers.LAB_NODE, None)
    shell = subprocess.Popen(["sleep", "60"], stdin=slave, stdout=slave, stderr=slave, env=env)
    null = subprocess.DEVNULL
    quiet = subprocess.Popen(["sleep", "60"], stdin=null, stdout=null, stderr=null, env=env)  # the run's, no terminal
    other = subprocess.Popen(["sleep", "60"], stdin=slave, stdout=slave, env=dict(env, FT_ATTEMPT="1"))
    try:
        os.close(slave)
        found = leftovers.shell_ttys({"env": {"FT_JOB_ID": SHELL_JOB, "FT_ATTEMPT": "2"}})["ttys"]
        assert list(found) == [name] and found[name] == os.stat(name).st_atime
        leftovers.shell_ttys({"env": {"FT_JOB_ID": SHELL_JOB, "FT_ATTEMPT": "2"}, "warn": "job 7 has been idle"})
        os.set_blocking(master, False)
        assert b"ftconsole: job 7 has been idle" in os.read(master, 4096)
        assert leftovers.shell_ttys({"env": {"FT_JOB_ID": SHELL_JOB, "FT_ATTEMPT": "3"}})["ttys"] == {}
    finally:
        for p in (shell, quiet, other):
            p.kill()
            p.wait()
        os.close(master)
