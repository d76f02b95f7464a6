"""The metrics endpoint over real HTTP on 127.0.0.1: `serve` with `metrics.listen`, and the endpoint's answers
to scrapers, odd clients and a store that fails. Every wait is bounded; every server is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ftconsole.probes.health import NodeHealth, NodeState
from ftconsole.scheduler.decide.goodput import Goodput
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve import metrics
from ftconsole.scheduler.serve.daemon import serve
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from ftconsole.scheduler.store.db import STORE_FILE, Store
from ftconsole.scheduler.store.records import StoredProbe

WAIT = 10.0  # no step of these tests takes anywhere near this
ME = Caller(uid=1000, gid=1000, pid=1, user="ann")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


async def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET over HTTP (urllib, in a thread): status, headers (lower-case names), body."""

    def get() -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=WAIT) as reply:
                return reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()

    return await asyncio.wait_for(asyncio.to_thread(get), WAIT)


def parse(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def config(tmp_path: Path, sock_dir: Path, listen: str) -> LoadedConfig:
    """Two nodes nothing listens for (the loop never reaches them: one is drained, probing is off)."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "nodes": [{"name": "m[1-2]", "host": "127.0.0.[1-2]", "port": free_port(), "pool": "lab"}],
                "scheduler": {"tick": "0.2s"},
                "api": {"socket": str(sock_dir / "ft.sock")},
                "metrics": {"listen": listen},
            }
        )
    )
    return load_config(path)


async def seed(loaded: LoadedConfig) -> None:
    """m1 drained (so the queued job stays queued) after a probe that read its 2 GPUs; m2 unhealthy."""
    loaded.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    async with await Store.open(loaded.state_dir / STORE_FILE) as store:
        now = time.time()
        m1 = NodeHealth("m1", health=NodeState.HEALTHY, reasons=(), admin=NodeState.DRAINED, last_probe=now)
        m2 = NodeHealth("m2", health=NodeState.UNHEALTHY, reasons=("gpu-health",), last_probe=now)
        gpus = [
            {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "utilization": 42.0, "healthy": True, "temperature": 50.0},
            {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "utilization": 0.0, "healthy": False, "ecc_uncorrectable": 3},
        ]
        await store.save_nodes([(m1, []), (m2, [])], [StoredProbe("m1", now, None, {"gpus": gpus})])


@contextlib.asynccontextmanager
async def serving(loaded: LoadedConfig) -> AsyncIterator[Scheduler]:
    """`serve` in this process, probes off; stopped (bounded) on the way out."""
    stop = asyncio.Event()
    ready: asyncio.Future[Scheduler] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(loaded, stop, ready=ready.set_result, probe=False))
    try:
        yield await asyncio.wait_for(asyncio.shield(ready), WAIT)
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)


async def test_serve_exposes_metrics(tmp_path: Path, sock_dir: Path) -> None:
    port = free_port()
    loaded = config(tmp_path, sock_dir, f"127.0.0.1:{port}")
    await seed(loaded)
    url = f"http://127.0.0.1:{port}/metrics"
    async with serving(loaded) as scheduler:
        submitted = await scheduler.submit(ME, {"name": "wait", "command": "true", "max_runtime": "1h"})
        urgent = {"name": "now", "command": "true", "max_runtime": "1h", "priority": "urgent"}
        await scheduler.submit(ME, urgent)
        status, headers, body = await fetch(url)
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        got = parse(body)

        def value(name: str, **labels: str) -> float | None:
            return got.get((name, frozenset(labels.items())))

        assert value("ftconsole_queue_length", priority="normal") == 1.0
        assert value("ftconsole_queue_length", priority="urgent") == 1.0
        assert value("ftconsole_jobs", status="queued") == 2.0
        assert value("ftconsole_node_state", node="m1", pool="lab", state="drained") == 1.0
        assert value("ftconsole_node_state", node="m1", pool="lab", state="healthy") == 0.0
        assert value("ftconsole_node_state", node="m2", pool="lab", state="unhealthy") == 1.0
        assert value("ftconsole_gpu_utilization_percent", node="m1", gpu="0") == 42.0
        assert value("ftconsole_gpu_healthy", node="m1", gpu="1") == 0.0
        assert value("ftconsole_gpu_ecc_uncorrectable_errors", node="m1", gpu="1") == 3.0
        assert value("ftconsole_restarts_total", result="restarted") == 0.0
        assert value("ftconsole_scheduler_looping") == 1.0

        # values are current at each scrape (once the short reuse window is over)
        await scheduler.stop(ME, [submitted.id])
        await asyncio.sleep(metrics.REUSE_S + 0.1)
        got = parse((await fetch(url))[2])
        assert value("ftconsole_queue_length", priority="normal") == 0.0
        assert value("ftconsole_jobs", status="stopped") == 1.0
    # stopped with serve: nothing listens any more
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)


async def test_serve_runs_on_when_the_port_is_taken(
    tmp_path: Path, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with taken_port() as port, caplog.at_level(logging.ERROR, logger="ftconsole.metrics"):
        loaded = config(tmp_path, sock_dir, f"127.0.0.1:{port}")
        async with serving(loaded) as scheduler:
            job = await scheduler.submit(ME, {"name": "still", "command": "true", "max_runtime": "1h"})
            assert job.id == 1 and scheduler.looping
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in caplog.text


class Source:
    """A collect function for a bare MetricsServer: a snapshot, or an error, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.error: Exception | None = None
        self.snapshot = metrics.Snapshot(counts=metrics.Counts(queued={"urgent": 3}))

    async def __call__(self) -> metrics.Snapshot:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.snapshot


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[metrics.MetricsServer, Source]]:
    source = Source()
    async with metrics.MetricsServer("127.0.0.1", 0, source) as server:
        yield server, source


