"""Fault tolerance on real sshd nodes with real processes (seed 000's scenarios 3 and 4, node failure, the
exit-code policy): what is checked is what happened: the attempts and the nodes they ran on, the node states,
the events, and which processes are left on the nodes.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import StopReason
from ftconsole.scheduler.errors import NotRunning
from ftconsole.scheduler.loop import request_stop
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.store.db import STORE_FILE, Store
from tests.integration.test_crash_sshd import kill, serve
from tests.integration.test_scheduler_sshd import finished, job, log_of, running, until, write_config
from tests.sshd_cluster import HOME_LAYOUTS, SshdCluster, gpu_data

# succeeds from its second attempt on; before, waits for $HOME/fail (one node's home) and exits 1
FAILS_ONCE = (
    'sh -c \'if [ "$FT_ATTEMPT" -ge 2 ]; then echo attempt $FT_ATTEMPT ok; exit 0; fi; '
    "echo attempt $FT_ATTEMPT on $(basename $(dirname $HOME)); "
    'while [ ! -e "$HOME/fail" ]; do sleep 0.1; done; exit 1\''
)


def attempts_of(shown: dict[str, Any]) -> list[tuple[int, str | None, list[str]]]:
    return [(a["number"], a["result"], [r["node"] for r in a["runs"]]) for a in shown["attempts"]]


def restarting(shown: dict[str, Any]) -> list[str]:
    return [c["message"] for c in shown["conditions"] if c["type"] == "Restarting"]


async def test_a_gpu_fault_during_a_run_requeues_the_job_on_a_healthy_node_and_isolates_the_faulty_one(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Scenario 3: the GPU reports an uncorrectable ECC error and the process exits non-zero."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        spec = job("ecc", FAILS_ONCE, fault_tolerance={"retries": 1})
        submitted = await client.call("submit", spec=spec)
        shown = await until(client, submitted["id"], lambda j: j["node_names"], "placed")
        (first,) = shown["node_names"]
        other = "node02" if first == "node01" else "node01"
        await until(client, submitted["id"], lambda j: j["attempts"][0]["runs"][0]["pid"], "running")
        cluster.set_gpus(first, gpu_data(1, ecc_uncorrectable=2))
        (cluster.node(first).home / "fail").touch()
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert attempts_of(shown) == [(1, "requeued", [first]), (2, "succeeded", [other])]
        (why,) = restarting(shown)
        assert f"attempt 1 failed: hardware fault: {first} unhealthy" in why and "ecc" in why.lower()
        assert f"isolated {first}; queued again at the front (resubmit 1 of 1)" in why
        assert "attempt 2 ok" in await log_of(client, submitted["id"])
        nodes = {n["name"]: n for n in await client.call("nodes")}
        assert (
            nodes[first]["state"] == "isolated" and f"job {submitted['id']} attempt 1" in nodes[first]["admin_reason"]
        )
        assert nodes[other]["state"] == "healthy"


async def test_a_failure_on_healthy_hardware_ends_the_job_after_one_attempt(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Scenario 4: the checks run again on the job's node after the exit, find it healthy: error, no resubmit."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        spec = job("buggy", "sh -c 'sleep 0.5; exit 3'", fault_tolerance={"retries": 2})
        shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        assert shown["status"] == "error" and shown["exit_code"] == 3
        assert attempts_of(shown) == [(1, "error", ["node01"])]
        assert restarting(shown) == []
        (node,) = await client.call("nodes")
        assert node["state"] == "healthy"
        assert node["last_probe"] >= shown["attempts"][0]["runs"][0]["ended"]  # probed again after the exit


@pytest.mark.parametrize("layout", HOME_LAYOUTS)
async def test_a_dead_node_sends_its_job_elsewhere_and_with_retries_used_up_it_ends_error_exiting(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, layout: str
) -> None:
    cluster: SshdCluster = sshd_cluster(3, gpus=1, shared_home=layout == "shared-home")
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"node_timeout": "2s"})
    async with running(loaded) as (_, client):
        spec = job("survivor", "sleep 300", fault_tolerance={"retries": 1})
        submitted = await client.call("submit", spec=spec)
        job_id = submitted["id"]
        shown = await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "running")
        first = shown["attempts"][0]["runs"][0]["node"]
        cluster.down(first)  # sshd and every process of the node killed: the machine is gone
        shown = await until(
            client, job_id, lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["runs"][0]["pid"], "attempt 2"
        )
        second = shown["attempts"][1]["runs"][0]["node"]
        assert second != first and shown["status"] == "running"
        (why,) = restarting(shown)
        assert f"hardware fault: rank 0 on {first} lost: node unreachable since" in why
        assert ": down or " in why and "hung" not in why  # told apart from a hung node (below)
        assert (await client.call("nodes", nodeset=first))[0]["state"] == "isolated"

        cluster.down(second)  # the second node dies too: the one resubmit is used up
        shown = await finished(client, job_id)
        assert shown["status"] == "error"
        assert shown["message"].startswith(f"error,exiting: hardware fault: rank 0 on {second} lost")
        assert "(resubmitted 1 of 1 times)" in shown["message"]
        assert [a["result"] for a in shown["attempts"]] == ["requeued", "error"]


async def test_a_hung_node_is_told_apart_from_a_dead_one_and_its_job_runs_elsewhere(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """SIGSTOP of the node's sshd and of every process of it (the machine froze): the kernel still takes TCP
    connections, nothing answers. The job runs again elsewhere; the events say the node hung, not died."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"node_timeout": "3s"})
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=job("frozen", "sleep 300", fault_tolerance={"retries": 1})))["id"]
        shown = await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "running")
        first = shown["attempts"][0]["runs"][0]["node"]
        cluster.hang(first, sessions=True)
        try:
            shown = await until(
                client, job_id, lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["runs"][0]["pid"], "attempt 2"
            )
            assert shown["attempts"][1]["runs"][0]["node"] != first
            (why,) = restarting(shown)
            assert f"rank 0 on {first} lost: node unreachable since" in why
            # hung, never down: a fresh connection's knock found the port taking TCP and SSH silent, or the node's
            # command timed out on a connection that stays open (whichever the node's give-up came after)
            assert ": hung: " in why and "down" not in why, why
            assert "takes TCP connections, SSH does not answer" in why or "takes connections but does not answer" in why
            assert (await client.call("nodes", nodeset=first))[0]["state"] == "isolated"
        finally:
            cluster.unhang(first)
        await client.call("stop", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "stopped"


async def test_exit_code_policy_restarts_137_in_place_until_max_restarts_and_never_exit_1(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        oom = job("oom", "sh -c 'echo try $FT_ATTEMPT; exit 137'", fault_tolerance={"max_restarts": 2})
        user_bug = job("bug", "sh -c 'exit 1'", fault_tolerance={"max_restarts": 2})
        first = (await client.call("submit", spec=oom))["id"]
        second = (await client.call("submit", spec=user_bug))["id"]
        shown = await finished(client, first)
        assert shown["status"] == "error"
        assert [a["result"] for a in shown["attempts"]] == ["restarted", "restarted", "error"]
        assert len({r["node"] for a in shown["attempts"] for r in a["runs"]}) == 1  # in place: the same node
        assert shown["message"].startswith("error,exiting: rank 0 on")
        assert "exited with code 137 (restarted in place 2 of 2 times)" in shown["message"]
        assert len(restarting(shown)) == 2
        assert "try 3" in await log_of(client, first, attempt=3)
        shown = await finished(client, second)
        assert shown["status"] == "error" and [a["result"] for a in shown["attempts"]] == ["error"]


async def test_restarts_wait_for_their_backoff_and_a_requeued_job_gives_up_after_queue_timeout(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"node_timeout": "2s", "queue_timeout": "3s"})
    async with running(loaded) as (_, client):
        spec = job("patient", "sh -c 'exit 137'", gpus_per_node=1,
                   fault_tolerance={"max_restarts": 2, "restart_backoff": "1s"})  # fmt: skip
        shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        assert [a["result"] for a in shown["attempts"]] == ["restarted", "restarted", "error"]
        ended = [a["runs"][0]["ended"] for a in shown["attempts"]]
        created = [a["created"] for a in shown["attempts"]]
        assert created[1] - ended[0] >= 1.0 and created[2] - ended[1] >= 2.0  # 1 s, then doubled

        # the only node dies under a job with a retry: queued again, no healthy node, gives up after 3 s
        spec = job("stranded", "sleep 300", gpus_per_node=1, fault_tolerance={"retries": 1})
        job_id = (await client.call("submit", spec=spec))["id"]
        await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "running")
        cluster.down("node01")
        shown = await until(client, job_id, lambda j: j["status"] == "queued", "requeued")
        assert "isolated node01; queued again at the front (resubmit 1 of 1)" in restarting(shown)[0]
        shown = await finished(client, job_id)
        assert shown["status"] == "error"
        assert shown["message"].startswith("error,exiting: queued again after a hardware fault and waited")
        assert "(scheduler.queue_timeout 3s): the pool is short of capacity" in shown["message"]
        assert [a["result"] for a in shown["attempts"]] == ["requeued"]


