"""Seeds 001 and 003 from the logs, on real sshd nodes with real processes: ranks at different epochs
(stragglers), an error line in a rank that runs on, and slow iterations; the node scans each output.log for
the job's patterns in the status read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import logwatch
from tests.integration.test_scheduler_sshd import job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

# rank 0 reaches epoch 48, rank 1 epoch 50; then both wait
EPOCHS = (
    'sh -c \'for e in 46 47 48; do echo "Rank:$RANK Epoch:[$e] loss 0.1"; done; '
    'if [ $RANK = 1 ]; then echo "Rank:1 Epoch:[49]"; echo "Rank:1 Epoch:[50]"; fi; exec sleep 300\''
)
BROKEN = (
    'sh -c \'echo step 1; echo "Traceback (most recent call last):"; echo "  RuntimeError: NCCL error"; '
    "exec sleep 300'"
)
SLOW = (
    'sh -c \'for i in 1 2 3 4; do echo "this iteration hardware time is 10.0 and e2e time is 31.5 ms"; done; '
    "exec sleep 300'"
)


def conditions(shown: dict[str, Any], kind: str) -> list[str]:
    return [c["message"] for c in shown["conditions"] if c["type"] == kind]


async def events(client: Any, job_id: int, kind: str) -> list[str]:
    return [e["message"] for e in await client.call("events", job=job_id) if e["kind"] == kind]


@pytest.fixture(autouse=True)
def scan_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logwatch, "SCAN_EVERY_S", 0.5)


async def test_ranks_epochs_apart_an_error_that_runs_on_and_slow_iterations_are_each_reported(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        apart = (await client.call("submit", spec=job("apart", EPOCHS, mode="pytorch", nodes=2,
                                                      progress={"window": "2s"})))["id"]  # fmt: skip
        broken = (await client.call("submit", spec=job("broken", BROKEN, progress={"window": "2s"})))["id"]
        slowed = (await client.call("submit", spec=job("slowed", SLOW, performance={"ratio": 3, "iterations": 4})))[
            "id"
        ]
        shown = await until(client, apart, lambda j: conditions(j, "Straggling"), "the straggler condition")
        (why,) = conditions(shown, "Straggling")
        assert why.startswith("attempt 1 ranks 2 epochs apart: rank 0 at 48; rank 1 at 50, for ")
        assert "(progress.window 2s)" in why
        (event,) = [e for e in await client.call("events", job=apart) if e["kind"] == "Straggling"]
        behind = shown["attempts"][0]["runs"][0]["node"]  # rank 0, at 48: the one that stands out
        assert event["data"] == {"attempt": 1, "alert": "job_straggler", "rank": 0, "node": behind}

        found = await poll(lambda: events(client, broken, "RankError"), bool, "the rank error")
        assert (
            found[0].startswith("attempt 1 rank 0 on node0") and "logged an error and still runs 2s later" in found[0]
        )
        assert found[0].endswith("Traceback (most recent call last):")

        found = await poll(lambda: events(client, slowed, "Slow"), bool, "the slow condition")
        assert "e2e time over 3x the hardware time for 4 iterations in a row (3.15, 3.15, 3.15, 3.15)" in found[0]

        alerts = {(a["kind"], a["job"]): a for a in await client.call("alerts")}
        assert {("job_straggler", apart), ("job_rank_error", broken), ("job_slow", slowed)} <= set(alerts)
        assert alerts[("job_rank_error", broken)]["severity"] == "error"

        await client.call("stop", jobs=[apart, broken, slowed])
        await poll(lambda: client.call("jobs"), lambda js: all(j["status"] == "stopped" for j in js), "the stops")
        # the attempts are over: straggler and slow alerts resolved; the error line stays the operator's
        left = await poll(
            lambda: client.call("alerts"), lambda al: {a["kind"] for a in al} == {"job_rank_error"}, "resolutions"
        )
        assert [a["job"] for a in left] == [broken]


async def test_a_job_whose_ranks_agree_or_that_turns_progress_off_is_never_reported(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    together = "sh -c 'for e in 1 2 3; do echo \"Rank:$RANK Epoch:[$e]\"; done; exec sleep 300'"
    async with running(loaded) as (_, client):
        agree = (await client.call("submit", spec=job("agree", together, mode="pytorch", nodes=2,
                                                      progress={"window": "1s"})))["id"]  # fmt: skip
        off = (await client.call("submit", spec=job("off", EPOCHS, mode="pytorch", nodes=2, progress="off")))["id"]
        await until(client, off, lambda j: j["attempts"] and j["attempts"][0]["started"], "running")
        await poll(lambda: client.call("show", job=agree), lambda j: j["attempts"][0]["started"], "running")
        await asyncio.sleep(4)  # several scans and windows
        for job_id in (agree, off):
            assert conditions(await client.call("show", job=job_id), "Straggling") == []
        assert [a for a in await client.call("alerts") if a["kind"].startswith("job_")] == []
        await client.call("stop", jobs=[agree, off])


# slow in its first attempt, then fast: the reschedule is what makes it well
SLOW_ONCE = (
    'sh -c \'if [ "$FT_ATTEMPT" = 1 ]; then e2e=31.5; else e2e=10.5; fi; '
    'for i in 1 2 3 4; do echo "this iteration hardware time is 10.0 and e2e time is $e2e ms"; done; '
    "exec sleep 300'"
)


async def test_a_slow_job_with_action_reschedule_runs_again_without_its_slow_node(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    perf = {"ratio": 3, "iterations": 4, "action": "reschedule"}
    async with running(loaded) as (_, client):
        slowed = (await client.call("submit", spec=job("slowed", SLOW_ONCE, performance=perf,
                                                       fault_tolerance={"retries": 1})))["id"]  # fmt: skip
        shown = await until(client, slowed, lambda j: j["attempt"] == 2 and j["status"] == "running", "attempt 2")
        first, second = shown["attempts"]
        (slow_node,) = {r["node"] for r in first["runs"]}
        assert first["result"] == "requeued" and first["message"].startswith(f"slow: rank 0 on {slow_node}: ")
        assert shown["excluded"] == [slow_node]
        assert {r["node"] for r in second["runs"]} == {"node01", "node02"} - {slow_node}
        (stopping,) = [c["message"] for c in shown["conditions"] if c["type"] == "Stopping"]
        assert stopping.endswith(f"then queued again without {slow_node} (resubmit 1 of 1; performance.action)")
        (slow_event,) = await events(client, slowed, "Slow")
        assert slow_event.endswith(f"; rescheduled without {slow_node} (resubmit 1 of 1)"), slow_event
        await asyncio.sleep(2)  # several scans of the second attempt: its iterations are within the ratio
        again = await client.call("show", job=slowed)
        assert again["attempt"] == 2 and again["status"] == "running" and len(await events(client, slowed, "Slow")) == 1
        await client.call("stop", jobs=[slowed])
        await poll(lambda: client.call("show", job=slowed), lambda j: j["status"] == "stopped", "the stop")
