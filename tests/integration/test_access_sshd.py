"""Who sees and may do what, across real uids (root and uid 65534 over the API socket), on real sshd nodes:
private jobs stay out of every listing, extend is bounded, the urgent cap cannot be dodged or raced, and
predict applies submit's rules."""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.redaction import HIDDEN_JOB
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster, gpu_data

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root"),
]


def started(j: dict[str, Any]) -> bool:
    return any(c["type"] == "Running" for c in j["conditions"])


async def test_a_private_job_is_in_no_listing_of_others(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=3)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        private = await client.call("submit", spec=job("secret", "sleep 300"))  # access: none (the default)
        shared = await client.call("submit", spec=job("open", "sleep 300", access="read-only"))
        failed = await client.call("submit", spec=job("secret-fail", "sh -c 'exit 3'"))  # raises a job_failed alert
        await until(client, private["id"], started, "the private job to run")
        await until(client, shared["id"], started, "the shared job to run")
        await finished(client, failed["id"])
        hidden = {private["id"], failed["id"]}

        ids = {j["id"] for j in (await as_nobody(path, "jobs"))["result"]}
        assert ids == {shared["id"]}
        feed = (await as_nobody(path, "jobs_changed", since=None))["result"]
        assert {j["id"] for j in feed["jobs"]} == {shared["id"]}
        events = (await as_nobody(path, "events", limit=1000))["result"]
        assert events and not any(e["job"] is not None and int(e["job"]) in hidden for e in events)
        assert any(e["job"] == str(shared["id"]) for e in events)
        alerts = (await as_nobody(path, "alerts"))["result"]
        assert not any(a["job"] in hidden for a in alerts)
        (node,) = (await as_nobody(path, "nodes"))["result"]
        held = sorted(node["held"], key=lambda h: h["gpu"])
        assert len(held) == 2  # two GPUs are held: one by the shared job, one by a private job
        assert {h["job"] for h in held} == {shared["id"], None}
        assert next(h for h in held if h["job"] is None)["private"] is True
        (brief,) = (await as_nobody(path, "nodes_changed", since=None))["result"]["nodes"]  # the console's list
        assert sorted(brief["held"], key=lambda h: h["gpu"]) == held and "checks" not in brief
        gpus = (await as_nobody(path, "cluster"))["result"]["nodes"][0]["gpus"]
        assert {g["job"] for g in gpus if g.get("private")} == {None} and private["id"] not in {g["job"] for g in gpus}

        # the owner (root, also an admin) sees everything
        assert hidden <= {j["id"] for j in await client.call("jobs")}
        assert any(a["job"] == failed["id"] for a in await client.call("alerts"))
        (node,) = await client.call("nodes")
        assert private["id"] in {h["job"] for h in node["held"]}
        await client.call("stop", jobs=[private["id"], shared["id"]])


async def test_extend_is_bounded_by_max_extend_and_the_heads_reservation(
    sshd_cluster, tmp_path, sock_dir, shared_run_root
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    # nobody's job runs as nobody: its run folders go where it may write them
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"max_extend": "1h", "run_root": shared_run_root})
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        long = await client.call("submit", spec=job("long", "sleep 600", max_runtime="10m"))
        await until(client, long["id"], started, "the long job to run")
        head = await client.call("submit", spec=job("head", "true", gpus_per_node=2))  # waits for long's end
        # nobody's short job fits in the gap before the head's reserved start: backfilled
        gap = (await as_nobody(path, "submit", spec=job("gap", "sleep 600", max_runtime="5m")))["result"]
        await until(client, gap["id"], started, "the backfilled job to run")
        assert (await client.call("show", job=head["id"]))["status"] == "queued"

        refused = await as_nobody(path, "extend", job=gap["id"], duration="10m")
        assert refused["error"]["type"] == "PermissionDenied"
        assert f"would delay job {head['id']}, the head of the queue" in refused["error"]["message"]
        ok = (await as_nobody(path, "extend", job=gap["id"], duration="3m"))["result"]
        assert ok["max_runtime_s"] == 8 * 60  # still ends before the head's start
        refused = await as_nobody(path, "extend", job=gap["id"], duration="58m")
        assert "may be extended by 1h in all without an admin" in refused["error"]["message"]
        assert "3m so far" in refused["error"]["message"]
        # an admin may do both
        assert (await client.call("extend", job=gap["id"], duration="2h"))["max_runtime_s"] == 8 * 60 + 7200
        await client.call("stop", jobs=[long["id"], gap["id"], head["id"]])


