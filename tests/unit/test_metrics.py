"""The metrics of `serve`: the `metrics.listen` key, what a scrape reads from a real store, and its rendering."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.nodeops import ClusterService, NodeView
from ftconsole.scheduler.serve import metrics
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, Node, parse_listen
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.ssh.transport import CommandResult
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import NewAlert, StoredProbe

NOW = 10_000.0
SPEC = JobSpec.from_json({"name": "train", "command": "python3 train.py", "max_runtime": 60})

# ================================================================ the config key


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        (" localhost:9100 ", ("localhost", 9100)),
        ("[::1]:9464", ("::1", 9464)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("head-01.cluster.example:65535", ("head-01.cluster.example", 65535)),
    ],
)
def test_listen_addresses(listen: str, address: tuple[str, int]) -> None:
    assert parse_listen(listen) == address
    settings = ClusterConfig.model_validate({"metrics": {"listen": listen}}).metrics
    assert settings is not None and settings.address == address and settings.listen == listen.strip()


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("127.0.0.1", "give HOST:PORT"),
        (":9464", "give HOST:PORT"),
        (9464, "give HOST:PORT"),
        ("::1:9464", "put an IPv6 address in brackets"),
        ("[fe80::zz]:9464", "is not an IPv6 address"),
        ("999.0.0.1:9464", "is not a host name or IP address"),
        ("-oProxy:9464", "is not a host name or IP address"),
        ("my host:9464", "is not a host name or IP address"),
        ("localhost:0", "not a number from 1 to 65535"),
        ("localhost:65536", "not a number from 1 to 65535"),
        ("localhost:http", "not a number from 1 to 65535"),
        ("localhost:-1", "not a number from 1 to 65535"),
    ],
)
def test_malformed_listen_addresses_are_refused(listen: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ClusterConfig.model_validate({"metrics": {"listen": listen}})


def test_metrics_are_off_without_the_section_and_strict_with_it() -> None:
    assert ClusterConfig.model_validate({}).metrics is None
    assert ClusterConfig.model_validate({"metrics": None}).metrics is None
    with pytest.raises(ValidationError, match="listen"):
        ClusterConfig.model_validate({"metrics": {}})
    with pytest.raises(ValidationError, match="port"):
        ClusterConfig.model_validate({"metrics": {"listen": "127.0.0.1:9464", "port": 9464}})


# ================================================================ a scrape from a real store


class NoTransport:
    """Listing nodes never runs a command on one."""

    async def run(
        self, node: Node, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        raise AssertionError("metrics ran a command on a node")

    async def close(self) -> None:
        pass


def gpu(index: Any, **fields: Any) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA H100 80GB HBM3", **fields}


def job(status: JobStatus, priority: str = "normal", **fields: Any) -> Job:
    base: dict[str, Any] = {
        "id": 0,
        "name": "train",
        "owner": "ann",
        "uid": 1000,
        "spec": SPEC,
        "status": status,
        "priority": priority,
        "project": "default",
        "access": "none",
        "submitted": 1.0,
    }
    return Job(**{**base, **fields})


async def fill(store: Store) -> None:
    """Three configured nodes (n1 probed healthy, n2 drained whose last probe failed, n3 never probed), jobs
    of every kind, attempts that were restarted, requeued, shrunk or just ended, and alerts in each state."""
    n1 = NodeHealth("n1", health=NodeState.HEALTHY, reasons=(), since=1.0, last_probe=NOW - 10)
    n2 = NodeHealth("n2", health=NodeState.HEALTHY, reasons=(), admin=NodeState.DRAINED, last_probe=NOW - 5)
    report = {
        "gpus": [
            gpu(0, utilization=97.0, temperature=61.0, ecc_uncorrectable=0, healthy=True),
            gpu(1, utilization=0, temperature=99.5, ecc_uncorrectable=3, healthy=False),
            gpu(2),  # the probe read nothing of it
            gpu(3, utilization=12.5, ecc_uncorrectable=2),  # no word from the driver, but ECC errors: unhealthy
            gpu(True, utilization=5.0),  # not an index: left out
            "junk",
        ]
    }
    probes = [
        StoredProbe("n1", NOW - 10, None, report),
        StoredProbe("n2", NOW - 60, None, {"gpus": [gpu(0, utilization=50.0)]}),
        StoredProbe("n2", NOW - 5, "unreachable: connection refused", None),
    ]
    alerts = [
        NewAlert(NOW, "node_unhealthy", "error", "n1 was unhealthy", node="n1"),
        NewAlert(NOW, "host_key", "critical", "n2: host key changed", node="n2"),
    ]
    await store.save_nodes([(n1, []), (n2, [])], probes, alerts=alerts)

    ids: dict[str, int] = {}
    async with store.jobs_tx("fill") as tx:
        for name, j in [
            ("q1", job(JobStatus.QUEUED)),
            ("q2", job(JobStatus.QUEUED, requeued=True)),
            ("q3", job(JobStatus.QUEUED, "urgent")),
            ("gone", job(JobStatus.QUEUED, "very-urgent")),
            ("r1", job(JobStatus.RUNNING)),
            ("e1", job(JobStatus.ERROR)),
            ("s1", job(JobStatus.SUCCEEDED)),
        ]:
            ids[name] = await tx.add_job(j)
        await tx.update_job(ids["gone"], deleted=True)  # a deleted job counts nowhere
        results = {"q2": ["requeued"], "r1": ["restarted", "restarted", None], "e1": ["shrunk", "error"], "s1": ["0"]}
        for name, outcomes in results.items():
            for number, result in enumerate(outcomes, start=1):
                attempt = Attempt(ids[name], number, spec_name=None, gpus_per_node=1, master_port=29500, created=NOW)
                run = Run(job=ids[name], attempt=number, rank=0, node="n1", gpus=(0,), run_dir="/r", launch=True)
                await tx.add_attempt(attempt, [run])
                if result is not None:
                    await tx.update_attempt(ids[name], number, ended=NOW, result=result)
        await tx.alert(NOW, "job_failed", "error", "e1 failed", job=ids["e1"])
        await tx.alert(NOW, "job_failed", "error", "an older failure", job=ids["e1"])
        await tx.alert(NOW, "job_hung", "warning", "r1 may hang", job=ids["r1"])
    acked, resolved = (await store.alerts())[-2:]
    await store.ack_alerts([acked.id], by="ann", now=NOW)
    await store.resolve_alerts([resolved.id], by="ann", now=NOW)


def service(tmp_path: Path, store: Store) -> ClusterService:
    config = ClusterConfig.model_validate(
        {"nodes": [{"name": "n[1-3]", "host": "127.0.0.[1-3]", "pool": "gpu"}], "metrics": {"listen": "127.0.0.1:9464"}}
    )
    return ClusterService(LoadedConfig(config, tmp_path / "cluster.yaml"), store, NoTransport(), clock=lambda: NOW)


def samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value, through prometheus_client's own parser."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


async def test_a_scrape_reads_the_store(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "state.db") as store:
        await fill(store)
        counts = await metrics.StoreCounts.open(store.path)
        try:
            snapshot = await metrics.gather(service(tmp_path, store), counts, looping=True)
            again = await metrics.gather(service(tmp_path, store), counts, looping=True)  # the connection is reused
        finally:
            await counts.close()
    assert snapshot.counts == again.counts
    assert snapshot.counts == metrics.Counts(
        jobs={"queued": 3, "running": 1, "error": 1, "succeeded": 1},
        queued={"normal": 2, "urgent": 1},
        restarts={"restarted": 2, "requeued": 1, "shrunk": 1},
        alerts={
            ("node_unhealthy", "error", "open"): 1,
            ("host_key", "critical", "open"): 1,
            ("job_failed", "error", "open"): 1,
            ("job_failed", "error", "acknowledged"): 1,
        },
    )
    assert [(n.name, n.pool, n.state, n.last_probe) for n in snapshot.nodes] == [
        ("n1", "gpu", "healthy", NOW - 10),
        ("n2", "gpu", "drained", NOW - 5),
        ("n3", "gpu", "unknown", None),
    ]
    assert snapshot.gpus == (
        metrics.GpuSample("n1", 0, "NVIDIA H100 80GB HBM3", 97.0, 61.0, 0, healthy=True),
        metrics.GpuSample("n1", 1, "NVIDIA H100 80GB HBM3", 0.0, 99.5, 3, healthy=False),
        metrics.GpuSample("n1", 2, "NVIDIA H100 80GB HBM3", healthy=True),
        metrics.GpuSample("n1", 3, "NVIDIA H100 80GB HBM3", 12.5, None, 2, healthy=False),
    )
    assert snapshot.looping and snapshot.collect_seconds >= 0

    body, content_type = metrics.render(snapshot)
    assert content_type.startswith("text/plain; version=0.0.4")
    got = samples(body)
    # node states: one 1 per node, every state present
    for node, state in [("n1", "healthy"), ("n2", "drained"), ("n3", "unknown")]:
        states = {s.value: value(got, "ftconsole_node_state", node=node, pool="gpu", state=s.value) for s in NodeState}
        assert states == {s.value: (1.0 if s.value == state else 0.0) for s in NodeState}
    assert value(got, "ftconsole_node_last_probe_timestamp_seconds", node="n1") == NOW - 10
    assert value(got, "ftconsole_node_last_probe_timestamp_seconds", node="n3") is None
    # GPUs: from n1's latest report only (n2's latest probe failed: no GPU series for it)
    assert value(got, "ftconsole_gpu_utilization_percent", node="n1", gpu="0") == 97.0
    assert value(got, "ftconsole_gpu_utilization_percent", node="n1", gpu="1") == 0.0
    assert value(got, "ftconsole_gpu_healthy", node="n1", gpu="0") == 1.0
    assert value(got, "ftconsole_gpu_healthy", node="n1", gpu="1") == 0.0
    assert value(got, "ftconsole_gpu_healthy", node="n1", gpu="2") == 1.0
    assert value(got, "ftconsole_gpu_healthy", node="n1", gpu="3") == 0.0
    assert value(got, "ftconsole_gpu_temperature_celsius", node="n1", gpu="1") == 99.5
    assert value(got, "ftconsole_gpu_ecc_uncorrectable_errors", node="n1", gpu="1") == 3.0
    assert value(got, "ftconsole_gpu_info", node="n1", gpu="2", model="NVIDIA H100 80GB HBM3") == 1.0
    read = sorted(k[0] for k in got if ("node", "n1") in k[1] and ("gpu", "2") in k[1])
    assert read == ["ftconsole_gpu_healthy", "ftconsole_gpu_info"]  # what the probe could not read is left out
    assert not [k for k in got if k[0].startswith("ftconsole_gpu_") and ("node", "n2") in k[1]]
    # queue, jobs, restarts, alerts
    queue = {p: value(got, "ftconsole_queue_length", priority=p) for p in ("normal", "urgent", "very-urgent")}
    assert queue == {"normal": 2.0, "urgent": 1.0, "very-urgent": 0.0}
    jobs = {s.value: value(got, "ftconsole_jobs", status=s.value) for s in JobStatus}
    assert jobs == {"queued": 3.0, "running": 1.0, "error": 1.0, "stopped": 0.0, "expired": 0.0, "succeeded": 1.0}
    restarts = {r: value(got, "ftconsole_restarts_total", result=r) for r in ("restarted", "requeued", "shrunk")}
    assert restarts == {"restarted": 2.0, "requeued": 1.0, "shrunk": 1.0}
    assert value(got, "ftconsole_alerts", kind="job_failed", severity="error", state="acknowledged") == 1.0
    assert value(got, "ftconsole_alerts", kind="host_key", severity="critical", state="open") == 1.0
    assert value(got, "ftconsole_alerts", kind="job_hung", severity="warning", state="open") is None  # resolved
    assert value(got, "ftconsole_scheduler_looping") == 1.0


def test_an_empty_snapshot_still_has_the_fixed_series() -> None:
    got = samples(metrics.render(metrics.Snapshot())[0])
    assert value(got, "ftconsole_queue_length", priority="very-urgent") == 0.0
    assert value(got, "ftconsole_jobs", status="running") == 0.0
    assert value(got, "ftconsole_restarts_total", result="restarted") == 0.0
    assert value(got, "ftconsole_scheduler_looping") == 0.0
    assert not [k for k in got if k[0] in ("ftconsole_node_state", "ftconsole_alerts", "ftconsole_gpu_info")]


def test_openmetrics_when_the_scraper_asks_for_it() -> None:
    snapshot = metrics.Snapshot(counts=metrics.Counts(restarts={"requeued": 4}))
    body, content_type = metrics.render(snapshot, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert content_type.startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE ftconsole_restarts counter" in text
    assert 'ftconsole_restarts_total{result="requeued"} 4.0' in text


def test_label_values_are_escaped() -> None:
    node = metrics.NodeSample('we"ird\\node', "p\nool", "healthy", None)
    got = samples(metrics.render(metrics.Snapshot(nodes=(node,)))[0])
    assert value(got, "ftconsole_node_state", node='we"ird\\node', pool="p\nool", state="healthy") == 1.0


def test_node_samples_without_a_probe() -> None:
    view = NodeView(node=Node("n9", "n9", None, None, "default"), health=NodeHealth("n9"), probe=None, now=NOW)
    assert metrics.node_samples([view]) == ((metrics.NodeSample("n9", "default", "unknown", None),), ())


async def test_goodput_covers_the_last_7_days_of_runs(tmp_path: Path) -> None:
    """A job requeued after an hour (no checkpoint), queued 10 minutes, then an hour to success, both attempts on
    4 GPUs within the last day: 4 useful GPU-hours, 4 redone, 40 minutes standing still."""
    now = time.time()
    start = now - 3 * 3600
    async with await Store.open(tmp_path / "state.db") as store:
        async with store.jobs_tx("fill") as tx:
            job_id = await tx.add_job(job(JobStatus.SUCCEEDED))
            for number, (began, ended, result) in enumerate(
                [(start, start + 3600, "requeued"), (start + 4200, start + 7800, "succeeded")], start=1
            ):
                attempt = Attempt(job_id, number, spec_name=None, gpus_per_node=4, master_port=1, created=began)
                run = Run(job=job_id, attempt=number, rank=0, node="n1", gpus=(0, 1, 2, 3), run_dir="/r", launch=True)
                await tx.add_attempt(attempt, [run])
                await tx.update_run(run, started=began, ended=ended, state="exited")
                await tx.update_attempt(job_id, number, ended=ended, result=result)
        counts = await metrics.StoreCounts.open(store.path)
        try:
            found = (await counts.counts()).goodput
        finally:
            await counts.close()
    assert (found.useful, found.rework) == (4 * 3600, 4 * 3600) and round(found.downtime) == 4 * 600
    got = samples(metrics.render(metrics.Snapshot(counts=metrics.Counts(goodput=found)))[0])
    assert value(got, "ftconsole_goodput_ratio") == pytest.approx(4 / (4 + 4 + 4 / 6))
    assert value(got, "ftconsole_goodput_gpu_hours", kind="downtime") == pytest.approx(4 / 6)
    assert value(samples(metrics.render(metrics.Snapshot())[0]), "ftconsole_goodput_ratio") is None  # no GPU time


def test_node_tests_are_counted_by_test_result_and_trigger() -> None:
    tests = {("gpu", "fail", "burn-in"): 2, ("gpu", "pass", "resume"): 5}
    got = samples(metrics.render(metrics.Snapshot(node_tests=tests))[0])
    assert value(got, "ftconsole_node_tests_total", test="gpu", result="fail", trigger="burn-in") == 2.0
    assert value(got, "ftconsole_node_tests_total", test="gpu", result="pass", trigger="resume") == 5.0


def test_returns_to_service_are_counted_with_how_long_the_nodes_were_out() -> None:
    snapshot = metrics.Snapshot(returns={"scheduler": 3, "operator": 1}, out_of_service_s={"scheduler": 900.0})
    got = samples(metrics.render(snapshot)[0])
    assert value(got, "ftconsole_node_returns_total", by="scheduler") == 3.0
    assert value(got, "ftconsole_node_out_of_service_seconds_total", by="scheduler") == 900.0
    assert value(got, "ftconsole_node_out_of_service_seconds_total", by="operator") == 0.0
