"""Job dependencies (`after:`) end to end on real sshd nodes: a chain runs in order, one whose dependency can
never be met ends `error` saying which, a waiting job holds nothing back, and submit refuses what can never be."""

from __future__ import annotations

import os

import pytest

from ftconsole.scheduler.errors import NotFound, UsageError
from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


def started(shown: dict) -> float:  # type: ignore[type-arg]
    return min(a["started"] for a in shown["attempts"])


async def test_a_chain_runs_in_order_and_a_broken_one_ends_with_its_reason(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        first = await client.call("submit", spec=job("first", "sleep 3"))
        second = await client.call("submit", spec=job("second", "true", after={"ok": [first["id"]]}))
        third = await client.call("submit", spec=job("third", "true", after={"failed": [second["id"]]}))
        either = await client.call("submit", spec=job("either", "true", after={"any": [first["id"]]}))
        waiting = await until(client, second["id"], lambda j: "waiting for job" in (j["message"] or ""), "its note")
        assert waiting["status"] == "queued"
        assert waiting["message"] == f"waiting for job {first['id']} to succeed (after.ok)"
        # the first job's GPU is one of two: the waiting jobs hold nothing back, a free one starts beside it
        free = await client.call("submit", spec=job("free", "true"))
        assert (await finished(client, free["id"]))["status"] == "succeeded"

        done_first = await finished(client, first["id"])
        done_second = await finished(client, second["id"])
        done_either = await finished(client, either["id"])
        done_third = await finished(client, third["id"])
    assert [d["status"] for d in (done_first, done_second, done_either)] == ["succeeded"] * 3
    assert started(done_second) >= done_first["ended"] and started(done_either) >= done_first["ended"]
    assert done_third["status"] == "error" and not done_third["attempts"]
    assert done_third["message"] == (
        f"its dependency can never be met: job {second['id']} ended succeeded; after.failed needs it to fail"
    )


async def test_submit_refuses_an_unknown_job_and_one_that_can_never_be_met(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        with pytest.raises(NotFound, match=r"job late: after\.ok: no job 999"):
            await client.call("submit", spec=job("late", "true", after={"ok": [999]}))
        failing = await client.call("submit", spec=job("failing", "false"))
        assert (await finished(client, failing["id"]))["status"] == "error"
        with pytest.raises(UsageError, match=f"can never be met: job {failing['id']} ended error; after.ok needs it"):
            await client.call("submit", spec=job("never", "true", after={"ok": [failing["id"]]}))
        running_one = await client.call("submit", spec=job("long", "sleep 30"))
        await until(client, running_one["id"], lambda j: j["status"] == "running", "it to run")
        predicted = await client.call("predict", spec=job("next", "true", after={"any": [running_one["id"]]}))
        assert predicted["starts_now"] is False and predicted["cause"] == "dependency"
        assert predicted["reason"] == f"waiting for job {running_one['id']} to end (after.any)"
        assert [j["name"] for j in await client.call("jobs")] == ["failing", "long"]  # nothing refused was kept
        await client.call("stop", jobs=[running_one["id"]])
        await finished(client, running_one["id"])


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_another_user_cannot_wait_on_a_job_they_cannot_see(sshd_cluster, tmp_path, sock_dir) -> None:
    """A private job (access: none, the default) is no job to another user: a dependency on it is refused the
    same way as one on a job that does not exist, so that it tells nothing of the job."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    async with running(loaded) as (_, client):
        private = await client.call("submit", spec=job("mine", "sleep 30"))
        refused = await as_nobody(
            loaded.socket_path, "submit", spec=job("theirs", "true", after={"ok": [private["id"]]})
        )
        assert refused["error"]["type"] == "NotFound", refused
        assert refused["error"]["message"] == f"job theirs: after.ok: no job {private['id']}"
        unknown = await as_nobody(loaded.socket_path, "submit", spec=job("theirs", "true", after={"ok": [99999]}))
        assert unknown["error"]["message"] == "job theirs: after.ok: no job 99999"
        await client.call("stop", jobs=[private["id"]])
        await finished(client, private["id"])


async def test_a_job_with_begin_waits_for_its_time_and_holds_no_one_back(sshd_cluster, tmp_path, sock_dir) -> None:
    """`begin:` (Slurm's --begin): not placed before its time, saying until when; a job after it in the queue
    starts meanwhile; predict says the same."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        # 15 s: time for the job after it to start and end first on a busy machine (4 s was not, once)
        later = await client.call("submit", spec=job("later", "true", begin="+15s"))
        told = await until(client, later["id"], lambda j: "not before" in (j["message"] or ""), "its note")
        assert told["status"] == "queued" and told["message"].endswith("(its begin:)")
        now = await client.call("submit", spec=job("now", "true"))
        assert (await finished(client, now["id"]))["status"] == "succeeded"  # the GPU was free: it went first
        assert (await client.call("show", job=later["id"]))["status"] == "queued"
        predicted = await client.call("predict", spec=job("asked", "true", begin="+1h"))
        assert predicted["starts_now"] is False and predicted["cause"] == "begin", predicted
        done = await finished(client, later["id"])
        assert done["status"] == "succeeded" and started(done) >= later["submitted"] + 15

        spec = tmp_path / "job.yaml"  # `submit --begin` over the file's
        spec.write_text("name: from-cli\ncommand: 'true'\nbegin: +1d\n")
        code, out, err = await cli(loaded.file, "submit", str(spec), "--begin", "+2s")
        assert code == 0, err
        shown = await client.call("show", job=int(out.split()[-1]))
        assert shown["spec"]["begin"] == "+2s"
        assert (await finished(client, shown["id"]))["status"] == "succeeded"