async def test_the_urgent_cap_counts_per_user_and_two_submits_at_once_cannot_both_pass(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"urgent_cap": 1})
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        first = await as_nobody(path, "submit", spec=job("u1", "sleep 300", priority="urgent", project="a"))
        assert first["result"]["priority"] == "urgent"
        dodge = await as_nobody(path, "submit", spec=job("u2", "sleep 300", priority="urgent", project="b"))
        assert "user nobody already has 1 urgent job(s) running or queued (cap 1)" in dodge["error"]["message"]
        predicted = await as_nobody(path, "predict", spec=job("u3", "true", priority="urgent", project="c"))
        assert "cap 1" in predicted["error"]["message"]
        refused = await as_nobody(path, "predict", spec=job("vip", "true", priority="very-urgent"))
        assert refused["error"]["type"] == "PermissionDenied" and "admins only" in refused["error"]["message"]

        async def urgent(name: str) -> dict[str, Any] | UsageError:
            try:
                return dict(await client.call("submit", spec=job(name, "sleep 300", priority="urgent")))
            except UsageError as exc:
                return exc

        results = await asyncio.gather(*(urgent(f"race{i}") for i in range(4)))
        assert sum(1 for r in results if isinstance(r, dict)) == 1  # root's cap: exactly one of four
        listed = [j for j in await client.call("jobs") if j["priority"] == "urgent" and j["owner"] == "root"]
        assert len(listed) == 1
        await client.call("stop", jobs=[j["id"] for j in await client.call("jobs", status=["queued", "running"])])


async def test_declared_projects_take_only_their_members(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir)
    data = loaded.file.read_text() + "projects:\n  research: {members: [root]}\n  shared: {}\n"
    loaded.file.write_text(data)
    from ftconsole.scheduler.spec.config import load_config

    loaded = load_config(loaded.file)
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        refused = await as_nobody(path, "submit", spec=job("x", "true", project="research"))
        assert refused["error"]["type"] == "PermissionDenied" and "not a member of project research" in str(refused)
        unknown = await as_nobody(path, "submit", spec=job("y", "true", project="mine"))
        assert "project 'mine' is not declared" in unknown["error"]["message"]
        ok = await as_nobody(path, "submit", spec=job("z", "true", project="shared"))
        assert ok["result"]["project"] == "shared"
        assert (await client.call("submit", spec=job("r", "true", project="research")))["project"] == "research"


# exits 1 once $HOME/fail exists on its node; from its second attempt on it runs until stopped
FAILS_THEN_RUNS = (
    'sh -c \'if [ "$FT_ATTEMPT" -ge 2 ]; then exec sleep 300; fi; '
    'while [ ! -e "$HOME/fail" ]; do sleep 0.1; done; exit 1\''
)


def mentions(text: str, job_id: int) -> bool:
    return re.search(rf"\bjob #?{job_id}\b", text) is not None


async def test_a_private_job_is_named_in_no_node_reason_event_alert_or_prediction_of_others(
    sshd_cluster, tmp_path, sock_dir
) -> None:
    """Root's private job fails under a GPU ECC fault: its node is isolated "job N attempt 1: hardware fault ...".
    Others read the node's reasons, events and alerts, and a prediction blocked behind root's next private job,
    with neither job's id, name or cause in them (the node's state and its own probe reasons stay); root reads
    them whole."""
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        failing = await client.call("submit", spec=job("secret-train", FAILS_THEN_RUNS, fault_tolerance={"retries": 1}))
        jid = failing["id"]
        shown = await until(client, jid, lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "running")
        first = shown["attempts"][0]["runs"][0]["node"]
        cluster.set_gpus(first, gpu_data(2, ecc_uncorrectable=2))
        (cluster.node(first).home / "fail").touch()
        await until(client, jid, lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["runs"][0]["pid"], "attempt 2")
        # root's next private job wants both GPUs of the one node left: the head of the queue, it reserves them
        head = (await client.call("submit", spec=job("secret-head", "true", gpus_per_node=2)))["id"]
        await until(client, head, lambda j: "waiting" in j["message"], "the head to wait")

        mine = job("mine", "true")
        waiting = (await as_nobody(path, "submit", spec=mine))["result"]["id"]  # fits, but would delay the head
        await until(client, waiting, lambda j: "blocked behind" in j["message"], "nobody's job to wait")
        asked = {
            "jobs": {},
            "show": {"job": waiting},
            "jobs_changed": {"since": None},
            "nodes": {},
            "events": {"limit": 1000},
            "node events": {"node": first, "limit": 1000},
            "alerts": {"all": True},
            "predict": {"spec": mine},
        }
        seen = {}
        for what, args in asked.items():
            reply = await as_nobody(path, what.split()[-1], **args)
            assert "result" in reply, reply
            seen[what] = reply["result"]
        for what, result in seen.items():
            text = json.dumps(result)
            for hidden in (jid, head):
                assert not mentions(text, hidden), (what, hidden, text[:3000])
            assert "secret-" not in text and "hardware fault" not in text, (what, text[:3000])

        # the node part stays: its state, who isolated it, its own probe reasons
        node = next(n for n in seen["nodes"] if n["name"] == first)
        assert node["state"] == "isolated" and node["admin_reason"] == HIDDEN_JOB
        assert node["reasons"][0] == f"isolated: {HIDDEN_JOB}" and any("ecc" in r.lower() for r in node["reasons"])
        assert any(e["message"] == f"isolated by scheduler: {HIDDEN_JOB}" for e in seen["node events"])
        isolated = [a for a in seen["alerts"] if a["kind"] == "node_isolated" and a["node"] == first]
        assert [a["message"] for a in isolated] == [f"{first} isolated by scheduler: {HIDDEN_JOB}"]
        (listed,) = seen["jobs"]
        assert listed["message"] == seen["show"]["message"] == f"waiting (position 2): blocked behind {HIDDEN_JOB}"
        predicted = seen["predict"]
        assert predicted["starts_now"] is False and predicted["reason"] == f"blocked behind {HIDDEN_JOB}"
        assert str(head) not in predicted["ahead"]

        # root (owner and admin) reads them whole
        (node,) = await client.call("nodes", nodeset=first)
        assert node["admin_reason"].startswith(f"job {jid} attempt 1: hardware fault: {first} unhealthy")
        assert any(mentions(e["message"], jid) for e in await client.call("events", node=first, limit=1000))
        alerts = await client.call("alerts", all=True)
        assert any(a["kind"] == "node_isolated" and mentions(a["message"], jid) for a in alerts)
        predicted = await client.call("predict", spec=mine)
        assert predicted["reason"] == f"blocked behind job {head} (head of queue)" and str(head) in predicted["ahead"]
        assert mentions((await client.call("show", job=waiting))["message"], head)
        await client.call("stop", jobs=[jid, head, waiting])


