"""Quotas end to end on a real sshd node (two GPUs): a job past its project's GPU quota waits, saying so, and
holds no other project's job back; it starts once the quota frees. A submit past a queued quota is refused.
`usage` shows each project's limits and what it uses."""

from __future__ import annotations

import os

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def test_a_job_over_its_projects_quota_waits_and_starts_when_it_frees(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    quotas = {"projects": {"vision": {"gpus": 1, "queued_jobs": 1}}}
    loaded = write_config(cluster, tmp_path, sock_dir, quotas=quotas, projects={"vision": {}, "speech": {}})
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


async def test_an_admin_changes_a_quota_at_run_time_and_nobody_else_may(sshd_cluster, tmp_path, sock_dir) -> None:
    """No quota in the config: an admin sets one (it holds the next job back), loosens it (the job starts), and
    clears it; the limits not given stay as they were; a user who is not an admin is refused."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, projects={"vision": {}})
    sock_dir.chmod(0o755)
    async with running(loaded) as (_, client):
        me_admin = (await client.call("whoami"))["admin"]
        if not me_admin:
            pytest.skip("the test's user is not an admin here (root always is)")
        set_ = await client.call("quota", kind="project", name="vision", limits={"gpus": 1, "running_jobs": 5})
        assert set_["limits"] == {"gpus": 1, "running_jobs": 5, "queued_jobs": None, "gpu_hours": None}
        first = await client.call("submit", spec=job("first", "sleep 30", project="vision"))
        await until(client, first["id"], lambda j: j["status"] == "running", "the first to run")
        second = await client.call("submit", spec=job("second", "true", project="vision"))
        await until(client, second["id"], lambda j: "quota of 1 GPU" in (j["message"] or ""), "the quota to hold it")
        loosened = await client.call("quota", kind="project", name="vision", limits={"gpus": 2})
        assert loosened["limits"]["gpus"] == 2 and loosened["limits"]["running_jobs"] == 5  # the other stays
        assert (await finished(client, second["id"]))["status"] == "succeeded"
        cleared = await client.call("quota", kind="project", name="vision", limits=None)
        assert cleared == {"kind": "project", "name": "vision", "limits": None, "set": False}
        events = [e["message"] for e in await client.call("events", limit=100) if e["kind"] == "Quota"]
        assert len(events) == 3 and events[-1].endswith(": the config's again")
        with pytest.raises(UsageError, match="quota limits are gpu_hours, gpus, queued_jobs, running_jobs: not gpu"):
            await client.call("quota", kind="project", name="vision", limits={"gpu": 1})
        if os.geteuid() == 0:  # acting as another user needs root
            refused = await as_nobody(loaded.socket_path, "quota", kind="user", name="nobody", limits={"gpus": 99})
            assert refused["error"]["type"] == "PermissionDenied" and "may not change quotas" in str(refused)
        await client.call("stop", jobs=[first["id"]])
        await finished(client, first["id"])
