"""The node-side programs under Python 3.8 (nodes may have nothing newer): the run supervisor, the SSH check."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from ftconsole.scheduler.node.bundle import script
from ftconsole.scheduler.ssh.runs import supervisor_script
from tests.unit.test_agent import python38


def supervise(python: str, params: dict[str, object]) -> dict[str, object]:
    done = subprocess.run([python, "-"], input=supervisor_script(params), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_supervisor_runs_steps_on_python38(tmp_path: Path) -> None:
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    run_dir = tmp_path / "runs" / "1" / "1" / "0"
    step = {"kind": "task", "env": {}, "count": 2}
    steps = [
        {**step, "name": "a", "index": 0, "argv": ["sh", "-c", "echo one"]},
        {**step, "name": "b", "index": 1, "argv": ["sh", "-c", "echo two; exit 3"]},
    ]
    started = supervise(python, {"action": "start", "run_dir": str(run_dir), "argv": ["true"], "env": {},
                                 "workdir": str(tmp_path), "steps": steps})  # fmt: skip
    assert started["started"] is True
    deadline = time.monotonic() + 30
    status: dict[str, object] = {}
    while time.monotonic() < deadline:
        runs = supervise(python, {"action": "status", "run_dirs": [str(run_dir)]})["runs"]
        status = runs[0]["status"]  # type: ignore[index]
        if status["state"] not in ("starting", "running"):
            break
        time.sleep(0.05)
    assert (status["state"], status["exit_code"]) == ("exited", 3)
    stat = (run_dir / "output.log").stat()  # the progress heartbeat: output.log's mtime and size
    assert (status["output_mtime"], status["output_size"]) == (stat.st_mtime, stat.st_size)
    log = (run_dir / "output.log").read_text()
    assert "one\n" in log and "two\n" in log and "ftconsole: task b exited with code 3" in log


def test_the_ssh_check_runs_on_python38(tmp_path: Path) -> None:
    """The pre-launch SSH check is node side too: a peer whose ssh fails is named, on Python 3.8."""
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    fake = tmp_path / "ssh"
    fake.write_text('#!/bin/sh\necho "Permission denied (publickey)." >&2\nexit 255\n')
    fake.chmod(0o755)
    argv = [python, "-c", script("sshcheck"), "gpu01", "2", "", "mpirun (OpenMPI)", "gpu02", "10.1.0.2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 255
    assert done.stderr.splitlines()[-1] == (
        "ftconsole: ssh check: gpu01 cannot reach gpu02 (10.1.0.2) by SSH without a prompt: "
        "Permission denied (publickey). (ssh exit 255)"
    )


def test_the_supervisor_bundle_answers_every_reading_action_on_python38(tmp_path: Path) -> None:
    """The bundle (supervisor.py and its supervisor_*.py modules, one script) on Python 3.8: each action that
    does not start anything, retention included, reaches code of every bundled module."""
    python = python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    root = tmp_path / "runs"
    old = root / "c1" / "7" / "1" / "0"
    old.mkdir(parents=True)
    (old / "status.json").write_text(json.dumps({"state": "exited", "ended": 1.0, "token": "t-old"}))
    (old / "output.log").write_text("step 1\nstep 2\n")
    prepared = root / "c1" / "8" / "1" / "0"
    made = supervise(python, {"action": "prepare", "run_dir": str(prepared), "argv": ["true"], "env": {"A": "1"},
                              "files": {"hostfile": "gpu01\n"}})  # fmt: skip
    assert made == {"run_dir": str(prepared), "supervisor": 2}
    assert supervise(python, {"action": "files", "run_dir": str(prepared)})["hostfile"] == "gpu01\n"
    assert isinstance(supervise(python, {"action": "port"})["port"], int)
    assert supervise(python, {"action": "account"})["home"]
    tail = supervise(python, {"action": "read", "path": str(old / "output.log"), "limit": 100, "tail": 1})
    assert tail["offset"] == len("step 1\n")
    scan = {str(old): {"from": 0, "patterns": {"step": r"step (?P<n>\d+)"}}}
    prune = {"run_root": str(root), "cluster": "c1", "retention": 60, "keep": ["8/1"], "tokens": []}
    status = supervise(python, {"action": "status", "run_dirs": [str(old)], "scan": scan})["runs"][0]["status"]
    assert status["state"] == "exited" and status["output_size"] == len("step 1\nstep 2\n")
    assert [m["n"] for m in status["scan"]["matches"]["step"]] == ["1", "2"]
    read = supervise(python, {"action": "status", "run_dirs": [str(old)], "prune": prune})
    assert read["pruned"] == ["7/1"] and not old.exists() and prepared.exists()
    assert read["runs"][0]["status"]["state"] == "absent"  # the prune comes first
    stopped = supervise(python, {"action": "stop", "run_dirs": [str(prepared)]})["stopped"]
    assert stopped == [{"run_dir": str(prepared), "signalled": False, "alive": False, "reason": "no such run"}]
    signalled = supervise(python, {"action": "signal", "run_dirs": [str(prepared)], "signal": "SIGUSR1"})
    assert signalled["signalled"] == [{"run_dir": str(prepared), "signalled": False, "reason": "no such run"}]