async def test_a_private_job_reads_as_no_job_to_others_whatever_they_ask(sshd_cluster, tmp_path, sock_dir) -> None:
    """Every per-job request of another user about root's private job (access: none), and about its alert, is
    answered exactly as for a job (an alert) that does not exist: the same error type, text and exit code, so that
    neither its existence nor its owner is told; nothing of the job is changed."""
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir)
    sock_dir.chmod(0o755)
    path = loaded.socket_path
    async with running(loaded) as (_, client):
        private = (await client.call("submit", spec=job("secret", "sleep 300")))["id"]
        failed = (await client.call("submit", spec=job("secret-fail", "sh -c 'exit 3'")))["id"]
        before = await until(client, private, started, "the private job to run")
        await finished(client, failed)
        (alert,) = [a["id"] for a in await client.call("alerts") if a["job"] == failed]
        missing_job, missing_alert = failed + 1000, alert + 1000

        def per_job(ref: int | str) -> dict[str, dict[str, Any]]:
            return {
                "show": {"job": ref},
                "events": {"job": ref, "limit": 10},
                "logs": {"job": ref},
                "launch": {"job": ref},
                "debug": {"job": ref},
                "wait": {"job": ref},
                "clone": {"job": ref},
                "stop": {"jobs": [ref]},
                "delete": {"jobs": [ref]},
                "hold": {"jobs": [ref]},
                "release": {"jobs": [ref]},
                "priority": {"job": ref, "level": "urgent"},
                "extend": {"job": ref, "duration": "10m"},
                "scale": {"job": ref, "nodes": 1},
            }

        async def refusal(op: str, args: dict[str, Any], ref: int, missing: int) -> dict[str, Any]:
            reply = await as_nobody(path, op, **args)
            assert "error" in reply, (op, reply)
            error = dict(reply["error"])
            error["message"] = re.sub(rf"\b({ref}|{missing})\b", "ID", error["message"])
            return error

        for ref in (private, failed):
            asked, missing = per_job(ref), per_job(missing_job)
            for op in asked:
                hidden = await refusal(op, asked[op], ref, missing_job)
                absent = await refusal(op, missing[op], ref, missing_job)
                assert hidden == absent, (op, hidden, absent)
                assert hidden["type"] == "NotFound" and "root" not in hidden["message"], (op, hidden)
        for op in ("ack", "resolve"):
            hidden = await refusal(op, {"alerts": [alert]}, alert, missing_alert)
            assert hidden == await refusal(op, {"alerts": [missing_alert]}, alert, missing_alert), op

        shown = await client.call("show", job=private)  # root's job goes on as it was
        assert shown["status"] == "running"
        assert (shown["priority"], shown["max_runtime_s"], shown["nodes"]) == (before["priority"],
                before["max_runtime_s"], before["nodes"])  # fmt: skip
        assert [a["state"] for a in await client.call("alerts") if a["id"] == alert] == ["open"]
        await client.call("stop", jobs=[private])
