"""The job commands of the CLI as a user runs them: `ftconsole serve` in the background, then submit, jobs,
show, logs, stop, delete, clone, priority, scale, and the errors a user sees; without a scheduler, the refusal,
and `--local` (the store from this process, or a one-off scheduler for `submit --local --wait`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_runner import TIMEOUT, Cli
from tests.integration.test_scheduler_sshd import write_config
from tests.sshd_cluster import SshdCluster, current_user

pytestmark = pytest.mark.sshd


@pytest.fixture
def setup(sshd_cluster, tmp_path: Path, sock_dir: Path) -> tuple[Cli, Path, Path]:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    return Cli(write_config(cluster, tmp_path, sock_dir).file), tmp_path, sock_dir


def spec(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{text}")
    return str(path)


def test_cli_job_commands_against_serve(setup) -> None:
    cli, tmp_path, sock_dir = setup
    serve = subprocess.Popen(
        [sys.executable, "-m", "ftconsole.cli", "serve"],
        env=cli.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (sock_dir / "ft.sock").exists():
            assert serve.poll() is None, serve.stderr.read() if serve.stderr else ""
            assert time.monotonic() < deadline, "serve never opened its socket"
            time.sleep(0.1)
        second = cli("serve", check=1)
        assert "already running: another scheduler (pid" in second.stderr

        # submit --wait: the id, then the exit status follows the job's
        ok = cli("submit", spec(tmp_path, "hello", "command: sh -c 'echo hello from $FT_JOB_ID'\n"), "--wait")
        job_id = int(ok.stdout.split()[0])
        assert "succeeded" in ok.stderr
        assert cli("logs", str(job_id)).stdout == f"hello from {job_id}\n"
        document = cli.json("logs", str(job_id))
        assert document == {"job": job_id, "attempt": 1, "rank": 0, "node": "node01", "lines": [f"hello from {job_id}"]}
        (node,) = cli.json("nodes")  # through the scheduler, as probe
        assert node["name"] == "node01" and node["state"] == "healthy"
        assert [r["name"] for r in cli.json("probe")] == ["node01"]
        failed = cli("submit", spec(tmp_path, "fails", "command: sh -c 'exit 4'\n"), "--wait", "--json", check=1)
        assert json.loads(failed.stdout)["status"] == "error"

        # the failure raised an alert: acknowledge it, then resolve it
        failed_id = json.loads(failed.stdout)["id"]
        (alert,) = cli.json("alerts")
        assert (alert["kind"], alert["job"], alert["state"]) == ("job_failed", failed_id, "open")
        me = current_user()
        acked = cli("alerts", "ack", str(alert["id"])).stdout
        assert acked == f"alert {alert['id']} job_failed (job {failed_id}): acknowledged by {me}\n"
        assert f"acknowledged ({me})" in cli("alerts").stdout
        (resolved,) = cli.json("alerts", "resolve", str(alert["id"]))
        assert (resolved["state"], resolved["resolved_by"]) == ("resolved", me)
        assert cli.json("alerts") == [] and [a["id"] for a in cli.json("alerts", "--all")] == [alert["id"]]
        assert "needs at least one alert id" in cli("alerts", "ack", check=2).stderr
        assert "invalid choice: '7'" in cli("alerts", "7", check=2).stderr
        assert cli("alerts", "resolve", "999", check=2).stderr == "ftconsole: not found: no alert 999\n"

        long_id = cli.json("submit", spec(tmp_path, "long", "command: sleep 300\ngpus_per_node: 2\n"))["id"]
        queued_id = cli.json("submit", spec(tmp_path, "next", "command: 'true'\ngpus_per_node: 2\n"))["id"]
        cli.until(long_id, {"running"})
        listing = {j["id"]: j for j in cli.json("jobs")}
        assert listing[long_id]["status"] == "running" and listing[queued_id]["status"] == "queued"
        assert "position 1" in listing[queued_id]["message"]
        assert [j["name"] for j in cli.json("jobs", "--status", "queued")] == ["next"]
        assert [j["name"] for j in cli.json("jobs", "--name", "ell")] == ["hello"]
        prediction = cli.json("predict", spec(tmp_path, "third", "command: 'true'\ngpus_per_node: 1\n"))
        assert prediction["starts_now"] is False and prediction["ahead"] == [str(queued_id)]

        assert cli.json("priority", str(queued_id), "urgent")[0]["priority"] == "urgent"
        table = cli("jobs").stdout
        assert "ID" in table.splitlines()[0] and "long" in table
        clone_id = cli.json("clone", str(job_id))["id"]
        assert cli.json("show", str(clone_id))["cloned_from"] == job_id

        stopped = cli.json("stop", str(long_id))
        assert stopped[0]["stop_reason"] == "stopped"
        assert cli.until(long_id, {"stopped"})["conditions"][-1]["type"] == "Stopped"
        assert cli.until(queued_id, {"succeeded"})["status"] == "succeeded"

        deleted = cli.json("delete", str(job_id), str(long_id))
        assert [j["id"] for j in deleted] == [job_id, long_id]
        assert job_id not in [j["id"] for j in cli.json("jobs")]

        # errors: what is wrong, where, and a non-zero exit
        missing = cli("show", "999", check=2)
        assert missing.stderr == "ftconsole: not found: no job 999\n"
        bad = cli("submit", spec(tmp_path, "bad", "command: KEY=1 python3 train.py\n"), check=2)
        assert "bad.yaml:2: command:" in bad.stderr
        assert cli("extend", str(queued_id), "1h", check=2).stderr.startswith("ftconsole: bad input: job")
        events = cli.json("events", str(long_id))
        assert {"Pending", "Creating", "Stopping", "Stopped", "Deleted"} <= {e["kind"] for e in events}
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(TIMEOUT)
        finally:
            if serve.stderr:
                serve.stderr.close()
    assert serve.returncode == 0
    assert not (sock_dir / "ft.sock").exists()


def test_cli_without_a_scheduler_refuses_job_commands_unless_local(setup) -> None:
    cli, tmp_path, sock_dir = setup
    job = spec(tmp_path, "later", "command: 'true'\n")
    for wait in ([], ["--wait"]):
        refused = cli("submit", job, *wait, check=3)
        assert refused.stderr.startswith("ftconsole: not running: no scheduler is serving ")
        assert f"(nothing answers on {sock_dir / 'ft.sock'})" in refused.stderr
        assert "`ftconsole serve`" in refused.stderr and "--local" in refused.stderr
        assert refused.stdout == ""
    assert cli.json("jobs") == []  # nothing was queued; listings read the store without a scheduler

    submitted = cli("submit", job, "--local", "--json")
    assert "no scheduler is serving" in submitted.stderr and "(--local)" in submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    assert [(j["id"], j["status"]) for j in cli.json("jobs")] == [(job_id, "queued")]
    for command in (["stop", str(job_id)], ["priority", str(job_id), "urgent"], ["clone", str(job_id)]):
        assert "no scheduler is serving" in cli(*command, check=3).stderr
    assert cli("stop", str(job_id), "--local").stdout.strip() == f"job {job_id} later: stop requested, stopped"
    assert cli("logs", str(job_id), check=2).stderr.endswith("has not started: no logs yet\n")
    assert "give one or the other" in cli("logs", str(job_id), "--json", "--follow", check=2).stderr
    assert [e["kind"] for e in cli.json("events", str(job_id), "--limit", "1")] == ["Stopped"]


def test_cli_submit_local_wait_runs_a_scheduler_until_the_job_ends(setup) -> None:
    cli, tmp_path, sock_dir = setup
    done = cli("submit", spec(tmp_path, "here", "command: sh -c 'echo ran here'\n"), "--local", "--wait")
    job_id = int(done.stdout.split()[0])
    assert "running one in this process until the job ends" in done.stderr
    assert f"job {job_id} succeeded" in done.stderr
    assert not (sock_dir / "ft.sock").exists()  # the one-off scheduler is gone with the command
    assert cli("logs", str(job_id)).stdout == "ran here\n"
    assert "no scheduler is serving" in cli("submit", spec(tmp_path, "after", "command: 'true'\n"), check=3).stderr


def test_cli_scale_an_elastic_job(setup) -> None:
    cli, tmp_path, _ = setup
    fixed = cli.json("submit", spec(tmp_path, "fixed", "command: 'true'\nmode: pytorch\n"), "--local")["id"]
    elastic = spec(
        tmp_path,
        "elastic",
        "command: 'true'\nmode: pytorch\nfault_tolerance:\n  elastic: {min_nodes: 1, max_nodes: 3}\n",
    )
    job_id = cli.json("submit", elastic, "--local")["id"]  # no scheduler runs: it stays queued

    assert "not elastic" in cli("scale", str(fixed), "2", "--local", check=2).stderr
    assert "invalid int value: 'two'" in cli("scale", str(job_id), "two", check=2).stderr
    out_of_range = cli("scale", str(job_id), "4", "--local", check=2).stderr
    assert f"job {job_id} scales from 1 to 3 nodes (fault_tolerance.elastic), not to 4" in out_of_range

    (scaled,) = cli.json("scale", str(job_id), "2", "--local")
    assert (scaled["id"], scaled["nodes"], scaled["elastic"]) == (job_id, 2, {"min_nodes": 1, "max_nodes": 3})
    assert cli("scale", str(job_id), "3", "--local").stdout == f"job {job_id} elastic: scaling to 3 node(s), queued\n"
    shown = cli.json("show", str(job_id))
    assert shown["nodes"] == 3 and [c["type"] for c in shown["conditions"]].count("Scaling") == 2
