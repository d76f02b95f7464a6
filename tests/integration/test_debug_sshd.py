"""The kept debugging environment (seed 003) on a real sshd node: a failed job's run folder outlives run retention
for its debug retention, its GPU stays held (`debug.hold_nodes`) until `release`, and `ftconsole shell` says
clearly when an environment is gone. What is checked is what the node shows (its folders), what placement does
(a job waits, then runs), and what the CLI prints."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import executor
from ftconsole.scheduler.errors import UsageError
from tests.cli_runner import Cli
from tests.integration.test_scheduler_sshd import finished, job, poll, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def test_a_failed_job_keeps_its_folder_and_gpu_for_debugging_until_released(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor, "PRUNE_EVERY_S", 0.0)  # retention with every read of the node
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"run_retention": "1s"})
    cli = Cli(loaded.file)
    async with running(loaded) as (_, client):
        ok = (await client.call("submit", spec=job("fine", "true")))["id"]
        assert (await finished(client, ok))["status"] == "succeeded"
        broken = job("broken", "sh -c 'echo boom; exit 3'", debug={"hold_nodes": True, "retention": "1h"})
        failed_id = (await client.call("submit", spec=broken))["id"]
        failed = await finished(client, failed_id)
        assert failed["status"] == "error" and failed["debug"]["env"] == "kept", failed
        assert failed["debug"]["held_until"] == pytest.approx(failed["ended"] + 3600, abs=1)
        (held_run,) = failed["attempts"][-1]["runs"]

        # the other GPU runs a sleeper (its reads carry the prune); a third job finds no GPU free
        sleeper = (await client.call("submit", spec=job("sleeper", "sleep 120")))["id"]
        await until(client, sleeper, lambda j: j["status"] == "running", "the sleeper running")
        waiter = (await client.call("submit", spec=job("waiter", "true")))["id"]
        shown = await until(client, waiter, lambda j: "waiting" in j["message"], "the waiter's placement note")
        assert shown["status"] == "queued"
        (node,) = await client.call("nodes")
        assert [(h["gpu"], h["job"]) for h in node["held_for_debug"]] == [(held_run["gpus"][0], failed_id)]
        gpus = (await client.call("cluster"))["nodes"][0]["gpus"]
        assert [g["job"] for g in gpus if "held_for_debug_until" in g] == [failed_id]

        # run retention (1 s) removes the succeeded job's folder; the failed one's stays for its debug retention
        fine_dir = Path((await client.call("show", job=ok))["attempts"][0]["runs"][0]["run_dir"])
        failed_dir = Path(held_run["run_dir"])
        assert fine_dir.is_relative_to(cluster.node("node01").home)
        await poll(lambda: asyncio.to_thread(fine_dir.exists), lambda there: not there, "the prune of the ended run")
        assert (failed_dir / "output.log").read_text() == "boom\n"
        assert (await client.call("show", job=waiter))["status"] == "queued"

        # the shell finds the failed job's environment, and says when one is gone
        cat = await asyncio.to_thread(cli, "shell", str(failed_id), "--command", "cat output.log")
        assert cat.stdout == "boom\n"
        gone = await asyncio.to_thread(cli, "shell", str(ok), "--command", "true", check=2)
        assert f"the environment of job {ok} attempt 1 is gone: it was kept until" in gone.stderr, gone.stderr
        assert "(scheduler.run_retention)" in gone.stderr

        # release: the GPU goes to the waiter; the folder stays
        released = await asyncio.to_thread(cli, "release", str(failed_id))
        assert f"job {failed_id} broken: GPUs held for debugging released" in released.stdout
        assert (await finished(client, waiter))["status"] == "succeeded"
        after = await client.call("show", job=failed_id)
        assert after["debug"]["held_until"] is None and after["debug"]["released"] is not None
        assert failed_dir.is_dir()
        again = await asyncio.to_thread(cli, "release", str(failed_id), check=2)
        assert "holds no GPUs for debugging: nothing to release" in again.stderr
        await client.call("stop", jobs=[sleeper])
        assert (await finished(client, sleeper))["status"] == "stopped"


async def test_the_admins_limits_refuse_a_longer_retention_and_any_hold_at_submit(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, debug={"max_retention": "1d", "max_hold": "0s"})
    async with running(loaded) as (_, client):
        with pytest.raises(UsageError, match=r"debug\.retention 2d is over this cluster's debug\.max_retention \(1d\)"):
            await client.call("submit", spec=job("long", "false", debug={"retention": "2d"}))
        with pytest.raises(UsageError, match=r"debug\.hold_nodes is refused here: .* \(debug\.max_hold is 0\)"):
            await client.call("submit", spec=job("holder", "false", debug={"hold_nodes": True}))
        assert await client.call("jobs") == []  # nothing was written
        kept = (await client.call("submit", spec=job("kept", "false", debug={"retention": "1d"})))["id"]
        shown = await finished(client, kept)
        assert shown["status"] == "error" and shown["debug"]["kept_until"] == pytest.approx(shown["ended"] + 86400)
        assert shown["debug"]["held_until"] is None


async def test_a_hang_window_under_three_probe_intervals_is_refused(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "60s"})
    async with running(loaded) as (_, client):
        refused = (
            r"a hang window of 2m \(hang_detect\) would never see a hang: .* give at least 3m, or hang_detect: off"
        )
        with pytest.raises(UsageError, match=refused):
            await client.call("submit", spec=job("short", "true", hang_detect="2m"))
        with pytest.raises(UsageError, match=r"a hang window of 1m \(MA_HANG_DETECT_TIME in env\)"):
            await client.call("submit", spec=job("env", "true", env={"MA_HANG_DETECT_TIME": "1"}))
        for fine in ({"hang_detect": "3m"}, {"hang_detect": "off"}, {}):
            await client.call("submit", spec=job("fine", "true", **fine))
        assert len(await client.call("jobs")) == 3
    # probes an hour apart: a window the job asks for must be 3h; the default (30m) is never refused for it
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "1h"})
    async with running(loaded) as (_, client):
        with pytest.raises(UsageError, match=r"give at least 3h"):
            await client.call("submit", spec=job("asked", "true", hang_detect="30m"))
        await client.call("submit", spec=job("default", "true"))
