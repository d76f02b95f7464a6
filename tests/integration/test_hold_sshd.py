"""Holds (`ftconsole hold` / `release`, Slurm's `scontrol hold`/`release`) end to end on a real sshd node: a held
job is not placed, and holds nothing back, until released; an admin's hold is released by an admin only; an
array's id holds its queued tasks; the command line says what it did and refuses what cannot be held."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


def note(j: dict[str, Any]) -> str:
    return str(j["message"] or "")


async def test_a_held_job_waits_and_holds_nothing_back_until_released(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        blocker = await client.call("submit", spec=job("blocker", "sleep 300", gpus_per_node=2))
        await until(client, blocker["id"], lambda j: j["status"] == "running", "the blocker to run")
        first = await client.call("submit", spec=job("first", "true", gpus_per_node=2))
        array = await client.call("submit", spec=job("sweep", "true", gpus_per_node=2, array="0-2"))
        code, out, err = await cli(loaded.file, "hold", str(first["id"]), str(array["id"]))
        assert code == 0, err
        assert f"job {first['id']} first: held by root, queued" in out
        assert out.count("sweep: held by root, queued") == 3  # the array's id: each of its tasks
        held = await until(client, first["id"], lambda j: note(j).startswith("held by"), "the hold's note")
        assert held["status"] == "queued" and held["held"]["by"] == "root" and held["held"]["admin"] is True
        assert note(held) == f"held by root, an admin: not placed until released (ftconsole release {first['id']})"
        events = [e["kind"] for e in (await client.call("show", job=first["id"]))["events"]]
        assert "Held" in events
        expected = {q["id"]: q for q in (await client.call("forecast"))["queued"]}
        assert expected[first["id"]]["start"] is None and expected[first["id"]]["message"] == note(held)

        # behind it in the queue, a job submitted later goes first once the GPUs are free: the hold holds no one
        later = await client.call("submit", spec=job("later", "true", gpus_per_node=2))
        await client.call("stop", jobs=[blocker["id"]])
        assert (await finished(client, later["id"]))["status"] == "succeeded"
        still = await client.call("show", job=first["id"])
        assert still["status"] == "queued" and not still["attempts"] and still["held"] is not None
        tasks = (await client.call("show", job=array["id"]))["tasks"]
        assert [t["status"] for t in tasks] == ["queued"] * 3

        # a running or ended job cannot be held; the refusal says why and exits 2
        code, _, err = await cli(loaded.file, "hold", str(later["id"]))
        assert code == 2 and f"job {later['id']} is succeeded: only a queued job can be held" in err

        code, out, err = await cli(loaded.file, "release", str(first["id"]))
        assert code == 0, err
        assert f"job {first['id']} first: hold released, queued" in out
        done = await finished(client, first["id"])
        assert done["status"] == "succeeded" and done["held"] is None
        assert "Released" in [e["kind"] for e in done["events"]]
        await client.call("release", jobs=[array["id"]])
        for task in tasks:
            assert (await finished(client, task["id"]))["status"] == "succeeded"
        with pytest.raises(UsageError, match="nothing to release"):
            await client.call("release", jobs=[first["id"]])


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_an_admins_hold_is_released_by_an_admin_only(sshd_cluster: Any, tmp_path: Path, sock_dir: Path) -> None:
    """Another user who may act on the jobs (access: read-write) holds and releases a job of theirs to act on,
    but not one an admin held: refused, and the job stays held."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)  # another user reaches the socket
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        blocker = await client.call("submit", spec=job("blocker", "sleep 300", access="read-write"))
        await until(client, blocker["id"], lambda j: j["status"] == "running", "the blocker to run")
        by_admin = await client.call("submit", spec=job("by-admin", "true", access="read-write"))
        by_user = await client.call("submit", spec=job("by-user", "true", access="read-write"))
        await client.call("hold", jobs=[by_admin["id"]])
        reply = await as_nobody(path, "hold", jobs=[by_user["id"]])
        assert "error" not in reply, reply
        (shown,) = reply["result"]
        assert shown["held"]["by"] != "root" and shown["held"]["admin"] is False

        refused = await as_nobody(path, "release", jobs=[by_admin["id"]])
        assert refused["error"]["type"] == "PermissionDenied"
        assert "held by root, an admin: only an admin may release it" in refused["error"]["message"]
        assert (await client.call("show", job=by_admin["id"]))["held"]["by"] == "root"

        released = await as_nobody(path, "release", jobs=[by_user["id"]])
        assert "error" not in released and released["result"][0]["held"] is None
        await client.call("stop", jobs=[blocker["id"]])
        assert (await finished(client, by_user["id"]))["status"] == "succeeded"
        assert (await client.call("show", job=by_admin["id"]))["status"] == "queued"
        await client.call("release", jobs=[by_admin["id"]])
        assert (await finished(client, by_admin["id"]))["status"] == "succeeded"


async def test_a_job_submitted_held_waits_on_free_gpus_until_released(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """`submit --hold` (sbatch -H): held from the start, so even on an idle node no pass places it."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: later\ncommand: 'true'\n")
    async with running(loaded) as (_, client):
        code, out, err = await cli(loaded.file, "submit", "--hold", str(spec))
        assert code == 0, err
        job_id = int(out.strip())
        held = await until(client, job_id, lambda j: note(j).startswith("held by"), "the hold's note")
        assert held["held"]["by"] == "root" and not held["attempts"]
        assert held["events"][0]["message"] == "submitted by root, held: not placed until released"
        # a job submitted after it runs on the idle node, while it waits
        other = await client.call("submit", spec=job("other", "true"))
        assert (await finished(client, other["id"]))["status"] == "succeeded"
        assert (await client.call("show", job=job_id))["status"] == "queued"
        await client.call("release", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "succeeded"
