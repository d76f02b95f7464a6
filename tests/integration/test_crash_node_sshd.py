"""Each failpoint of the scheduler crossed with a node failure, on real sshd nodes (issue 12).

A job with `fault_tolerance: {retries: 2}` (the survivor) runs on two of three nodes; the node of its rank 1
is taken down (`SshdCluster.down`: its sshd and every process started through it killed) and `ftconsole
serve` is killed (-9) at a failpoint, in both orders:

- node-then-crash: the node dies, then a scheduler with ``POINT=crash`` starts: the first crossing of every
  point lies on the survivor's recovery path (observe, the node declared lost after `node_timeout`, the stop
  of rank 0, the requeue, the new placement and its launch);
- crash-then-node: the crash-test jobs (placed, launched, stopped, restarted in place) cross the point first,
  then the node dies while no scheduler runs, and the next one finds both the crash's intents and the loss (at
  the points that leave an intent half done: `HALF_DONE`).

Four points leave the store as another point does once a node is down (`SAME_AS_ANOTHER`); they run in the
crash test without a node down (test_crash_sshd.py), which crosses every point.

A clean scheduler then settles everything. What is checked is what exists: every job's final status, each
rank of each attempt started at most once (each start appends its pid to ``starts.JOB.ATTEMPT.RANK.NODE`` in
its node's home), the rank on the dead node started once and never again, no process of any job left, no run
holding GPUs, and the dead node isolated.

The node-then-crash order runs again with every node sharing one home (an NFS home; the test nodes share a
kernel too) at two points around the survivor's second launch: its second attempt runs on the nodes left, and
each restart's sweep of a node sees the other nodes' run folders.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import failpoints
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import NotRunning
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import STORE_FILE, Store
from tests.sshd_cluster import SshdCluster, lab_processes, pid_alive

pytestmark = pytest.mark.sshd
WAIT = 60.0
# the node's name (sshd_cluster's SetEnv) in the file's: nodes may share a home
START = 'echo $$ >> "$HOME/starts.$FT_JOB_ID.$FT_ATTEMPT.$RANK.$FTCONSOLE_LAB_NODE"'

# its first attempt runs until its node dies; the next one, on healthy nodes, succeeds
SURVIVOR: dict[str, Any] = {
    "name": "survivor", "mode": "pytorch", "nodes": 2,
    "command": f"sh -c '{START}; if [ $FT_ATTEMPT -ge 2 ]; then sleep 1; exit 0; fi; exec sleep 300'",
    "fault_tolerance": {"retries": 2},
}  # fmt: skip
SURVIVOR_STARTS = {(1, 0), (1, 1), (2, 0), (2, 1)}

# the crash test's jobs, kept off the node that dies (node_names) so that each earns one status:
# name -> (spec, its final status, the (attempt, rank) that start)
BYSTANDERS: dict[str, tuple[dict[str, Any], str, set[tuple[int, int]]]] = {
    "ok": ({"command": f"sh -c '{START}; sleep 1'"}, "succeeded", {(1, 0)}),
    # rank 0 is owed the checkpoint signal when rank 1 fails (dump; it ignores it), then stopped
    "fails": (
        {"mode": "pytorch", "nodes": 2,
         "command": f"sh -c '{START}; if [ $RANK = 1 ]; then sleep 1; exit 3; fi; trap \"\" USR1; exec sleep 300'",
         "fault_tolerance": {"strategies": ["dump", "exit"],
                             "checkpoint_resume": {"max_resumes": 0, "grace_period": "1s"}}},
        "error", {(1, 0), (1, 1)},
    ),
    "expires": ({"command": f"sh -c '{START}; exec sleep 300'", "max_runtime": "2s"}, "expired", {(1, 0)}),
    "restarts": (
        {"command": f"sh -c '{START}; if [ $FT_ATTEMPT = 1 ]; then exit 137; fi; sleep 1'",
         "fault_tolerance": {"max_restarts": 1}},
        "succeeded", {(1, 0), (2, 0)},
    ),
}  # fmt: skip

# where the crashing scheduler must be when it dies in node-then-crash: on the survivor's recovery path
AFTER_PLACEMENT = {"place.after_record", "launch.before_send", "launch.after_send", "launch.after_record"}
AFTER_REQUEUE = {"recover.after_record"} | AFTER_PLACEMENT
AFTER_LOSS = {"stop.after_send"} | AFTER_REQUEUE
# points the survivor's recovery never crosses (it sends no checkpoint signal): crash-then-node's bystanders do
OFF_THE_SURVIVORS_PATH = {"checkpoint.before_signal"}
# points that leave the store as another point does, with a node down (the crash test without one, in
# test_crash_sshd.py, runs them all): observe.after_read stores nothing, as tick.after_snapshot; launch.before_send
# differs from place.after_record only by the attempt's master port; after launch.after_record the survivor's
# recovery is done and what is left is adopting runs, as in every point after it
# tick.after_snapshot: its first crossing is the first tick, before anything was read; the next scheduler meets the
# dead node with nothing owed, as every crash-then-node case's next scheduler does (with a half-done action more)
SAME_AS_ANOTHER = {"observe.after_read", "launch.before_send", "launch.after_record", "tick.after_snapshot"}
# crash-then-node: the points after which the crash leaves an action half done on a node (a run recorded but not
# started or not known started, a stop or a signal owed, a restart recorded) for the next scheduler to finish while
# it also finds the node gone; after the others (a read, its record, a launch's outcome stored) nothing is owed,
# and the next scheduler meets the loss as at node-then-crash's same points
HALF_DONE = {"place.after_record", "launch.before_send", "launch.after_send", "stop.after_send",
             "checkpoint.before_signal", "recover.after_record"}  # fmt: skip
# with one home for every node: the requeue recorded, and the second attempt's start sent with its outcome not
# stored (its runs may be running on two nodes), where each restart's sweep of a node meets the other nodes' run
# folders; the launch's other points differ from these only in what the store says of the runs, which the
# crash test's shared home covers (tests/integration/test_crash_sshd.py)
SHARED_HOME_POINTS = {"recover.after_record", "launch.after_send"}


def write_config(cluster: SshdCluster, root: Path, sock_dir: Path) -> Path:
    return cluster.write_config(
        root / "cluster.yaml",
        state_dir=str(root / "state"),
        ssh={"python": sys.executable},
        scheduler={"tick": "0.3s", "stop_grace": "1s", "node_timeout": "3s"},
        api={"socket": str(sock_dir / "ft.sock")},
        probes={"interval": "30s"},
    )


async def preload(root: Path, specs: list[dict[str, Any]]) -> dict[int, str]:
    """Queue jobs straight into the store (no scheduler runs meanwhile): job id -> name."""
    ids = {}
    async with await Store.open(root / "state" / STORE_FILE) as store, store.jobs_tx("preload") as tx:
        for data in specs:
            spec = JobSpec.from_json(data)
            job = Job(id=0, name=spec.name, owner="root", uid=0, spec=spec, status=JobStatus.QUEUED,
                      priority="normal", project="default", access="none", submitted=time.time())  # fmt: skip
            ids[await tx.add_job(job)] = spec.name
    return ids


def serve(config: Path, root: Path, points: str | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    if points:
        env[failpoints.ENV] = points
    with open(root / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ftconsole.cli", "--config", str(config), "serve"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def tail(root: Path) -> str:
    return (root / "serve.log").read_text(errors="replace")[-4000:]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean stop: jobs go on running on their nodes), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT)
            return
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    proc.wait(WAIT)


async def call(sock: Path, op: str, **args: Any) -> Any:
    """One API call, or None while no scheduler answers."""
    try:
        async with await ApiClient.connect(sock) as client:
            return await client.call(op, **args)
    except (TimeoutError, NotRunning, OSError):
        return None


async def until_running(sock: Path, root: Path, job_id: int, proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    """The runs of the job's first attempt once each of its ranks runs (pid known)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        shown = await call(sock, "show", job=job_id)
        if shown and shown["attempts"]:
            runs = shown["attempts"][0]["runs"]
            if runs and all(r["pid"] and r["state"] == "running" for r in runs):
                return sorted(runs, key=lambda r: r["rank"])
        assert proc.poll() is None, tail(root)
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} did not start: {await call(sock, 'show', job=job_id)}\n{tail(root)}")