def _no_gpus(cluster: SshdCluster) -> None:
    cluster.set_gpus("node01", gpu_data(0))


@pytest.mark.parametrize("fault", ["cache", "gpu-check"])
async def test_a_pre_flight_failure_isolates_the_node_and_the_job_starts_on_a_spare(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, fault: str
) -> None:
    """Scenario 2 with a spare: node01 was healthy at its last probe and fails the pre-flight right before the
    job's start: isolated, and the job runs on the two other nodes."""
    cluster: SshdCluster = sshd_cluster(3, gpus=1)
    thresholds = {"gpus_expected": 1} if fault == "gpu-check" else {}
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h", "thresholds": thresholds})
    cache = cluster.node("node01").home / "cache"
    async with running(loaded) as (_, client):
        await until_nodes(client, lambda ns: all(n["state"] == "healthy" for n in ns), "the first probe sweep")
        if fault == "cache":  # the cache file system of node01 fills up: 1 MiB, under the 1 GB threshold
            cache.mkdir(exist_ok=True)
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cache)], check=False)
            if mounted.returncode != 0:
                pytest.skip("cannot mount a small file system here (needs root and CAP_SYS_ADMIN)")
        else:
            _no_gpus(cluster)
        try:
            spec = job("gated", "sh -c 'echo rank $RANK ok'", mode="pytorch", nodes=2, fault_tolerance={"retries": 1})
            shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        finally:
            if fault == "cache":
                subprocess.run(["umount", str(cache)], check=False)
        assert shown["status"] == "succeeded", shown["message"]
        assert attempts_of(shown) == [(1, "requeued", ["node01", "node02"]), (2, "succeeded", ["node02", "node03"])]
        assert [r["state"] for r in shown["attempts"][0]["runs"]] == ["cancelled", "cancelled"]  # never started
        item = "item disk-size cache: fail" if fault == "cache" else "item gpu-check: fail 0 1"
        events = await client.call("events", job=shown["id"])
        assert any(e["kind"] == "Preflight" and e["node"] == "node01" and item in e["message"] for e in events)
        assert any(e["message"].startswith("item gpu-check: pass") and e["node"] == "node02" for e in events)
        (why,) = restarting(shown)
        assert why.startswith("attempt 1 failed: pre-flight failed: node01 item") and "isolated node01" in why
        assert (await client.call("nodes", nodeset="node01"))[0]["state"] == "isolated"


