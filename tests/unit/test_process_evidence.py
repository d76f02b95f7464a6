"""The node's look at a rank's processes (supervisor action `processes`, scheduler/node/supervisor_evidence.py),
run for real as `python3 -` with the bundled supervisor on real processes of this machine: a launcher with two
workers (RANK set), one sleeping in a Python function, one stopped; py-spy found on PATH, taken from a copy whose
hash is right, refused from one whose hash is wrong."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.node.proc import boot_id, start_time
from ftconsole.scheduler.ssh.runs import supervisor_script

TIMEOUT = 30
PY_SPY = Path(sys.executable).with_name("py-spy")
LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    worker = "import time\\ndef load_batch():\\n    time.sleep(600)\\nload_batch()\\n"
    children = [subprocess.Popen([sys.executable, "-c", worker], env=dict(os.environ, RANK=str(r))) for r in (0, 1)]
    print(" ".join(str(c.pid) for c in children), flush=True)
    time.sleep(600)
""")


def act(params: dict[str, Any], path: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-"], input=supervisor_script(params), capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "PATH": path}, check=False,
    )  # fmt: skip
    line = next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{"))
    doc: dict[str, Any] = json.loads(line)
    assert "error" not in doc, doc
    return doc


@pytest.fixture
def launcher() -> Iterator[tuple[int, list[int]]]:
    """A launcher in a process group of its own, with two workers: (its pid, the workers' pids)."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        time.sleep(1.5)  # the workers are in load_batch by now (py-spy needs the interpreter up)
        yield proc.pid, workers
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)
        assert proc.stdout is not None
        proc.stdout.close()


def group(pid: int) -> dict[str, Any]:
    return {"key": "r0", "pgid": pid, "start": start_time(pid), "boot": boot_id()}


def no_py_spy_path() -> str:
    return "/usr/bin:/bin"


def test_every_process_of_the_group_with_its_state_cpu_rank_and_stack(launcher: tuple[int, list[int]]) -> None:
    leader, (first, second) = launcher
    os.kill(second, signal.SIGSTOP)
    path = f"{PY_SPY.parent}:/usr/bin:/bin"
    doc = act({"action": "processes", "groups": [group(leader)], "sample": 0.3, "stacks": True}, path)
    assert doc["py_spy"] == str(PY_SPY) and doc["machine"] == os.uname().machine
    [seen] = doc["groups"]
    procs = {p["pid"]: p for p in seen["processes"]}
    assert set(procs) == {leader, first, second}
    assert procs[first]["ppid"] == leader and procs[first]["env"] == {"RANK": "0"}
    assert (procs[first]["state"], procs[second]["state"]) == ("S", "T")
    assert procs[second]["wchan"] == "do_signal_stop"
    assert all(p["python"] and p["cpu_moved"] is not None and p["cpu_moved"] < 0.2 for p in procs.values())
    for pid in (first, second):
        [main] = [t for t in procs[pid]["stack"] if t["tid"] == pid]
        assert [f["name"] for f in main["frames"]] == ["load_batch", "<module>"], procs[pid]
        assert procs[pid]["stack_error"] is None
        assert procs[pid]["stack_moved"] is False  # the same at the start of the 0.3 s sample and after it


def test_a_group_whose_leader_is_another_process_now_is_gone(launcher: tuple[int, list[int]]) -> None:
    leader, _ = launcher
    stale = dict(group(leader), start=group(leader)["start"] - 1)
    doc = act({"action": "processes", "groups": [stale], "sample": 0, "stacks": False}, no_py_spy_path())
    assert doc["groups"] == [{"key": "r0", "gone": f"its process is gone (pid {leader} is another process now)"}]


def test_py_spy_sent_is_run_only_when_its_bytes_hash_to_what_was_named(
    launcher: tuple[int, list[int]], tmp_path: Path
) -> None:
    leader, (first, _) = launcher
    copy = tmp_path / "py-spy-copy"
    copy.write_bytes(PY_SPY.read_bytes())
    copy.chmod(0o700)
    right = hashlib.sha256(copy.read_bytes()).hexdigest()
    asked = {"action": "processes", "groups": [group(leader)], "sample": 0, "stacks": True}
    doc = act({**asked, "py_spy": {"path": str(copy), "sha256": right}}, no_py_spy_path())
    assert doc["py_spy"] == str(copy)
    assert next(p for p in doc["groups"][0]["processes"] if p["pid"] == first)["stack"]
    doc = act({**asked, "py_spy": {"path": str(copy), "sha256": "0" * 64}}, no_py_spy_path())
    assert doc["py_spy"] is None
    worker = next(p for p in doc["groups"][0]["processes"] if p["pid"] == first)
    assert (worker["stack"], worker["stack_error"]) == (None, "py-spy is not on this node (and none was sent)")


def test_the_ranks_a_launcher_started_elsewhere_are_found_by_the_jobs_environment_and_only_its_attempts() -> None:
    """Processes started outside the run's process group (by a launcher over SSH) with the job's FT_JOB_ID and
    FT_ATTEMPT are found, with their children; another attempt's are not. (None is under an SSH server here, nor
    is this action: the same node's, as the rule wants.)"""
    child = "import time; time.sleep(600)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(600)"

    def start(attempt: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "FT_JOB_ID": "9177", "FT_ATTEMPT": attempt}
        return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)

    def ask(attempt: str) -> dict[str, Any]:
        group = {"key": "r", "env": {"FT_JOB_ID": "9177", "FT_ATTEMPT": attempt}}
        doc = act({"action": "processes", "groups": [group], "sample": 0, "stacks": False}, os.environ["PATH"])
        return dict(doc["groups"][0])

    ours, other = start("2"), start("1")
    try:
        deadline, found = time.monotonic() + TIMEOUT, []
        while time.monotonic() < deadline and len(found) < 2:  # until it has started its child
            found = ask("2").get("processes") or []
            time.sleep(0.2)
        pids = {p["pid"] for p in found}
        assert ours.pid in pids and other.pid not in pids and len(pids) == 2, found
        assert "its launcher has not started it" in ask("3")["gone"]
    finally:
        for proc in (ours, other):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(TIMEOUT)


@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="writing into the kernel log needs root")
def test_the_driver_xids_since_the_attempt_started_come_with_the_processes(tmp_path: Path) -> None:
    """The bundled supervisor's action reads the kernel log (kernel_log.py), with the GPUs of the simulated file
    of the node's environment; a line written into the real /dev/kmsg, as the driver would, is in the answer."""
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": 0, "pci_bus_id": "00007e57:18:00.0"}]}))
    since = time.time() - 1
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write("<4>NVRM: Xid (PCI:7e57:18:00): 94, pid=7, Contained: SM (0x1). RST: No, D-RST: No\n")
    params = {"action": "processes", "groups": [], "sample": 0, "stacks": False, "kernel_since": since}
    done = subprocess.run(
        [sys.executable, "-"], input=supervisor_script(params), capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "FTCONSOLE_SIM_GPUS": str(gpus)}, check=False,
    )  # fmt: skip
    doc = json.loads(next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")))
    found = [(x["code"], x["gpu"], x["pci"]) for x in doc["kernel"]["xids"]]
    assert (94, 0, "7e57:18:00") in found
