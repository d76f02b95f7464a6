"""Nodes that share a home (an NFS /home) and a kernel (containers on one host): the run supervisor, run for
real as `python3 -` with its bundled script, acts only on the runs started for the node it is asked about.

Two "nodes" here are two names given to the same machine and the same HOME, which is the shared case at its
hardest: every process of one node is visible, alive and signallable from the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.ssh.runs import supervisor_script

ROOT = "~/.ftconsole/runs/cid"
TIMEOUT = 30


def act(home: Path, params: dict[str, Any]) -> dict[str, Any]:
    """One supervisor action with HOME=home, as the scheduler sends it (its JSON answer)."""
    done = subprocess.run(
        [sys.executable, "-"], input=supervisor_script(params), capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "HOME": str(home)}, check=False,
    )  # fmt: skip
    line = next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{"))
    doc: dict[str, Any] = json.loads(line)
    assert "error" not in doc, doc
    return doc


def run_dir(rank: int, attempt: int = 1) -> str:
    return f"{ROOT}/7/{attempt}/{rank}"


def start(home: Path, node: str, rank: int, argv: list[str], attempt: int = 1) -> dict[str, Any]:
    params = {"action": "start", "node": node, "token": f"tok-{attempt}", "run_dir": run_dir(rank, attempt),
              "argv": argv, "env": {}, "workdir": "~", "files": {}, "grace": 1}  # fmt: skip
    doc = act(home, params)
    assert doc["started"], doc
    return doc


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_ended(home: Path, node: str, rank: int, attempt: int = 1) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        (run,) = act(home, {"action": "status", "node": node, "run_dirs": [run_dir(rank, attempt)]})["runs"]
        if run["status"]["state"] in ("exited", "failed", "lost"):
            return dict(run["status"])
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not end")


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """The shared home; every run left is killed at the end, as its own node."""
    folder = tmp_path / "home"
    folder.mkdir()
    yield folder
    for attempt_dir in (folder / ".ftconsole/runs/cid/7").glob("*"):
        for rank_dir in attempt_dir.glob("*"):
            status = json.loads((rank_dir / "status.json").read_text())
            given = run_dir(int(rank_dir.name), int(attempt_dir.name))
            act(folder, {"action": "stop", "node": status.get("node"), "run_dirs": [given], "force": True})


def test_a_run_records_its_node_and_a_read_of_the_root_lists_only_the_asking_nodes_runs(home: Path) -> None:
    start(home, "n01", 0, ["sleep", "60"])
    start(home, "n02", 1, ["sleep", "60"])
    listed = {
        node: sorted((r["rank"], r["status"]["node"], r["status"]["state"]) for r in act(
            home, {"action": "status", "node": node, "root": ROOT})["runs"])
        for node in ("n01", "n02", "n03")
    }  # fmt: skip
    assert listed == {"n01": [("0", "n01", "running")], "n02": [("1", "n02", "running")], "n03": []}


def test_a_run_folder_started_for_another_node_reads_foreign_and_is_neither_stopped_nor_signalled(
    home: Path,
) -> None:
    pid = start(home, "n02", 1, ["sleep", "60"])["status"]["pid"]
    asked = {"node": "n01", "run_dirs": [run_dir(1)]}
    (read,) = act(home, {"action": "status", **asked})["runs"]
    assert read["status"] == {"state": "foreign", "error": "the run folder holds a run started for n02"}
    (stopped,) = act(home, {"action": "stop", "force": True, **asked})["stopped"]
    assert stopped == {"run_dir": run_dir(1), "signalled": False, "alive": False, "reason": "a run started for n02"}
    (signalled,) = act(home, {"action": "signal", "signal": "SIGTERM", **asked})["signalled"]
    assert not signalled["signalled"]
    time.sleep(0.2)
    assert alive(pid)
    (stopped,) = act(home, {"action": "stop", "force": True, "node": "n02", "run_dirs": [run_dir(1)]})["stopped"]
    assert stopped["signalled"] and not stopped["alive"]
    assert not alive(pid)


def test_a_run_of_an_earlier_ftconsole_that_records_no_node_is_still_every_nodes(home: Path) -> None:
    start(home, "n01", 0, ["true"])
    wait_ended(home, "n01", 0)
    status_path = home / ".ftconsole/runs/cid/7/1/0/status.json"
    status = json.loads(status_path.read_text())
    status.pop("node")
    status_path.write_text(json.dumps(status))
    for node in ("n01", "n02"):
        (run,) = act(home, {"action": "status", "node": node, "root": ROOT})["runs"]
        assert run["status"]["state"] == "exited"


PRUNE = {"run_root": "~/.ftconsole/runs", "cluster": "cid", "retention": 0.05, "keep": [], "tokens": []}


def test_retention_judges_another_nodes_rank_by_what_it_recorded_never_by_the_processes_it_sees(
    home: Path,
) -> None:
    """n02's rank still runs (its status.json says so); n01's ended. n01's prune must keep the attempt: it
    cannot see n02's processes on a real NFS home (another kernel), and must not judge them here."""
    start(home, "n01", 0, ["true"])
    wait_ended(home, "n01", 0)
    pid = start(home, "n02", 1, ["sleep", "60"])["status"]["pid"]
    status_path = home / ".ftconsole/runs/cid/7/1/1/status.json"
    status = json.loads(status_path.read_text())
    # as n02's own kernel wrote it: another boot, so n01's liveness test would call it lost (a reboot)
    status_path.write_text(json.dumps(dict(status, boot_id="another-kernel")))
    time.sleep(0.1)
    assert act(home, {"action": "status", "node": "n01", "run_dirs": [], "prune": PRUNE})["pruned"] == []
    assert (home / ".ftconsole/runs/cid/7/1").is_dir()
    status_path.write_text(json.dumps(status))  # its own boot again: n02 stops it and records the end
    (stopped,) = act(home, {"action": "stop", "node": "n02", "run_dirs": [run_dir(1)], "force": True})["stopped"]
    assert stopped["signalled"] and not stopped["alive"] and not alive(pid)
    time.sleep(0.1)
    assert act(home, {"action": "status", "node": "n01", "run_dirs": [], "prune": PRUNE})["pruned"] == ["7/1"]
    assert not (home / ".ftconsole/runs/cid/7/1").exists()


