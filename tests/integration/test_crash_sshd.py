"""The scheduler killed (-9) at every step of its loop, and at random moments, on real sshd nodes.

After each crash a fresh `ftconsole serve` takes over the same store (a SQLite file; the random kills also on
PostgreSQL, where a process killed inside a transaction leaves the server to end it). Both layouts of the
nodes' homes run:
each node with its own (every point), and every node with the same one (an NFS home; here the nodes share a
kernel too: the points after which runs are left on both nodes), where each node's sweep after a restart sees
every other node's run folders and must leave them alone. What is
checked is what exists, not what a log says (Jepsen's way): every job ends with the status its command earns,
each rank's command started exactly once (each start appends its pid to a file on its node), no process of any
job is left running, and no run holds GPUs.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import failpoints
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import NotRunning
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import STORE_FILE, Store
from tests.pg_server import pg_server_fixture  # noqa: F401  (provides the `pg_server` fixture)
from tests.sshd_cluster import SshdCluster, pid_alive

pytestmark = pytest.mark.sshd
WAIT = 60.0
# with one home for both nodes, the points after which runs are left on both nodes for the next scheduler's sweep
# (every point runs with each node's own home; the shared layout is where the sweep can take another node's run)
# (launch.before_send left out: nothing of the attempt is on a node yet, and the own-home case covers it)
SHARED_HOME_POINTS = ("launch.after_send", "observe.after_record", "stop.after_send")
CASES = [("own-home", p) for p in sorted(failpoints.POINTS)] + [("shared-home", p) for p in SHARED_HOME_POINTS]
START = 'echo $$ >> "$HOME/starts.$FT_JOB_ID.$RANK"'

# name -> (spec, the status it must end with, its ranks)
JOBS: dict[str, tuple[dict[str, Any], str, int]] = {
    "ok": ({"command": f"sh -c '{START}; sleep 1'"}, "succeeded", 1),
    # rank 0 is owed the checkpoint signal when rank 1 fails (dump; it ignores it), then stopped
    "fails": (
        {"mode": "pytorch", "nodes": 2,
         "command": f"sh -c '{START}; if [ $RANK = 1 ]; then sleep 1; exit 3; fi; trap \"\" USR1; exec sleep 300'",
         "fault_tolerance": {"strategies": ["dump", "exit"],
                             "checkpoint_resume": {"max_resumes": 0, "grace_period": "1s"}}},
        "error", 2,
    ),
    "expires": ({"command": f"sh -c '{START}; exec sleep 300'", "max_runtime": "2s"}, "expired", 1),
    # killed (137) in its first attempt, restarted in place once (the recovery path): its rank starts twice
    "restarts": (
        {"command": f"sh -c '{START}; if [ $FT_ATTEMPT = 1 ]; then exit 137; fi; sleep 1'",
         "fault_tolerance": {"max_restarts": 1}},
        "succeeded", 2,
    ),
}  # fmt: skip


def write_config(cluster: SshdCluster, root: Path, url: str | None = None) -> Path:
    """The cluster's config; `url`: the state on that PostgreSQL database (else in state_dir's SQLite file)."""
    return cluster.write_config(
        root / "cluster.yaml",
        state_dir=str(root / "state"),
        ssh={"python": sys.executable},
        scheduler={"tick": "0.3s", "stop_grace": "1s"},
        api={"socket": str(root / "ft.sock")},
        probes={"interval": "30s"},
        **({"state": {"url": url}} if url else {}),
    )


def store_of(root: Path, url: str | None = None) -> Path | str:
    return url or root / "state" / STORE_FILE


async def preload(root: Path, names: list[str], url: str | None = None) -> dict[int, str]:
    """Queue jobs straight into the store (no scheduler runs yet): job id -> name."""
    ids = {}
    async with await Store.open(store_of(root, url)) as store, store.jobs_tx("preload") as tx:
        for name in names:
            spec = JobSpec.from_json({"name": name, **JOBS[name][0]})
            job = Job(id=0, name=name, owner="root", uid=0, spec=spec, status=JobStatus.QUEUED, priority="normal",
                      project="default", access="none", submitted=time.time())  # fmt: skip
            ids[await tx.add_job(job)] = name
    return ids


def serve(config: Path, root: Path, points: str | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "FTCONSOLE_FAILPOINTS"}
    if points:
        env["FTCONSOLE_FAILPOINTS"] = points
    with open(root / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ftconsole.cli", "--config", str(config), "serve"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(WAIT)


async def statuses(root: Path) -> dict[int, str] | None:
    """Every job's status through the API, or None while no scheduler answers."""
    try:
        async with await ApiClient.connect(root / "ft.sock") as client:
            return {j["id"]: j["status"] for j in await client.call("jobs")}
    except (TimeoutError, NotRunning, OSError):
        return None