async def settle(config: Path, root: Path, sock: Path, ids: dict[int, str]) -> dict[int, str]:
    """A scheduler without failpoints until every job has ended; their statuses."""
    proc = serve(config, root)
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            jobs = await call(sock, "jobs")
            seen = {j["id"]: j["status"] for j in jobs} if jobs is not None else {}
            if jobs is not None and all(seen.get(i) not in (None, "queued", "running") for i in ids):
                return seen
            assert proc.poll() is None, tail(root)
            await asyncio.sleep(0.2)
        raise AssertionError(f"jobs did not end: {await call(sock, 'jobs')}\n{tail(root)}")
    finally:
        stop(proc)


def starts(cluster: SshdCluster, job_id: int) -> dict[tuple[int, int], list[tuple[str, int]]]:
    """(attempt, rank) -> [(node, pid)] of every start of the job's commands, on every node."""
    out: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    for home in cluster.homes:
        for f in home.glob(f"starts.{job_id}.*.*.*"):
            attempt, rank, node = f.name.split(".")[2:5]
            out[int(attempt), int(rank)] += [(node, int(pid)) for pid in f.read_text().split()]
    return dict(out)


def node_processes(cluster: SshdCluster) -> list[str]:
    """Processes started through any node of the cluster (sshd's SetEnv marks them) that still run."""
    return [f"{pid}: {b' '.join(argv).decode(errors='replace')}" for pid, argv in lab_processes(cluster.root).items()]


