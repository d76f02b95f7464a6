"""A run's status.json belongs to the run's user, who may write anything in it (issue 26): wrong types, a list,
huge numbers, a FIFO. Each such run reads lost ("its status file is unreadable: ..."), alone: never a node's
whole read, never a signal sent on its word. Checked on both sides: the node (the bundled supervisor, run for
real as `python3 -`, and its functions called directly) and the scheduler (`RunStatus.from_json`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.runstatus import UNREADABLE, RunStatus
from ftconsole.scheduler.node.proc import _alive, boot_id, start_time
from ftconsole.scheduler.node.supervisor_files import _checked_status, _read_status
from ftconsole.scheduler.node.supervisor_liveness import _any_alive, _group, _observe
from ftconsole.scheduler.ssh.runs import supervisor_script

TIMEOUT = 30

# (status.json as its user wrote it, a piece of what the error must say): every one reads lost
BAD_DOCUMENTS: list[tuple[Any, str]] = [
    (["x"], "not a JSON object but list"),
    ("running", "not a JSON object but str"),
    (None, "not a JSON object but NoneType"),
    ({}, "state None is not one of"),
    ({"state": ["x"]}, "state ['x'] is not one of"),
    ({"state": "sleeping"}, "state 'sleeping' is not one of"),
    ({"state": "running", "supervisor_pid": "x"}, "supervisor_pid 'x' is not a pid"),
    ({"state": "running", "supervisor_pid": 0}, "supervisor_pid 0 is not a pid"),
    ({"state": "running", "supervisor_pid": -1}, "supervisor_pid -1 is not a pid"),
    ({"state": "running", "supervisor_pid": True}, "supervisor_pid True is not a pid"),
    ({"state": "running", "supervisor_pid": 2**80}, "is not a pid"),
    ({"state": "running", "pid": 1.5}, "pid 1.5 is not a pid"),
    ({"state": "running", "supervisor_start": "1"}, "supervisor_start '1' is not a start time"),
    ({"state": "running", "pid_start": 2**70}, "pid_start"),
    ({"state": "exited", "ended": "yesterday"}, "ended 'yesterday' is not a time"),
    ({"state": "exited", "ended": -5}, "ended -5 is not a time"),
    ({"state": "exited", "started": 1e300}, "started 1e+300 is not a time"),
    ({"state": "exited", "exit_code": 256}, "exit_code 256 is not an exit status"),
    ({"state": "exited", "exit_code": "0"}, "exit_code '0' is not an exit status"),
    ({"state": "exited", "signal": 9}, "signal 9 is not"),
    ({"state": "exited", "error": {"a": 1}}, "error {'a': 1} is not"),
    ({"state": "exited", "error": "x" * 20000}, "error 'xxxx"),
    ({"state": "running", "boot_id": 5}, "boot_id 5 is not"),
    ({"state": "running", "token": ["t"]}, "token ['t'] is not"),
    ({"state": "running", "step": 3}, "step 3 is not"),
]

# what the node alone adds or checks (the scheduler never sees these keys from a file)
NODE_ONLY: list[tuple[Any, str]] = [
    ({"state": "running", "pgid": [1]}, "pgid [1] is not a pid"),  # the scheduler keeps no pgid
    ({"state": "orphaned"}, "state 'orphaned' is not one of"),  # the node's word, never written to the file
    ({"state": "running", "container": ["podman"]}, "container ['podman'] is not"),
    ({"state": "running", "container": {"runtime": "podman", "path": 5}}, "container {"),
    ({"state": "running", "token": "t", "supervisor_pid": 1}, "it has a token but no supervisor_start"),
]

# what the scheduler alone checks (the node adds these)
SCHEDULER_ONLY: list[tuple[Any, str]] = [
    ({"state": "running", "io": "many"}, "io 'many' is not an I/O count"),
    ({"state": "running", "io": -1}, "io -1 is not"),
    ({"state": "running", "output_mtime": float("nan")}, "output_mtime nan is not a time"),
    ({"state": "running", "output_size": 2**64}, "output_size"),
    ({"state": "running", "scan": []}, "scan [] is not a scan"),
    ({"state": "running", "scan": {"matches": {"p": ["x"]}}}, "is not a scan of output.log"),
]


@pytest.mark.parametrize(("doc", "says"), BAD_DOCUMENTS + SCHEDULER_ONLY, ids=lambda v: repr(v)[:40])
def test_the_scheduler_reads_a_bad_status_document_as_lost_with_what_is_wrong(doc: Any, says: str) -> None:
    status = RunStatus.from_json(doc)
    assert status.state == "lost"
    assert status.error is not None and status.error.startswith(UNREADABLE)
    assert says in status.error
    assert len(status.error) < 200  # a value is quoted short, never whole
    assert (status.pid, status.supervisor_pid, status.pid_start, status.exit_code, status.io) == (None,) * 5


GOOD = {
    "state": "exited",
    "pid": 4242,
    "supervisor_pid": 4241,
    "supervisor_start": 123456,
    "pid_start": 123460,
    "started": 1_700_000_000.5,
    "ended": 1_700_000_100,
    "stop_requested": None,
    "exit_code": 3,
    "signal": None,
    "error": "ftconsole: before hook exited with code 3: boom",
    "step": "command",
    "token": "a1b2",
    "boot_id": "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab",
    "output_mtime": 1_700_000_099.25,
    "output_size": 12,
    "io": 2**40,
    "scan": {"to": 12, "matches": {"progress": [{"epoch": "3", "line": "epoch 3"}]}},
    "node": "gpu01",  # the node's own keys the scheduler does not keep
    "pgid": 4242,
}


def test_the_scheduler_keeps_every_field_of_a_good_status_document() -> None:
    status = RunStatus.from_json(GOOD)
    assert (status.state, status.pid, status.supervisor_pid, status.supervisor_start) == ("exited", 4242, 4241, 123456)
    assert (status.pid_start, status.started, status.ended) == (123460, 1_700_000_000.5, 1_700_000_100)
    assert status.exit_code == 3
    assert (status.step, status.token, status.boot_id) == ("command", "a1b2", GOOD["boot_id"])
    assert (status.output_at, status.output_size, status.io) == (1_700_000_099.25, 12, 2**40)
    assert status.scan == GOOD["scan"] and status.error == GOOD["error"]
    for state in ("starting", "running", "lost", "orphaned", "absent", "foreign", "failed"):
        assert RunStatus.from_json({"state": state}).state == state
    node_said = {"state": "lost", "error": UNREADABLE + "not a JSON object but list"}  # the node's verdict stands
    assert RunStatus.from_json(node_said) == RunStatus(state="lost", error=node_said["error"])


# -- the node ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("doc", "says"), BAD_DOCUMENTS + NODE_ONLY, ids=lambda v: repr(v)[:40])
def test_the_node_checks_a_status_document_and_looks_at_nothing_of_a_bad_one(doc: Any, says: str) -> None:
    checked, problem = _checked_status(doc)
    assert checked is None and problem is not None and says in problem
    observed = _observe(doc, "/nonexistent/status.json")  # was: TypeError, AttributeError, or a pid looked up
    assert observed == {"state": "lost", "error": UNREADABLE + problem}
    assert _any_alive(doc, {}) is False


@pytest.mark.parametrize("value", ["x", None, 0, -3, True, 1.0, [1], {"a": 1}, 2**80])
def test_liveness_of_a_value_that_is_not_a_pid_is_no(value: Any) -> None:
    me = os.getpid()
    assert _alive(value, start_time(me), boot_id()) is False
    assert _alive(me, value, boot_id()) is False
    assert _group(value, start_time(me), boot_id()) == []
    assert _group(os.getpgid(0), value, boot_id()) == []


def test_the_node_keeps_only_the_keys_the_supervisor_writes() -> None:
    doc = {**GOOD, "io": 5, "output_mtime": 1.0, "scan": {}, "orphans": [1], "anything": "else"}
    del doc["output_size"]
    checked, problem = _checked_status(doc)
    assert problem is None and checked is not None
    assert not {"io", "output_mtime", "scan", "orphans", "anything"} & set(checked)  # what only the node adds
    assert checked["supervisor_pid"] == 4241 and checked["node"] == "gpu01"


def test_a_status_file_is_read_only_when_it_is_a_small_regular_json_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    assert _read_status(str(path)) == (None, None)  # none at all: absent, not unreadable
    os.mkfifo(path)  # was: the read waited for a writer, forever
    assert _read_status(str(path)) == (None, "it is not a regular file")
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text('{"state": "exited"}')
    assert _read_status(str(path))[1] is not None  # a link is never followed
    path.unlink()
    path.write_text(" " * (64 * 1024 + 1))
    assert "more than" in str(_read_status(str(path))[1])
    path.write_text('{"state": "exit')
    assert "not JSON" in str(_read_status(str(path))[1])
    path.write_bytes(b'{"state": "\xff"}')
    assert "not JSON" in str(_read_status(str(path))[1])
    path.write_text("[" * 30_000 + "]" * 30_000)
    assert "not JSON" in str(_read_status(str(path))[1])
    path.write_text(json.dumps({"state": "exited", "exit_code": 0}))
    assert _read_status(str(path)) == ({"state": "exited", "exit_code": 0}, None)


# -- the bundled supervisor, for real ---------------------------------------------------------------------------

ROOT = "~/.ftconsole/runs/cid"


def act(home: Path, params: dict[str, Any]) -> dict[str, Any]:
    """One supervisor action with HOME=home, as the scheduler sends it (its JSON answer, which has no error)."""
    done = subprocess.run(
        [sys.executable, "-"], input=supervisor_script(params), capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "HOME": str(home)}, check=False,
    )  # fmt: skip
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")), None)
    assert line is not None, done.stderr
    doc: dict[str, Any] = json.loads(line)
    assert "error" not in doc, doc
    return doc


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A live process (its own group) that a forged status.json names: nothing may signal it on that word."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def forged(victim: subprocess.Popen[bytes], **wrong: Any) -> dict[str, Any]:
    """A status naming `victim` with its true start time and boot (alive by every test) and one value wrong."""
    started = start_time(victim.pid)
    return {"state": "running", "token": "tok", "boot_id": boot_id(), "supervisor_pid": victim.pid,
            "supervisor_start": started, "pid": victim.pid, "pgid": victim.pid, "pid_start": started,
            "step": "command", **wrong}  # fmt: skip


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        ({"exit_code": "x"}, "exit_code 'x' is not an exit status"),
        ({"started": [1]}, "started [1] is not a time"),
        ({"boot_id": 5}, "boot_id 5 is not"),
        ({"node": {"n": 1}}, "node {'n': 1} is not"),
    ],
)
def test_a_run_with_a_forged_status_reads_lost_alone_and_nothing_is_signalled_on_its_word(
    tmp_path: Path, victim: subprocess.Popen[bytes], wrong: dict[str, Any], says: str
) -> None:
    """Beside it a good run (ended) of the same read; the forged one names a live process as its supervisor
    and step, with their true start times: on its word (before) a stop sent that process SIGTERM, a forced
    stop SIGKILL, a signal SIGUSR1. Now nothing is sent, and each answer says why."""
    home = tmp_path / "home"
    bad, good = f"{ROOT}/7/1/0", f"{ROOT}/7/1/1"
    for rank, doc in (("0", forged(victim, **wrong)), ("1", {"state": "exited", "exit_code": 0, "token": "tok"})):
        folder = home / ".ftconsole/runs/cid/7/1" / rank
        folder.mkdir(parents=True)
        (folder / "status.json").write_text(json.dumps(doc))
    tokens = {bad: "tok", good: "tok"}
    runs = act(home, {"action": "status", "node": "n01", "run_dirs": [bad, good], "tokens": tokens})["runs"]
    why = UNREADABLE + says
    assert [r["status"]["state"] for r in runs] == ["lost", "exited"]
    assert runs[0]["status"]["error"].startswith(why)
    assert set(runs[0]["status"]) == {"state", "error"}  # nothing of the file is passed on
    listed = act(home, {"action": "status", "node": "n01", "root": ROOT})["runs"]
    assert [(r["rank"], r["status"]["state"]) for r in listed] == [("0", "lost"), ("1", "exited")]
    for force in (False, True):
        stopped = act(home, {"action": "stop", "node": "n01", "run_dirs": [bad], "tokens": tokens, "force": force})
        assert stopped["stopped"][0]["signalled"] is False and stopped["stopped"][0]["reason"].startswith(why)
    signalled = act(home, {"action": "signal", "node": "n01", "run_dirs": [bad], "signal": "SIGUSR1"})
    assert signalled["signalled"][0]["signalled"] is False
    time.sleep(0.2)
    assert alive(victim.pid)
    assert json.loads((home / ".ftconsole/runs/cid/7/1/0/status.json").read_text())["step"] == "command"  # untouched


def test_a_status_file_made_a_fifo_reads_lost_at_once(tmp_path: Path) -> None:
    """Before, the read opened the FIFO and waited for a writer: the user's read, and so the node's, hung."""
    home = tmp_path / "home"
    folder = home / ".ftconsole/runs/cid/7/1/0"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "status.json")
    started = time.monotonic()
    (run,) = act(home, {"action": "status", "run_dirs": [f"{ROOT}/7/1/0"]})["runs"]
    assert run["status"] == {"state": "lost", "error": UNREADABLE + "it is not a regular file"}
    (stopped,) = act(home, {"action": "stop", "run_dirs": [f"{ROOT}/7/1/0"], "force": True})["stopped"]
    assert not stopped["signalled"] and not stopped["alive"]
    assert time.monotonic() - started < 10


def test_a_run_of_a_live_supervisor_whose_user_rewrote_its_status_is_stopped_by_nobody_but_reads_lost(
    tmp_path: Path,
) -> None:
    """The real thing: a run started by the supervisor whose command rewrites its own status.json (wrong types,
    then sleeps). It reads lost; once its command ends, the supervisor's own record (valid) stands again."""
    home = tmp_path / "home"
    command = (
        'd=$(dirname "$FT_HOSTFILE"); sleep 0.5; '
        'printf %s \'{"state": "running", "supervisor_pid": "x"}\' > "$d/status.json"; sleep 2'
    )
    run_dir = f"{ROOT}/8/1/0"
    params = {"action": "start", "node": "n01", "token": "tok", "run_dir": run_dir, "argv": ["sh", "-c", command],
              "env": {"FT_HOSTFILE": str(home / ".ftconsole/runs/cid/8/1/0/hostfile")}, "workdir": "~",
              "files": {"hostfile": "n01 slots=1\n"}, "grace": 1}  # fmt: skip
    assert act(home, params)["started"]
    asked = {"action": "status", "node": "n01", "run_dirs": [run_dir], "tokens": {run_dir: "tok"}}
    states = []
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        (run,) = act(home, asked)["runs"]
        states.append(run["status"].get("error") if run["status"]["state"] == "lost" else run["status"]["state"])
        if run["status"]["state"] == "exited":
            break
        time.sleep(0.1)
    assert UNREADABLE + "supervisor_pid 'x' is not a pid" in states
    assert states[-1] == "exited"
    (run,) = act(home, asked)["runs"]
    assert run["status"]["exit_code"] == 0


