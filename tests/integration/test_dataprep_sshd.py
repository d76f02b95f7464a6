"""data_prep end to end on real sshd nodes, through the scheduler's API socket.

The test nodes share this machine's file system and differ in their home folder, so the node-local storage
here is `~/local` (data_prep.roots: [~/local]): each node gets its own copy, read by the rank that runs there.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_scheduler_sshd import WAIT, finished, job, log_of, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

ROOTS = {"roots": ["~/local"], "retention": "7d"}
READ = "sh -c 'echo rank $RANK read: $(cat $HOME/local/imagenet/labels.txt)'"


def dataset(tmp_path: Path) -> Path:
    """The shared data set, as every node sees it (the shared file system)."""
    src = tmp_path / "shared" / "imagenet"
    (src / "train").mkdir(parents=True)
    (src / "labels.txt").write_text("cat dog\n")
    (src / "train" / "0.bin").write_bytes(os.urandom(4096))
    return src


def conditions(shown: dict[str, Any]) -> list[str]:
    return [c["type"] for c in shown["conditions"]]


async def test_each_node_gets_its_copy_then_a_second_job_skips_it(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, data_prep=ROOTS)
    src = dataset(tmp_path)
    prep = [{"from": str(src), "to": "~/local/imagenet"}]
    first_home = cluster.node("node01").home
    async with running(loaded) as (_, client):
        # node01's copy waits for a lock held here (another data_prep of the same folder on that node), so the
        # scheduler sees the rank in its data step: Preparing, and no Running until the copy is done
        (first_home / "local").mkdir(parents=True)
        lock = os.open(first_home / "local" / ".imagenet.ftconsole-lock", os.O_RDONLY | os.O_CREAT, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            spec = job("prep", READ, mode="pytorch", nodes=2, gpus_per_node=1, data_prep=prep)
            first = await client.call("submit", spec=spec)
            shown = await until(client, first["id"], lambda j: "Preparing" in conditions(j), "Preparing")
            text = next(c["message"] for c in shown["conditions"] if c["type"] == "Preparing")
            assert text.startswith("attempt 1: copying data sets to node-local storage (data_prep): rank ")
            await asyncio.sleep(1.0)  # several ticks: every rank is running, but one still prepares its data
            shown = await client.call("show", job=first["id"])
            assert shown["status"] == "running" and "Running" not in conditions(shown), conditions(shown)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
        shown = await finished(client, first["id"])
        assert shown["status"] == "succeeded", shown["message"]
        types = conditions(shown)
        assert types.index("Creating") < types.index("Preparing") < types.index("Running"), types
        for run in shown["attempts"][0]["runs"]:
            home = cluster.node(run["node"]).home
            copied = home / "local" / "imagenet"
            assert (copied / "labels.txt").read_text() == "cat dog\n"
            assert (copied / "train" / "0.bin").read_bytes() == (src / "train" / "0.bin").read_bytes()
            marker = json.loads((copied / ".ftconsole-data.json").read_text())
            assert marker["state"] == "ready" and marker["runs"] == [run["run_dir"]]
            text = await log_of(client, first["id"], run["rank"])
            assert text.startswith("== ftconsole: data prep ==\n"), text
            assert f"data_prep: copying {src} to {copied}: 2 files, 4.0 KiB (" in text
            assert f"data_prep: {copied}: copied 2 files" in text
            assert f"== ftconsole: command ==\nrank {run['rank']} read: cat dog\n" in text
        assert "another data_prep on this node is preparing it: waiting for it" in await log_of(
            client, first["id"], next(r["rank"] for r in shown["attempts"][0]["runs"] if r["node"] == "node01")
        )

        second = await client.call("submit", spec=job("again", READ, mode="pytorch", nodes=2, data_prep=prep))
        shown = await finished(client, second["id"])
        assert shown["status"] == "succeeded", shown["message"]
        for run in shown["attempts"][0]["runs"]:
            copied = cluster.node(run["node"]).home / "local" / "imagenet"
            text = await log_of(client, second["id"], run["rank"])
            assert f"data_prep: {copied}: up to date: 2 files, 4.0 KiB, skipped" in text, text
            assert "copying" not in text and f"rank {run['rank']} read: cat dog" in text


async def test_nodes_that_share_a_home_make_one_copy_and_both_ranks_read_it(sshd_cluster, tmp_path, sock_dir) -> None:
    """data_prep.roots on a shared home (an NFS home; here the nodes share a kernel too): the two ranks prepare
    the same folder; one copies, the other waits for it and then finds it ready, and both read the data."""
    cluster: SshdCluster = sshd_cluster(2, gpus=2, shared_home=True)
    loaded = write_config(cluster, tmp_path, sock_dir, data_prep=ROOTS)
    src = dataset(tmp_path)
    prep = [{"from": str(src), "to": "~/local/imagenet"}]
    (home,) = cluster.homes
    async with running(loaded) as (_, client):
        for name in ("prep", "again"):
            spec = job(name, READ, mode="pytorch", nodes=2, gpus_per_node=1, data_prep=prep)
            shown = await finished(client, (await client.call("submit", spec=spec))["id"])
            assert shown["status"] == "succeeded", shown["message"]
            assert {r["node"] for r in shown["attempts"][0]["runs"]} == {"node01", "node02"}
            logs = [await log_of(client, shown["id"], r["rank"]) for r in shown["attempts"][0]["runs"]]
            copies = [text for text in logs if "data_prep: %s: copied 2 files" % (home / "local" / "imagenet") in text]
            assert len(copies) == (1 if name == "prep" else 0), logs
            for rank, text in enumerate(logs):
                assert f"rank {rank} read: cat dog" in text, text
        assert (home / "local" / "imagenet" / "labels.txt").read_text() == "cat dog\n"
        assert json.loads((home / "local" / "imagenet" / ".ftconsole-data.json").read_text())["state"] == "ready"


async def test_a_failed_copy_fails_the_job_with_its_reason(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, data_prep=ROOTS)
    missing = tmp_path / "shared" / "missing"
    foreign = cluster.node("node01").home / "local" / "mine"
    foreign.mkdir(parents=True)
    (foreign / "notes").write_text("not data_prep's")
    async with running(loaded) as (_, client):
        gone = await client.call(
            "submit", spec=job("gone", "echo never", data_prep=[{"from": str(missing), "to": "~/local/m"}])
        )
        taken = await client.call(
            "submit",
            spec=job("taken", "echo never", data_prep=[{"from": str(dataset(tmp_path)), "to": "~/local/mine"}]),
        )
        shown = await finished(client, gone["id"])
        assert (shown["status"], shown["exit_code"]) == ("error", 1)
        assert shown["message"] == (
            "rank 0 on node01 exited with code 1 (data prep exited with code 1: data_prep: source "
            f"{missing}: No such file or directory)"
        )
        assert shown["attempts"][0]["runs"][0]["error"].startswith("data prep exited with code 1: data_prep: source")
        text = await log_of(client, gone["id"])
        assert "never" not in text and text.endswith("ftconsole: data prep exited with code 1\n"), text

        shown = await finished(client, taken["id"])
        assert shown["status"] == "error"
        assert (
            f"data_prep: {foreign} exists and was not made by data_prep: refusing to overwrite it" in shown["message"]
        )
        assert (foreign / "notes").read_text() == "not data_prep's" and sorted(os.listdir(foreign)) == ["notes"]


async def test_a_cluster_without_roots_refuses_data_prep_at_submit(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        spec = job("nowhere", "true", data_prep=[{"from": "/shared/x", "to": "/local/x"}])
        with pytest.raises(UsageError, match=r"this cluster names no node-local storage .*data_prep.roots"):
            await client.call("submit", spec=spec)
        assert await client.call("jobs") == []
    loaded = write_config(cluster, tmp_path, sock_dir, data_prep=ROOTS)
    async with running(loaded) as (_, client):
        with pytest.raises(UsageError, match=r"/local/x is not inside this cluster's node-local storage"):
            await asyncio.wait_for(client.call("submit", spec=spec), WAIT)


async def test_a_data_set_unused_past_its_retention_goes_at_the_next_prep(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, data_prep={"roots": ["~/local"], "retention": "1s"})
    src = dataset(tmp_path)
    local = cluster.node("node01").home / "local"
    async with running(loaded) as (_, client):
        old = await client.call("submit", spec=job("old", "true", data_prep=[{"from": str(src), "to": "~/local/old"}]))
        assert (await finished(client, old["id"]))["status"] == "succeeded"
        assert (local / "old" / "labels.txt").read_text() == "cat dog\n"
        await asyncio.sleep(2.0)  # past the retention (the cluster's, sent with the step)
        new = await client.call("submit", spec=job("new", "true", data_prep=[{"from": str(src), "to": "~/local/new"}]))
        shown = await finished(client, new["id"])
        assert shown["status"] == "succeeded", shown["message"]
        assert not (local / "old").exists() and (local / "new" / "labels.txt").read_text() == "cat dog\n"
        text = await log_of(client, new["id"])
        assert f"data_prep: removed {local / 'old'}: last used " in text and "data_prep.retention is 1s" in text, text


@pytest.mark.skipif(os.geteuid() != 0, reason="a destination of another uid needs root")
async def test_a_destination_another_user_forged_is_refused_and_never_read(sshd_cluster, tmp_path, sock_dir) -> None:
    """Defect (issue 26): uid 65534 made the job's `to` first, with a `ready` marker carrying the source's
    manifest and files of the same size and mtime but other bytes: the job took it for an up-to-date copy and
    read the forged data. Now the job fails with who owns it, and its command never runs."""
    from ftconsole.scheduler.node import datacopy

    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, data_prep=ROOTS)
    src = dataset(tmp_path)
    dst = cluster.node("node01").home / "local" / "imagenet"
    dst.parent.mkdir(parents=True)
    shutil.copytree(src, dst)  # sizes and mtimes kept
    labels = dst / "labels.txt"
    st = labels.stat()
    labels.write_text("bad cat\n"[: st.st_size])
    os.utime(labels, (st.st_atime, st.st_mtime))
    marker = {"by": "ftconsole data_prep", "state": "ready", "digest": datacopy.manifest(str(src))[0]}
    (dst / ".ftconsole-data.json").write_text(json.dumps(marker))
    for path in [dst, *dst.rglob("*")]:
        os.chown(path, 65534, 65534)
    async with running(loaded) as (_, client):
        spec = job("forged", READ, data_prep=[{"from": str(src), "to": "~/local/imagenet"}])
        shown = await finished(client, (await client.call("submit", spec=spec))["id"])
        assert shown["status"] == "error"
        assert f"data_prep: {dst} belongs to uid 65534 (nobody), not to uid 0 (root)" in shown["message"]
        text = await log_of(client, shown["id"])
        assert "read:" not in text and "up to date" not in text, text
    assert labels.read_text() == "bad cat\n"[: st.st_size]  # nothing written into it either
