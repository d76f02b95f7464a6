"""The run supervisor on real sshd nodes: detached runs, status in one round trip, stop reaches the group."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from scheduler.config import load_config
from scheduler.errors import SSHError
from scheduler.runs import RunStatus, node_runs, start_run, stop_runs
from scheduler.ssh import SSHPool
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd
PY = sys.executable


async def wait_state(pool: SSHPool, node, job: str, predicate, what: str, attempts: int = 200) -> RunStatus:
    for _ in range(attempts):
        runs = {r.job: r.status for r in await node_runs(pool, node, python=PY)}
        if job in runs and predicate(runs[job]):
            return runs[job]
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {runs}")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies still count for killpg; look at the states
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[2]) == pgid and stat[0] != "Z":
                return True
    return False


@pytest.fixture
async def node_pool(sshd_cluster, tmp_path: Path):
    cluster: SshdCluster = sshd_cluster(1)
    loaded = load_config(cluster.write_config(tmp_path / "cluster.yaml"))
    pool = SSHPool.from_config(loaded)
    try:
        yield cluster, pool, loaded.cluster.node_list()[0]
    finally:
        await pool.close()


async def test_run_writes_env_files_output_and_exit_code(node_pool) -> None:
    cluster, pool, node = node_pool
    started, status = await start_run(
        pool,
        node,
        run_dir="~/.ftconsole/runs/j1/0/0",
        argv=["sh", "-c", 'echo "var=$MY_VAR home=$HOME"; cat "$FT_HOSTFILE"; exit 3'],
        env={"MY_VAR": "it's a $(value)", "FT_HOSTFILE": "hostfile"},
        workdir="~/.ftconsole/runs/j1/0/0",
        files={"hostfile": b"node01 slots=8\n"},
        python=PY,
    )
    assert started and status.state in ("running", "exited")
    final = await wait_state(pool, node, "j1", lambda s: s.finished, "the run to end")
    assert final.state == "exited" and final.exit_code == 3 and final.signal is None and not final.succeeded
    run_dir = cluster["node01"].home / ".ftconsole/runs/j1/0/0"
    output = (run_dir / "output.log").read_text()
    assert f"var=it's a $(value) home={cluster['node01'].home}" in output and "node01 slots=8" in output
    assert (run_dir / "argv.json").exists() and (run_dir / "env.json").exists()

    again, status = await start_run(pool, node, run_dir="~/.ftconsole/runs/j1/0/0", argv=["true"], env={},
                                    workdir="~", python=PY)  # fmt: skip
    assert not again and status.exit_code == 3  # an existing run is never started twice


async def test_stop_reaches_the_whole_process_group(node_pool) -> None:
    _, pool, node = node_pool
    argv = ["sh", "-c", "sleep 300 & sleep 300 & wait"]
    await start_run(pool, node, run_dir="~/.ftconsole/runs/j2/0/0", argv=argv, env={}, workdir="~", python=PY)
    running = await wait_state(pool, node, "j2", lambda s: s.state == "running", "the run to start")
    assert running.pid is not None and group_alive(running.pid)
    (result,) = await stop_runs(pool, node, ["~/.ftconsole/runs/j2/0/0"], python=PY)
    assert result["signalled"]
    final = await wait_state(pool, node, "j2", lambda s: s.finished, "the stop")
    assert final.signal == "SIGTERM" and final.stop_requested is not None
    assert not group_alive(running.pid)


async def test_stop_escalates_to_sigkill_after_the_grace_period(node_pool) -> None:
    _, pool, node = node_pool
    argv = ["sh", "-c", "trap '' TERM; sleep 300"]
    await start_run(
        pool, node, run_dir="~/.ftconsole/runs/j3/0/0", argv=argv, env={}, workdir="~", grace=0.5, python=PY
    )
    running = await wait_state(pool, node, "j3", lambda s: s.state == "running", "the run to start")
    await stop_runs(pool, node, ["~/.ftconsole/runs/j3/0/0"], python=PY)
    final = await wait_state(pool, node, "j3", lambda s: s.finished, "the kill")
    assert final.signal == "SIGKILL"
    assert running.pid is not None and not group_alive(running.pid)


async def test_run_outlives_the_ssh_connection_and_a_dead_supervisor_reads_lost(node_pool, tmp_path: Path) -> None:
    cluster, pool, node = node_pool
    await start_run(pool, node, run_dir="~/.ftconsole/runs/j4/0/0", argv=["sh", "-c", "sleep 0.5; echo done"],
                    env={}, workdir="~", python=PY)  # fmt: skip
    pool.forget(node.name)  # drop the connection the run was started over
    final = await wait_state(pool, node, "j4", lambda s: s.finished, "the detached run")
    assert final.succeeded
    assert "done" in (cluster["node01"].home / ".ftconsole/runs/j4/0/0/output.log").read_text()

    await start_run(pool, node, run_dir="~/.ftconsole/runs/j5/0/0", argv=["sleep", "300"], env={}, workdir="~",
                    python=PY)  # fmt: skip
    running = await wait_state(pool, node, "j5", lambda s: s.state == "running", "the run to start")
    import json

    supervisor = json.loads((cluster["node01"].home / ".ftconsole/runs/j5/0/0/status.json").read_text())[
        "supervisor_pid"
    ]
    os.kill(supervisor, signal.SIGKILL)
    lost = await wait_state(pool, node, "j5", lambda s: s.state == "lost", "the lost state")
    assert lost.ended is None
    assert running.pid is not None
    os.killpg(running.pid, signal.SIGKILL)  # clean up what the dead supervisor left


async def test_missing_executable_fails_with_a_clear_error(node_pool) -> None:
    _, pool, node = node_pool
    await start_run(pool, node, run_dir="~/.ftconsole/runs/j6/0/0", argv=["no-such-program", "x"],
                                env={}, workdir="~", python=PY)  # fmt: skip
    final = await wait_state(pool, node, "j6", lambda s: s.finished, "the failure")
    assert final.state == "failed" and final.error is not None and "no-such-program" in final.error


async def test_files_cannot_escape_the_run_folder(node_pool) -> None:
    from scheduler.runs import SupervisorError

    _, pool, node = node_pool
    with pytest.raises(SupervisorError, match="outside the run folder"):
        await start_run(pool, node, run_dir="~/.ftconsole/runs/j7/0/0", argv=["true"], env={}, workdir="~",
                        files={"../../../evil": b"x"}, python=PY)  # fmt: skip
    assert isinstance(SupervisorError("x"), Exception) and not issubclass(SupervisorError, SSHError)