async def until_nodes(client: Any, done: Any, what: str) -> list[dict[str, Any]]:
    for _ in range(300):
        nodes = await client.call("nodes")
        if done(nodes):
            return list(nodes)
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {nodes}")


CHECKPOINTS = (
    "sh -c 'echo resume=$FT_RESUME count=$FT_RESTART_COUNT; "
    'if [ "$FT_RESUME" = 1 ]; then echo "resumed from $(cat $FT_CHECKPOINT_DIR/ckpt)"; exit 0; fi; '
    'trap "echo step-42 > $FT_CHECKPOINT_DIR/ckpt; echo saved" USR1; while true; do sleep 0.1; done\''
)


async def test_checkpoint_resume_signals_the_job_then_resumes_it_elsewhere_from_its_checkpoint(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Seed 003: a GPU fault under a running job: SIGUSR1, grace period, stop, requeue; the next attempt sees
    FT_RESUME=1 and the checkpoint the first one wrote into FT_CHECKPOINT_DIR."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1s"})
    output = tmp_path / "out"
    async with running(loaded) as (_, client):
        spec = job("resumable", CHECKPOINTS, output=str(output),
                   fault_tolerance={"checkpoint_resume": {"max_resumes": 1, "grace_period": "3s"}})  # fmt: skip
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["started"], "running")
        first = shown["attempts"][0]["runs"][0]["node"]
        cluster.set_gpus(first, gpu_data(1, ecc_uncorrectable=1))
        shown = await finished(client, job_id)
        assert shown["status"] == "succeeded", shown["message"]
        other = "node02" if first == "node01" else "node01"
        assert attempts_of(shown) == [(1, "requeued", [first]), (2, "succeeded", [other])]
        assert "saved" in await log_of(client, job_id, attempt=1)
        second = await log_of(client, job_id, attempt=2)
        assert "resume=1 count=1" in second and "resumed from step-42" in second
        assert (output / "checkpoints" / "ckpt").read_text() == "step-42\n"
        events = await client.call("events", job=job_id)
        # the signal went to the rank left alone, not the failed one
        assert any(e["kind"] == "Checkpoint" and e["message"] == "SIGUSR1 sent to 1 of 1 rank(s)" for e in events)
        stopping = [e["message"] for e in events if e["kind"] == "Stopping"]
        assert stopping and "SIGUSR1 to every rank to save a checkpoint, stopped after grace_period 3s" in stopping[0]
        assert (await client.call("nodes", nodeset=first))[0]["state"] == "isolated"


