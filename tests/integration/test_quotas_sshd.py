"""Quotas end to end on a real sshd node (two GPUs): a job past its project's GPU quota waits, saying so, and
holds no other project's job back; it starts once the quota frees. A submit past a queued quota is refused.
`usage` shows each project's limits and what it uses."""

from __future__ import annotations

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_scheduler_sshd import finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def test_a_job_over_its_projects_quota_waits_and_starts_when_it_frees(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    quotas = {"projects": {"vision": {"gpus": 1, "queued_jobs": 1}}}
    loaded = write_config(cluster, tmp_path, sock_dir, quotas=quotas)
    async with running(loaded) as (_, client):
        first = await client.call("submit", spec=job("first", "sleep 3", project="vision"))
        await until(client, first["id"], lambda j: j["status"] == "running", "the first to run")
        second = await client.call("submit", spec=job("second", "true", project="vision"))
        told = await until(client, second["id"], lambda j: "quota" in (j["message"] or ""), "its note")
        assert told["status"] == "queued"
        assert told["message"] == "waiting: project vision is at its quota of 1 GPU (1 in use)"
        with pytest.raises(UsageError, match="job third refused: project vision is at its quota of 1 queued job"):
            await client.call("submit", spec=job("third", "true", project="vision"))
        predicted = await client.call("predict", spec=job("asked", "true", project="vision"))
        assert predicted["cause"] == "quota" and "at its quota of 1 GPU" in predicted["reason"], predicted
        other = await client.call("submit", spec=job("other", "true", project="speech"))  # the free GPU is its
        assert (await finished(client, other["id"]))["status"] == "succeeded"
        shown = await client.call("usage", since=0.0, by="project")
        assert shown["quotas"]["vision"]["limits"] == {"gpus": 1, "queued_jobs": 1}
        assert shown["quotas"]["vision"]["in_use"]["gpus"] == 1 and "speech" not in shown["quotas"]
        done_first = await finished(client, first["id"])
        done_second = await finished(client, second["id"])
    assert done_second["status"] == "succeeded" and done_second["started"] >= done_first["ended"]