async def settle(config: Path, root: Path, ids: dict[int, str]) -> dict[int, str]:
    """A scheduler without failpoints until every job has ended; their statuses."""
    proc = serve(config, root)
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            seen = await statuses(root)
            if seen is not None and all(seen.get(i) not in (None, "queued", "running") for i in ids):
                return seen
            assert proc.poll() is None, (root / "serve.log").read_text()[-3000:]
            await asyncio.sleep(0.2)
        raise AssertionError(f"jobs did not end: {await statuses(root)}\n{(root / 'serve.log').read_text()[-3000:]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            kill(proc)


async def check_outcomes(
    cluster: SshdCluster, root: Path, ids: dict[int, str], seen: dict[int, str], url: str | None = None
) -> None:
    for job_id, name in ids.items():
        assert seen[job_id] == JOBS[name][1], f"job {job_id} ({name}) ended {seen[job_id]}"
        starts = [line for h in cluster.homes for f in h.glob(f"starts.{job_id}.*") for line in f.read_text().split()]
        assert len(starts) == JOBS[name][2], f"job {job_id} ({name}): ranks started {starts}"  # once per attempt
        for pid in starts:
            assert not pid_alive(int(pid)), f"job {job_id} ({name}): process {pid} still runs"
    async with await Store.open(store_of(root, url)) as store:
        assert [r for r in await store.runs(held=True)] == []


@pytest.mark.parametrize(("layout", "point"), CASES)
async def test_a_crash_at_each_failpoint_loses_nothing_and_runs_nothing_twice(
    sshd_cluster, tmp_path, point, layout
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2, shared_home=layout == "shared-home")
    config = write_config(cluster, tmp_path)
    ids = await preload(tmp_path, list(JOBS))
    crashing = serve(config, tmp_path, f"{point}=crash")
    try:
        crashing.wait(WAIT)
    finally:
        kill(crashing)
    assert crashing.returncode == -signal.SIGKILL, (tmp_path / "serve.log").read_text()[-3000:]
    assert f"failpoint {point}: crash" in (tmp_path / "serve.log").read_text()
    seen = await settle(config, tmp_path, ids)
    await check_outcomes(cluster, tmp_path, ids, seen)


@pytest.mark.parametrize(
    ("seed", "layout", "store"),
    # each store and each layout once (SQLite's own-home crashes are every failpoint's test above)
    [(3, "shared-home", "sqlite"), (2, "own-home", "postgresql")],
)
async def test_random_kills_while_jobs_are_submitted_run_and_end(
    sshd_cluster, tmp_path, seed, layout, store, request: pytest.FixtureRequest
) -> None:
    """kill -9 at random moments (seeded: a failing seed replays) while jobs are queued, placed, started,
    stopped and ending, then a last scheduler that lets everything finish."""
    rng = random.Random(seed)
    url = request.getfixturevalue("pg_server").database() if store == "postgresql" else None
    cluster: SshdCluster = sshd_cluster(2, gpus=2, shared_home=layout == "shared-home")
    config = write_config(cluster, tmp_path, url)
    ids = await preload(tmp_path, list(JOBS), url)
    for _ in range(5):
        proc = serve(config, tmp_path)
        try:
            await asyncio.sleep(rng.uniform(0.3, 2.5))
            if rng.random() < 0.5 and await statuses(tmp_path) is not None:  # a submit while it runs
                name = rng.choice(list(JOBS))
                async with await ApiClient.connect(tmp_path / "ft.sock") as client:
                    submitted = await client.call("submit", spec={"name": name, **JOBS[name][0]})
                ids[submitted["id"]] = name
        finally:
            kill(proc)
    seen = await settle(config, tmp_path, ids)
    await check_outcomes(cluster, tmp_path, ids, seen, url)