def test_each_node_keeps_its_own_reading_of_the_container_runtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftconsole.scheduler.node.agent import runtimes_cache

    monkeypatch.setenv("HOME", str(tmp_path))
    kept = tmp_path / ".ftconsole" / "probe"
    assert [runtimes_cache(n) for n in ("n01", "n02", None)] == [
        f"{kept}/runtimes-n01.json", f"{kept}/runtimes-n02.json", f"{kept}/runtimes.json"
    ]  # fmt: skip
    assert {runtimes_cache(n) for n in ("../x", ".hidden", "a/b", "")} == {None}


def test_retention_of_an_attempt_whose_status_file_its_user_broke_goes_by_its_last_change(home: Path) -> None:
    rank = home / ".ftconsole/runs/cid/7/3/0"
    rank.mkdir(parents=True)
    (rank / "status.json").write_text('["not", "a", "status"]')
    doc = act(home, {"action": "status", "node": "n01", "run_dirs": [], "prune": dict(PRUNE, retention=600)})
    assert "prune_error" not in doc and doc["pruned"] == []  # changed just now: kept
    old = time.time() - 3600
    for path in (rank / "status.json", rank):
        os.utime(path, (old, old))
    doc = act(home, {"action": "status", "node": "n01", "run_dirs": [], "prune": dict(PRUNE, retention=600)})
    assert "prune_error" not in doc and doc["pruned"] == ["7/3"]