async def test_an_elastic_job_goes_on_at_once_on_the_nodes_left_when_one_dies(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(3, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"node_timeout": "2s"})
    async with running(loaded) as (_, client):
        spec = job("stretchy", "sleep 300", mode="pytorch", nodes=3, fault_tolerance={"elastic": {"min_nodes": 2}})
        job_id = (await client.call("submit", spec=spec))["id"]
        await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["started"], "running")
        cluster.down("node02")
        shown = await until(
            client, job_id, lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["started"], "attempt 2 running"
        )
        assert attempts_of(shown) == [(1, "shrunk", ["node01", "node02", "node03"]), (2, None, ["node01", "node03"])]
        assert shown["status"] == "running" and shown["nodes"] == 3  # still asks for 3: grows back when free
        # it waits to grow back: node02, the only node that could, is isolated
        shown = await until(client, job_id, lambda j: j["message"].startswith("scale out 2 -> 3 waits"), "the note")
        assert "among node02; only 0 usable nodes can hold it" in shown["message"]
        (why,) = restarting(shown)
        assert "hardware fault: rank 1 on node02 lost" in why and "isolated node02; elastic: going on" in why
        assert (await client.call("nodes", nodeset="node02"))[0]["state"] == "isolated"
        await client.call("stop", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "stopped"


async def test_strategies_are_tried_in_order_in_place_then_a_new_placement(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Seed 002: `strategies: [recover-in-place, recover]`: a 137 exit restarts in place while max_restarts
    allow, then the job is placed anew (retries), nothing isolated: the hardware is healthy."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    command = "sh -c 'echo attempt $FT_ATTEMPT; if [ $FT_ATTEMPT -le 2 ]; then exit 137; fi'"
    async with running(loaded) as (_, client):
        ft = {"strategies": ["recover-in-place", "recover"], "max_restarts": 1, "retries": 1}
        job_id = (await client.call("submit", spec=job("ordered", command, fault_tolerance=ft)))["id"]
        shown = await finished(client, job_id)
        assert shown["status"] == "succeeded", shown["message"]
        assert [(n, result) for n, result, _ in attempts_of(shown)] == [(1, "restarted"), (2, "requeued"),
                                                                        (3, "succeeded")]  # fmt: skip
        first = attempts_of(shown)[0][2]
        assert attempts_of(shown)[1][2] == first  # in place: the same node
        why = restarting(shown)
        assert "attempt 2 on" in why[0] and "(restart 1 of 1)" in why[0]
        assert "queued again at the front (resubmit 1 of 1)" in why[1] and "isolated" not in why[1]
        assert {n["state"] for n in await client.call("nodes")} == {"healthy"}


DUMPS = (
    "sh -c 'if [ $RANK = 1 ]; then sleep 1; exit 3; fi; "
    'trap "echo step-7 > $FT_CHECKPOINT_DIR/ckpt; echo saved" USR1; while true; do sleep 0.1; done\''
)


async def test_dump_signals_the_ranks_left_to_save_a_checkpoint_before_a_failed_job_stops(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Seed 002's `dump`: a rank fails on healthy hardware; the rank still running gets SIGUSR1 and its grace
    period, writes its checkpoint, and only then is stopped; the job ends error (no strategy restarts exit 3)."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    output = tmp_path / "out"
    async with running(loaded) as (_, client):
        ft = {"strategies": ["dump", "exit"], "checkpoint_resume": {"max_resumes": 0, "grace_period": "2s"}}
        spec = job("dumps", DUMPS, mode="pytorch", nodes=2, output=str(output), fault_tolerance=ft)
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await finished(client, job_id)
        assert shown["status"] == "error" and "rank 1" in shown["message"]
        assert [result for _, result, _ in attempts_of(shown)] == ["error"]
        assert "saved" in await log_of(client, job_id, rank=0)
        assert (output / "checkpoints" / "ckpt").read_text() == "step-7\n"
        events = await client.call("events", job=job_id)
        stopping = [e["message"] for e in events if e["kind"] == "Stopping"]
        assert stopping and "dump: SIGUSR1 to the other ranks to save a checkpoint" in stopping[0]
        # the signal went to the rank left alone, not the failed one
        assert any(e["kind"] == "Checkpoint" and e["message"] == "SIGUSR1 sent to 1 of 1 rank(s)" for e in events)


# takes SIGUSR1 (the checkpoint signal) by writing one line per signal to its node's home, then ends 0; its
# second attempt (FT_RESUME=1) ends at once
SIGNALLED = (
    'sh -c \'if [ "$FT_RESUME" = 1 ]; then echo resumed; exit 0; fi; '
    'trap "echo USR1 >> $HOME/signals.$FT_JOB_ID; exit 0" USR1; while true; do sleep 0.1; done\''
)


async def api(sock: Path, proc: subprocess.Popen[bytes], log: Path) -> ApiClient:
    """A client of the scheduler `proc` once it answers on `sock`."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await ApiClient.connect(sock)
        except (NotRunning, OSError, TimeoutError):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.2)


async def test_a_scheduler_killed_between_the_checkpoint_decision_and_its_signal_the_next_one_sends_it(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """A GPU fault under a checkpoint_resume job: the decision (stop to reschedule, the signal owed to its rank)
    is written, and `serve` is killed (-9) before the signal goes out (failpoint checkpoint.before_signal). The
    next `serve` sends it: the rank's trap records it (once: at least once, and nothing had gone out before the
    kill), and the job resumes elsewhere."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    sock, log = sock_dir / "ft.sock", tmp_path / "serve.log"
    config = cluster.write_config(
        tmp_path / "cluster.yaml", state_dir=str(tmp_path / "state"), ssh={"python": sys.executable},
        scheduler={"tick": "0.3s", "stop_grace": "1s"}, api={"socket": str(sock)}, probes={"interval": "1s"},
    )  # fmt: skip
    crashing = serve(config, tmp_path, "checkpoint.before_signal=crash")
    try:
        async with await api(sock, crashing, log) as client:
            ft = {"checkpoint_resume": {"max_resumes": 1, "grace_period": "60s"}}
            job_id = (await client.call("submit", spec=job("ckpt", SIGNALLED, fault_tolerance=ft)))["id"]
            shown = await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["started"], "running")
            first = shown["attempts"][0]["runs"][0]["node"]
            cluster.set_gpus(first, gpu_data(1, ecc_uncorrectable=1))
            await asyncio.get_running_loop().run_in_executor(None, crashing.wait, 60)
    finally:
        kill(crashing)
    assert crashing.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    assert "failpoint checkpoint.before_signal: crash" in log.read_text()
    signals = cluster.node(first).home / f"signals.{job_id}"
    assert not signals.exists()  # the decision is written, the signal never went out
    async with await Store.open(tmp_path / "state" / STORE_FILE) as store:
        (owed,) = await store.checkpoint_signals()
        assert (owed.job, owed.attempt, owed.rank, owed.signal, owed.tries) == (job_id, 1, 0, "SIGUSR1", 0)

    again = serve(config, tmp_path)
    try:
        async with await api(sock, again, log) as client:
            shown = await finished(client, job_id)
            events = await client.call("events", job=job_id)
    finally:
        again.send_signal(signal.SIGTERM)
        try:
            again.wait(60)
        except subprocess.TimeoutExpired:
            kill(again)
    assert signals.read_text() == "USR1\n"  # sent by the second scheduler, once
    assert shown["status"] == "succeeded", shown["message"]
    other = "node02" if first == "node01" else "node01"
    assert attempts_of(shown) == [(1, "requeued", [first]), (2, "succeeded", [other])]
    assert any(e["kind"] == "Checkpoint" and e["message"] == "SIGUSR1 sent to 1 of 1 rank(s)" for e in events)
    async with await Store.open(tmp_path / "state" / STORE_FILE) as store:
        assert await store.checkpoint_signals() == []  # nothing owed any more
        (done,) = await store.checkpoint_signals(owed=False)
        assert (done.outcome, done.tries) == ("signalled", 1)


# each rank takes SIGUSR1 by writing one line to its node's home, then ends 0
DUMP_TAKEN = "sh -c 'trap \"echo USR1 >> $HOME/signals.$FT_JOB_ID.$RANK; exit 0\" USR1; while true; do sleep 0.1; done'"


async def test_a_dump_decided_just_before_a_crash_is_signalled_by_the_next_scheduler(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """The loop's decision that a failed attempt's ranks get the checkpoint signal (`dump`) is the job's stop,
    written in the loop's own transaction; a crash right after it left no signal sent and nothing else written.
    The next scheduler owes the signal to every rank still running from that decision alone and sends it."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    ft = {"strategies": ["dump", "exit"], "checkpoint_resume": {"max_resumes": 0, "grace_period": "60s"}}
    async with running(loaded) as (_, client):
        spec = job("dumped", DUMP_TAKEN, mode="pytorch", nodes=2, fault_tolerance=ft)
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["started"], "running")
    # serve stopped (its ranks run on); the store as a crash right after the loop's decision leaves it
    async with await Store.open(loaded.state_dir / STORE_FILE) as store:
        stored = await store.job(job_id)
        assert stored is not None
        async with store.jobs_tx("the loop's decision") as tx:
            why = "rank 1 on a node failed (written by the test)"
            await request_stop(tx, stored, time.time(), StopReason.ERROR, "scheduler", why, message=why)
        assert await store.checkpoint_signals() == []
    async with running(loaded) as (_, client):
        shown = await finished(client, job_id)
        events = await client.call("events", job=job_id)
    for run in shown["attempts"][0]["runs"]:
        taken = cluster.node(run["node"]).home / f"signals.{job_id}.{run['rank']}"
        assert taken.read_text() == "USR1\n", run
    assert any(e["kind"] == "Checkpoint" and e["message"] == "SIGUSR1 sent to 2 of 2 rank(s)" for e in events)
