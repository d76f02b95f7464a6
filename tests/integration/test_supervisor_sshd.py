"""The run supervisor on real sshd nodes: detached runs, status in one round trip, stop reaches the group."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ftconsole.scheduler.errors import SSHError
from ftconsole.scheduler.ssh.runs import RunStatus, node_runs, run_states, start_run, stop_runs
from ftconsole.scheduler.ssh.transport import SSHPool

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


async def test_run_outlives_the_ssh_connection(node_pool, tmp_path: Path) -> None:
    cluster, pool, node = node_pool
    await start_run(pool, node, run_dir="~/.ftconsole/runs/j4/0/0", argv=["sh", "-c", "sleep 0.5; echo done"],
                    env={}, workdir="~", python=PY)  # fmt: skip
    pool.forget(node.name)  # drop the connection the run was started over
    final = await wait_state(pool, node, "j4", lambda s: s.finished, "the detached run")
    assert final.succeeded
    assert "done" in (cluster["node01"].home / ".ftconsole/runs/j4/0/0/output.log").read_text()


async def test_a_dead_supervisor_leaves_an_orphan_that_stop_kills_then_the_run_reads_lost(node_pool) -> None:
    _, pool, node = node_pool
    run_dir = "~/.ftconsole/runs/j5/0/0"
    await start_run(pool, node, run_dir=run_dir, argv=["sh", "-c", "sleep 300 & sleep 300"], env={}, workdir="~",
                    token="t5", python=PY)  # fmt: skip
    running = await wait_state(pool, node, "j5", lambda s: s.state == "running", "the run to start")
    assert running.pid is not None and running.pid_start is not None and running.boot_id
    os.kill(running.supervisor_pid, signal.SIGKILL)
    orphaned = await wait_state(pool, node, "j5", lambda s: s.state == "orphaned", "the orphaned state")
    assert group_alive(running.pid)  # the step's processes outlived their supervisor: they hold the GPUs
    (answer,) = await stop_runs(pool, node, [run_dir], tokens={run_dir: "t5"}, python=PY)
    assert answer["signalled"] and not answer["alive"]
    assert not group_alive(running.pid)  # both sleeps are gone, not only the leader
    lost = await wait_state(pool, node, "j5", lambda s: s.finished, "the lost state")
    assert lost.state == "lost" and lost.error is not None and "killed what was left" in lost.error
    assert orphaned.error == "its supervisor died; its processes still run"


async def test_a_recycled_pid_is_not_the_run_and_is_never_signalled(node_pool) -> None:
    """status.json names a live process with another start time (a pid reused after the run died)."""
    cluster, pool, node = node_pool
    run_dir = "~/.ftconsole/runs/j8/0/0"
    await start_run(pool, node, run_dir=run_dir, argv=["true"], env={}, workdir="~", token="t8", python=PY)
    await wait_state(pool, node, "j8", lambda s: s.finished, "the run to end")
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)  # someone else's process
    try:
        path = cluster["node01"].home / ".ftconsole/runs/j8/0/0/status.json"
        doc = json.loads(path.read_text())
        doc.update(state="running", ended=None, supervisor_pid=stranger.pid, pid=stranger.pid, pgid=stranger.pid)
        path.write_text(json.dumps(doc))  # the same pids, but the start times recorded are the run's own
        status = await wait_state(pool, node, "j8", lambda s: s.finished, "the run to read lost")
        assert status.state == "lost"
        for force in (False, True):
            (answer,) = await stop_runs(pool, node, [run_dir], tokens={run_dir: "t8"}, force=force, python=PY)
            assert not answer["signalled"]
        assert stranger.poll() is None  # never signalled
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


async def test_after_a_reboot_the_runs_read_lost(node_pool) -> None:
    cluster, pool, node = node_pool
    run_dir = "~/.ftconsole/runs/j9/0/0"
    await start_run(pool, node, run_dir=run_dir, argv=["sleep", "300"], env={}, workdir="~", token="t9", python=PY)
    running = await wait_state(pool, node, "j9", lambda s: s.state == "running", "the run to start")
    try:
        path = cluster["node01"].home / ".ftconsole/runs/j9/0/0/status.json"
        doc = json.loads(path.read_text())
        path.write_text(json.dumps(dict(doc, boot_id="an-earlier-boot")))  # as after a reboot
        status = await wait_state(pool, node, "j9", lambda s: s.finished, "the lost state")
        assert status.state == "lost" and status.error == "the node rebooted since the run started"
        (answer,) = await stop_runs(pool, node, [run_dir], force=True, python=PY)
        assert not answer["signalled"]  # a process of another boot is never ours to signal
    finally:
        os.killpg(running.pid, signal.SIGKILL)


async def test_a_run_folder_claimed_by_another_token_is_refused_never_adopted(node_pool) -> None:
    cluster, pool, node = node_pool
    run_dir = "~/.ftconsole/runs/j10/1/0"
    started, _ = await start_run(pool, node, run_dir=run_dir, argv=["sh", "-c", "exit 3"], env={}, workdir="~",
                                 token="old", python=PY)  # fmt: skip
    assert started
    await wait_state(pool, node, "j10", lambda s: s.finished, "the first run to end")
    started, status = await start_run(pool, node, run_dir=run_dir, argv=["true"], env={}, workdir="~",
                                      token="new", python=PY)  # fmt: skip
    assert not started and status.state == "refused"
    assert status.error is not None and "claimed by another attempt (token old" in status.error
    (seen,) = (await run_states(pool, node, [run_dir], tokens={run_dir: "new"}, python=PY)).values()
    assert seen.state == "foreign"
    # the same token again is the same run: idempotent, started once
    again, status = await start_run(pool, node, run_dir=run_dir, argv=["true"], env={}, workdir="~",
                                    token="old", python=PY)  # fmt: skip
    assert not again and (status.state, status.exit_code, status.token) == ("exited", 3, "old")
    home = cluster["node01"].home / ".ftconsole/runs/j10/1/0"
    assert (home / "claim").read_text() == "old"
    assert oct((home / "status.json").stat().st_mode & 0o777) == "0o600"


async def test_a_folder_with_a_run_but_no_claim_is_not_taken(node_pool) -> None:
    _, pool, node = node_pool
    run_dir = "~/.ftconsole/runs/j11/1/0"
    await start_run(pool, node, run_dir=run_dir, argv=["true"], env={}, workdir="~", python=PY)  # no token
    await wait_state(pool, node, "j11", lambda s: s.finished, "the run to end")
    started, status = await start_run(pool, node, run_dir=run_dir, argv=["true"], env={}, workdir="~",
                                      token="mine", python=PY)  # fmt: skip
    assert not started and status.state == "refused" and "without a claim" in (status.error or "")


async def test_concurrent_starts_of_one_token_start_it_once(node_pool) -> None:
    cluster, pool, node = node_pool
    run_dir = "~/.ftconsole/runs/j12/1/0"
    argv = ["sh", "-c", 'echo once >> "$HOME/j12.count"']
    results = await asyncio.gather(
        *(start_run(pool, node, run_dir=run_dir, argv=argv, env={}, workdir="~", token="tt", python=PY)
          for _ in range(4))
    )  # fmt: skip
    assert sorted(started for started, _ in results) == [False, False, False, True]
    await wait_state(pool, node, "j12", lambda s: s.finished, "the run to end")
    assert (cluster["node01"].home / "j12.count").read_text() == "once\n"


async def test_missing_executable_fails_with_a_clear_error(node_pool) -> None:
    _, pool, node = node_pool
    await start_run(pool, node, run_dir="~/.ftconsole/runs/j6/0/0", argv=["no-such-program", "x"],
                                env={}, workdir="~", python=PY)  # fmt: skip
    final = await wait_state(pool, node, "j6", lambda s: s.finished, "the failure")
    assert final.state == "failed" and final.error is not None and "no-such-program" in final.error


async def test_files_cannot_escape_the_run_folder(node_pool) -> None:
    from ftconsole.scheduler.ssh.runs import SupervisorError

    _, pool, node = node_pool
    with pytest.raises(SupervisorError, match="outside the run folder"):
        await start_run(pool, node, run_dir="~/.ftconsole/runs/j7/0/0", argv=["true"], env={}, workdir="~",
                        files={"../../../evil": b"x"}, python=PY)  # fmt: skip
    with pytest.raises(SupervisorError, match="outside the run folder"):  # the attempt's hook folder only
        await start_run(pool, node, run_dir="~/.ftconsole/runs/j7/0/0", argv=["true"], env={}, workdir="~",
                        files={"../other/sitecustomize.py": b"x"}, python=PY)  # fmt: skip
    assert isinstance(SupervisorError("x"), Exception) and not issubclass(SupervisorError, SSHError)
    cluster, _, _ = node_pool
    await start_run(pool, node, run_dir="~/.ftconsole/runs/j7/1/0", argv=["true"], env={}, workdir="~",
                    files={"../torch-hook/sitecustomize.py": b"# hook"}, python=PY)  # fmt: skip
    assert (cluster["node01"].home / ".ftconsole/runs/j7/1/torch-hook/sitecustomize.py").read_bytes() == b"# hook"