async def raw(port: int, data: bytes, *, close_write: bool = True) -> bytes:
    """Send bytes as they are, read the whole answer."""
    async with asyncio.timeout(WAIT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(data)
            await writer.drain()
            if close_write:
                writer.write_eof()
            return await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()


async def test_endpoint_answers(endpoint: tuple[metrics.MetricsServer, Source]) -> None:
    server, source = endpoint
    base = f"http://127.0.0.1:{server.port}"
    status, headers, body = await fetch(f"{base}/metrics?debug=1")
    assert status == 200 and parse(body)[("ftconsole_queue_length", frozenset({("priority", "urgent")}))] == 3.0
    assert headers["content-length"] == str(len(body))

    # gzip when asked; OpenMetrics when asked
    status, headers, body = await fetch(f"{base}/metrics", {"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip" and b"ftconsole_queue_length" in gzip.decompress(body)
    status, headers, body = await fetch(f"{base}/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert headers["content-type"].startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert source.calls == 1  # three scrapes within REUSE_S read the store once

    assert (await fetch(f"{base}/"))[0] == 200
    assert (await fetch(f"{base}/other"))[0] == 404
    head = await raw(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")  # no body
    assert (await raw(server.port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
    assert (await raw(server.port, b"hello\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    assert (await raw(server.port, b"GET /metrics HTTP/1.1\r\n")).startswith(b"HTTP/1.1 400 ")  # cut short
    oversized = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (metrics.MAX_HEAD + 10) + b"\r\n\r\n"
    assert (await raw(server.port, oversized)).startswith(b"HTTP/1.1 400 ")
    assert (await fetch(f"{base}/metrics"))[0] == 200  # none of it hurt the server


async def test_a_failing_store_answers_500_and_the_next_scrape_works(
    endpoint: tuple[metrics.MetricsServer, Source], caplog: pytest.LogCaptureFixture
) -> None:
    server, source = endpoint
    url = f"http://127.0.0.1:{server.port}/metrics"
    source.error = StoreError("cannot read the store for metrics: disk I/O error")
    with caplog.at_level(logging.WARNING, logger="ftconsole.metrics"):
        status, _, body = await fetch(url)
    assert status == 500 and b"disk I/O error" in body
    assert "metrics: collection failed" in caplog.text
    source.error = None
    assert (await fetch(url))[0] == 200


async def test_a_slow_client_is_cut_off_and_stopping_closes_every_connection() -> None:
    source = Source()
    server = metrics.MetricsServer("127.0.0.1", 0, source)
    await server.start()
    try:
        async with asyncio.timeout(WAIT):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metr")  # and never more
        await writer.drain()
        await asyncio.sleep(0.1)
    finally:
        async with asyncio.timeout(WAIT):
            await server.close()  # does not wait for the slow client's REQUEST_TIMEOUT_S
    try:
        async with asyncio.timeout(WAIT):
            assert await reader.read() == b""  # closed by the server, without an answer
    finally:
        writer.close()
    assert source.calls == 0


async def test_store_counts_refuse_a_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="for metrics: there is no store"):
        await metrics.StoreCounts.open(tmp_path / "none" / STORE_FILE)


async def test_store_counts_cannot_write(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / STORE_FILE) as store:
        counts = await metrics.StoreCounts.open(store.path)
        try:
            db: Any = counts._db  # the connection itself: this test checks it is read-only
            with pytest.raises(Exception, match="readonly"):
                await db.execute("DELETE FROM jobs")
        finally:
            await counts.close()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
async def test_promtool_accepts_the_goodput_gpu_seconds(endpoint: tuple[metrics.MetricsServer, Source]) -> None:
    """Prometheus' own linter on a real scrape: the goodput in GPU-seconds passes it. The deprecated
    ftconsole_goodput_gpu_hours (kept one release for dashboards) is what it flags, so only the new name is
    checked."""
    server, source = endpoint
    source.snapshot = metrics.Snapshot(counts=metrics.Counts(goodput=Goodput(useful=7200.0, rework=360.0)))
    status, _, body = await fetch(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200
    got = parse(body)
    assert got[("ftconsole_goodput_gpu_seconds", frozenset({("kind", "useful")}))] == 7200.0
    assert got[("ftconsole_goodput_gpu_hours", frozenset({("kind", "useful")}))] == 2.0
    promtool = [str(shutil.which("promtool")), "check", "metrics"]
    done = await asyncio.to_thread(subprocess.run, promtool, input=body, capture_output=True, timeout=WAIT)
    found = (done.stdout + done.stderr).decode()
    assert done.returncode in (0, 3), found  # 3: lint problems found, listed; anything else: promtool failed
    assert "ftconsole_goodput_gpu_seconds" not in found, found