def test_a_bad_run_beside_them_leaves_the_checkpoint_signal_of_good_runs_alone(
    tmp_path: Path, victim: subprocess.Popen[bytes]
) -> None:
    """A signal to several runs: the bad one answers why, the good one (a real process group) gets it."""
    home = tmp_path / "home"
    got = tmp_path / "got"
    script = f"trap 'echo usr1 > {got}; exit 0' USR1; while :; do sleep 0.05; done"
    good = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        time.sleep(0.2)
        docs = {"0": forged(victim, ended="x"), "1": forged(good)}
        for rank, doc in docs.items():
            folder = home / ".ftconsole/runs/cid/9/1" / rank
            folder.mkdir(parents=True)
            (folder / "status.json").write_text(json.dumps(doc))
        dirs = [f"{ROOT}/9/1/0", f"{ROOT}/9/1/1"]
        answers = act(home, {"action": "signal", "run_dirs": dirs, "signal": "SIGUSR1"})["signalled"]
        assert [a["signalled"] for a in answers] == [False, True]
        good.wait(timeout=TIMEOUT)
        assert got.read_text() == "usr1\n" and alive(victim.pid)
    finally:
        if good.poll() is None:
            os.killpg(good.pid, signal.SIGKILL)
            good.wait()


def test_a_claim_is_read_small_and_never_from_a_fifo_or_a_link(tmp_path: Path) -> None:
    """The claim is its user's file too: a FIFO made the start wait forever, a huge one went whole into messages."""
    from ftconsole.scheduler.node.supervisor_files import _read_text

    claim = tmp_path / "claim"
    os.mkfifo(claim)
    assert _read_text(str(claim)) is None
    claim.unlink()
    claim.write_text("t" * 100_000)
    assert _read_text(str(claim)) == "t" * 4096
    claim.unlink()
    claim.symlink_to(tmp_path / "token")
    (tmp_path / "token").write_text("tok")
    assert _read_text(str(claim)) is None