def nodes_json(config: Path) -> dict[str, dict[str, Any]]:
    """`ftconsole nodes --json` (read from the store, no scheduler running): name -> view."""
    done = subprocess.run(
        [sys.executable, "-m", "ftconsole.cli", "--config", str(config), "nodes", "--json"],
        capture_output=True, text=True, timeout=WAIT, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {v["name"]: v for v in json.loads(done.stdout)}


async def no_fencing_elsewhere(store: Store) -> None:
    """Every run fenced was fenced on the node it ran on (a sweep that took another node's run folder, in a
    shared home, for its own would name its own node)."""
    where = {(str(r.job), r.attempt, r.rank): r.node for r in await store.runs()}
    for event in await store.events(limit=10000):
        if event.kind == "Fenced":
            found = re.match(r"fenced: rank (\d+) of attempt (\d+) ", event.message)
            assert found is not None, event.message
            ran_on = where.get((event.job, int(found[2]), int(found[1])))
            assert ran_on == event.node, f"job {event.job}: {event.message!r} on {event.node}, ran on {ran_on}"


CASES = [
    (order, layout, point)
    for order, layout in (
        ("node-then-crash", "own-home"),
        ("crash-then-node", "own-home"),
        ("node-then-crash", "shared-home"),
    )
    for point in sorted(failpoints.POINTS)
    if point not in SAME_AS_ANOTHER
    if not (order == "node-then-crash" and point in OFF_THE_SURVIVORS_PATH)
    if not (order == "crash-then-node" and point not in HALF_DONE)
    if layout == "own-home" or point in SHARED_HOME_POINTS
]


@pytest.mark.parametrize(("order", "layout", "point"), CASES)
async def test_a_crash_at_each_failpoint_with_a_node_down_loses_no_job_and_runs_no_rank_twice(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, order: str, layout: str, point: str
) -> None:
    cluster: SshdCluster = sshd_cluster(3, gpus=4, shared_home=layout == "shared-home")
    config = write_config(cluster, tmp_path, sock_dir)
    sock = sock_dir / "ft.sock"

    # the survivor runs on two nodes (a clean scheduler, stopped cleanly: its runs go on)
    ids = await preload(tmp_path, [SURVIVOR])
    (survivor,) = ids
    first = serve(config, tmp_path)
    try:
        runs = await until_running(sock, tmp_path, survivor, first)
    finally:
        stop(first)
    dead = runs[1]["node"]  # the node of rank 1 dies
    healthy = [n.name for n in cluster if n.name != dead]
    assert runs[0]["node"] in healthy
    bystanders = [{"name": name, **spec, "node_names": ",".join(healthy)} for name, (spec, _, _) in BYSTANDERS.items()]

    if order == "node-then-crash":
        cluster.down(dead)
    else:
        ids.update(await preload(tmp_path, bystanders))
    crashing = serve(config, tmp_path, f"{point}=crash")
    try:
        crashing.wait(WAIT)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if crashing.poll() is None:
            crashing.send_signal(signal.SIGKILL)
        crashing.wait(WAIT)
    assert crashing.returncode == -signal.SIGKILL, tail(tmp_path)
    crashed = (tmp_path / "serve.log").read_text(errors="replace").rpartition("failpoints active:")[2]
    assert f"failpoint {point}: crash" in crashed, tail(tmp_path)
    if order == "node-then-crash":
        # the crash fell on the survivor's recovery path, not before it
        lost = crashed.find(f"job {survivor}: rank 1 on {dead} lost")
        if point in AFTER_LOSS:
            assert 0 <= lost < crashed.index(f"failpoint {point}: crash"), crashed
        async with await Store.open(tmp_path / "state" / STORE_FILE) as store:
            attempts = await store.attempts(survivor)
        if point in AFTER_REQUEUE:
            assert [a.result for a in attempts][:1] == ["requeued"], attempts
        if point in AFTER_PLACEMENT:
            assert len(attempts) == 2, attempts
        ids.update(await preload(tmp_path, bystanders))
    else:
        cluster.down(dead)

    seen = await settle(config, tmp_path, sock, ids)

    # every job ended with the status it earns
    expected = {name: status for name, (_, status, _) in BYSTANDERS.items()} | {"survivor": "succeeded"}
    assert {name: seen[i] for i, name in ids.items()} == expected, tail(tmp_path)

    # each rank of each attempt started once at most, the dead node's rank once and never again there
    for job_id, name in ids.items():
        started = starts(cluster, job_id)
        want = SURVIVOR_STARTS if name == "survivor" else BYSTANDERS[name][2]
        assert set(started) == want, f"job {job_id} ({name}): started {started}"
        for key, where in started.items():
            assert len(where) == 1, f"job {job_id} ({name}): attempt {key[0]} rank {key[1]} started {where}"
            if name != "survivor" or key != (1, 1):
                assert where[0][0] != dead, f"job {job_id} ({name}): started on the dead node {dead}: {started}"
            assert not pid_alive(where[0][1]), f"job {job_id} ({name}): process {where[0][1]} still runs"
    assert starts(cluster, survivor)[1, 1][0][0] == dead

    async with await Store.open(tmp_path / "state" / STORE_FILE) as store:
        assert await store.runs(held=True) == []
        await no_fencing_elsewhere(store)
        attempts = await store.attempts(survivor)
        survivor_runs = await store.runs(job=survivor)
        events = await store.events(job=str(survivor), limit=1000)
    assert [a.result for a in attempts] == ["requeued", "succeeded"], attempts
    assert {r.node for r in survivor_runs if r.attempt == 2} == set(healthy)
    restarting = [e.message for e in events if e.kind == "Restarting"]
    assert len(restarting) == 1, restarting
    assert f"rank 1 on {dead} lost" in restarting[0] and f"isolated {dead}" in restarting[0], restarting

    # the dead node is isolated, the others healthy
    views = nodes_json(config)
    assert views[dead]["state"] == "isolated", views[dead]
    assert all(views[n]["state"] == "healthy" for n in healthy), views

    # nothing started through any node runs on (job processes, supervisors, sessions)
    deadline = time.monotonic() + 10
    while (left := node_processes(cluster)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert left == [], left
