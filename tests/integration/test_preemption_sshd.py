"""Preemption end to end on real sshd nodes: an urgent job that cannot start otherwise preempts the preemptible
normal job (never the other one): the victim gets its checkpoint signal, writes its checkpoint, is stopped after
its grace period and queued again at the front with attempt result `preempted`; the urgent job runs; the victim
then resumes from its checkpoint, no retry spent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_recovery_sshd import CHECKPOINTS, attempts_of
from tests.integration.test_scheduler_sshd import finished, job, log_of, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def test_an_urgent_job_preempts_the_preemptible_one_which_resumes_from_its_checkpoint(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"preempt_min_runtime": "0s"})
    output = tmp_path / "out"
    async with running(loaded) as (_, client):
        keeper = (await client.call("submit", spec=job("keeper", "sleep 120")))["id"]
        ft = {"checkpoint_resume": {"max_resumes": 0, "grace_period": "3s"}}  # no resume: preemptions spend none
        spec = job("victim", CHECKPOINTS, preemptible=True, output=str(output), fault_tolerance=ft)
        victim = (await client.call("submit", spec=spec))["id"]
        for job_id in (keeper, victim):
            await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["started"], "both running")
        shown = await client.call("show", job=victim)
        node = shown["attempts"][0]["runs"][0]["node"]

        urgent = (await client.call("submit", spec=job("urgent", "echo ran", priority="urgent")))["id"]
        waiting = await until(client, urgent, lambda j: "preempting" in (j["message"] or ""), "its note")
        assert f"; preempting job {victim} (normal, 1 GPUs)" in waiting["message"], waiting["message"]
        done_urgent = await finished(client, urgent)
        done_victim = await finished(client, victim)
        still = await client.call("show", job=keeper)
        await client.call("stop", jobs=[keeper])
        await finished(client, keeper)
        first_log = await log_of(client, victim, attempt=1)
        second_log = await log_of(client, victim, attempt=2)
        victim_events = await client.call("events", job=victim)
        urgent_events = await client.call("events", job=urgent)
        cluster = await client.call("cluster")

    assert done_urgent["status"] == "succeeded"
    assert [(r["node"]) for r in done_urgent["attempts"][0]["runs"]] == [node]
    assert done_victim["status"] == "succeeded", done_victim["message"]
    assert attempts_of(done_victim) == [(1, "preempted", [node]), (2, "succeeded", [node])]
    first, second = done_victim["attempts"]
    assert first["ended"] <= done_urgent["attempts"][0]["started"] <= second["started"]  # it went first, then back
    assert "saved" in first_log and "resumed from step-42" in second_log
    assert (output / "checkpoints" / "ckpt").read_text() == "step-42\n"
    # its goodput: only the time after its checkpoint was redone (the grace period, and the stop), and the time
    # it stood still while the urgent job ran is lost too
    good = done_victim["goodput"]
    assert 0 < good["rework_gpu_hours"] * 3600 <= 3 + 5 and good["downtime_gpu_hours"] > 0, good
    assert 0 < good["goodput"] < 1 and good["text"].startswith(f"{good['goodput']:.1%} (useful "), good
    assert 0 < cluster["goodput"]["goodput"] < 1 and cluster["goodput"]["lost_gpu_hours"] >= 0, cluster["goodput"]
    # the job that is not preemptible was never touched
    assert [a["result"] for a in still["attempts"]] == [None] and still["status"] == "running"

    stopping = [e["message"] for e in victim_events if e["kind"] == "Stopping"]
    assert len(stopping) == 1 and stopping[0].startswith(f"preempted by job {urgent} (urgent): SIGUSR1 to every ")
    assert "queued again at the front" in stopping[0] and "no retry spent" in stopping[0]
    assert any(e["kind"] == "Checkpoint" and e["message"] == "SIGUSR1 sent to 1 of 1 rank(s)" for e in victim_events)
    restarting = [e["message"] for e in victim_events if e["kind"] == "Restarting"]
    assert restarting == [
        f"attempt 1 preempted by job {urgent} (urgent); queued again at the front (a preemption spends no retry)"
    ]
    (preempting,) = [e["message"] for e in urgent_events if e["kind"] == "Preempting"]
    assert preempting.startswith(f"preempting job {victim} (") and "1 GPUs) to start: " in preempting
