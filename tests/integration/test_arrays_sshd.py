"""Job arrays end to end on real sshd nodes: 20 tasks with %3 never run more than 3 at once, each with its index
and its own output folder; the array is one row of `ftconsole jobs`, a task is named `12[7]`, and stop and
priority act on one task or on the whole array."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import Cli
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, log_of, poll, running, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

TASK = "sh -c 'echo index=$FT_ARRAY_INDEX of $FT_ARRAY_COUNT in $FT_ARRAY_ID out=$FT_OUTPUT_DIR; sleep 0.6'"


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at any time."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


async def test_an_array_of_20_tasks_with_a_limit_of_3_never_runs_more_than_3(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=4)  # room for 8 at once: only the array's limit holds them back
    loaded = write_config(cluster, tmp_path, sock_dir)
    cli = Cli(loaded.file)
    out = tmp_path / "out"
    async with running(loaded) as (_, client):
        submitted = await client.call("submit", spec=job("sweep", TASK, array="0-19%3", output=str(out)))
        array = submitted["id"]
        assert (submitted["array_id"], submitted["array_index"], submitted["ref"]) == (array, 0, f"{array}[0]")
        # after.any on the array's id: once every task of it has ended (Slurm's afterany on an array)
        after = (await client.call("submit", spec=job("after", "true", after={"any": [array]})))["id"]
        await poll(lambda: client.call("show", job=f"{array}[0]"), lambda j: j["status"] == "running", "task 0")
        await client.call("priority", job=str(array), level="urgent")  # the array: each task still queued
        await asyncio.to_thread(cli, "stop", f"{array}[19]")  # one task, queued: stopped alone
        tenth = f"{array}[10]"
        note = await poll(lambda: client.call("show", job=tenth), lambda j: "at most" in j["message"], "a note")
        assert note["message"].startswith(f"waiting: array {array} runs at most 3 tasks at once ("), note["message"]
        (submit_event,) = [e for e in note["events"] if e["message"].startswith("submitted by ")]
        assert submit_event["message"].endswith(f" (task 10 of array {array})") and submit_event["job"] == str(
            array + 10
        ), submit_event
        listed = await asyncio.to_thread(cli, "jobs")
        (row,) = [line for line in listed.stdout.splitlines() if line.startswith(f"{array}[")]
        assert row.startswith(f"{array}[0-19%3]  sweep") and "stopped 1" in row, listed.stdout
        shown = await poll(
            lambda: client.call("show", job=array),
            lambda j: all(t["status"] not in ("queued", "running") for t in j["tasks"]),
            "every task to end",
        )
        tasks = {t["index"]: t for t in shown["tasks"]}
        ended = {i: await finished(client, t["id"]) for i, t in tasks.items()}
        seventh = await log_of(client, tasks[7]["id"])
        followed = await finished(client, after)
        expanded = await asyncio.to_thread(cli, "jobs", "--expand")
        task_json = await asyncio.to_thread(cli.json, "show", f"{array}[7]")

    assert sorted(tasks) == list(range(20)) and len({t["id"] for t in tasks.values()}) == 20
    assert {i: e["status"] for i, e in ended.items()} == {**dict.fromkeys(range(19), "succeeded"), 19: "stopped"}
    # the tasks still queued then (a task runs 1 s, 3 at once: the later ones) took the new priority
    assert {e["priority"] for i, e in ended.items() if 10 <= i < 19} == {"urgent"}
    assert ended[0]["priority"] == "normal"  # running by then: a priority changes only while queued
    spans = [(a["started"], a["ended"]) for e in ended.values() for a in e["attempts"]]
    assert followed["status"] == "succeeded" and followed["started"] >= max(e for _, e in spans), followed
    assert 2 <= most_at_once(spans) <= 3, spans
    assert f"index=7 of 20 in {array} out={out / '7'}" in seventh
    assert f"{array}[7]" in expanded.stdout and f"{array}[0-19%3]" not in expanded.stdout
    assert (task_json["id"], task_json["array_index"]) == (tasks[7]["id"], 7)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_another_user_can_neither_stop_an_array_nor_one_of_its_tasks(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """Another user may not stop a private array (access: none) nor one of its tasks: to them it is no job at all;
    with read-only access, they may look but not stop nor change the priority; nothing of the array is touched
    either way."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    async with running(loaded) as (_, client):
        private = (await client.call("submit", spec=job("mine", "sleep 60", array="0-2%1")))["id"]
        shared = (await client.call("submit", spec=job("ours", "sleep 60", array="0-1", access="read-only")))["id"]
        for ref in (str(private), f"{private}[1]"):
            refused = await as_nobody(loaded.socket_path, "stop", jobs=[ref])
            assert refused["error"]["type"] == "NotFound" and refused["error"]["message"] == f"no job {ref}", refused
        for ref in (str(shared), f"{shared}[1]"):
            refused = await as_nobody(loaded.socket_path, "stop", jobs=[ref])
            assert refused["error"]["type"] == "PermissionDenied", refused
        looked = await as_nobody(loaded.socket_path, "show", job=f"{shared}[1]")
        assert looked["result"]["array_index"] == 1, looked
        refused = await as_nobody(loaded.socket_path, "priority", job=str(shared), level="urgent")
        assert refused["error"]["type"] == "PermissionDenied", refused
        tasks = (await client.call("show", job=private))["tasks"] + (await client.call("show", job=shared))["tasks"]
        assert all(t["status"] in ("queued", "running") for t in tasks), tasks
        await client.call("stop", jobs=[str(private), str(shared)])
        for t in tasks:
            await finished(client, t["id"])


def test_submit_wait_follows_every_task_and_fails_if_one_did(sshd_cluster: Any, tmp_path: Path, sock_dir: Path) -> None:
    """`submit --wait` of an array (a one-off scheduler in the CLI's process: --local): each task's end on stderr,
    exit 0 only when every task succeeded; `--json` names the array."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    cli = Cli(write_config(cluster, tmp_path, sock_dir).file)
    good = tmp_path / "good.yaml"
    good.write_text("name: good\narray: 0-2\ncommand: 'true'\n")
    done = cli("submit", str(good), "--local", "--wait")
    array = int(done.stdout.strip())
    assert [f"job {array}[{i}] succeeded" in done.stderr for i in range(3)] == [True] * 3, done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\narray: 0-1\ncommand: sh -c 'exit $FT_ARRAY_INDEX'\n")  # task 1 exits 1
    failed = cli("submit", str(bad), "--local", "--wait", "--json", check=1)
    shown = json.loads(failed.stdout)
    assert shown["status"] == "error" and shown["array"] == "0-1", shown
