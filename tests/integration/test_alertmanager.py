"""Alerts kept in sync with a real Prometheus Alertmanager (Debian's prometheus-alertmanager, started by the test
on 127.0.0.1 with clustering off): an alert raised in the store fires there with its labels and annotations, an
acknowledgement adds the annotation `acked_by`, a resolution ends it there; a job alert of a job that did not opt
in never goes; an Alertmanager that is down is caught up with once it is back."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.serve.alertmanager import Sync, am_alert, stamp
from ftconsole.scheduler.spec.config import AlertmanagerSettings, NotifySettings
from ftconsole.scheduler.store.db import Store
from tests.integration.test_notify import job_alert, node_alert, until

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
WAIT = 30.0

pytestmark = pytest.mark.skipif(BINARY is None, reason="no prometheus-alertmanager (apt-get install it; .ci/run does)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Alertmanager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "am.yml").write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [str(BINARY), f"--config.file={self.root / 'am.yml'}", f"--storage.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="]  # fmt: skip
        self.log = (self.root / "am.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"alertmanager not ready: {(self.root / 'am.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.log.close()
            self.proc = None

    def alerts(self) -> list[dict[str, Any]]:
        """What it has firing now (its v2 API)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as answer:
            return list(json.loads(answer.read()))


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    am = Alertmanager(tmp_path)
    am.start()
    try:
        yield am
    finally:
        am.stop()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "state.db") as s:
        yield s


def firing(am: Alertmanager) -> dict[str, dict[str, Any]]:
    return {a["labels"]["ftconsole_id"]: a for a in am.alerts() if a["status"]["state"] == "active"}


async def test_alerts_fire_are_acknowledged_and_end_in_a_real_alertmanager(
    alertmanager: Alertmanager, store: Store
) -> None:
    settings = AlertmanagerSettings(url=alertmanager.url, interval=60, labels={"team": "infra"})
    await node_alert(store, "gpu07")
    await job_alert(store, notify=False)  # a job that did not opt in: its alert does not go
    async with Sync(settings, NotifySettings(), store, poll=0.1, trust_env=False):
        shown = await until(lambda: firing(alertmanager), lambda f: "1" in f, "the node alert firing")
        assert set(shown) == {"1"}
        alert = shown["1"]
        assert alert["labels"] == {"alertname": "node_unreachable", "severity": "error", "ftconsole_id": "1",
                                   "cluster": store.cluster_id, "node": "gpu07", "team": "infra"}  # fmt: skip
        assert alert["annotations"]["description"] == "gpu07 is unreachable: refused"
        assert alert["annotations"]["summary"].startswith("[ftconsole] ERROR node_unreachable #1: ")

        await store.ack_alerts([1], by="ann", now=time.time())
        await until(lambda: firing(alertmanager), lambda f: f["1"]["annotations"].get("acked_by") == "ann", "the ack")

        await store.resolve_alerts([1], by="ann", now=time.time())
        await until(lambda: firing(alertmanager), lambda f: "1" not in f, "the alert ended")
    ended = [a for a in alertmanager.alerts() if a["labels"]["ftconsole_id"] == "1"]
    assert all(a["status"]["state"] != "active" for a in ended), ended


async def test_a_sync_no_longer_leading_posts_nothing(alertmanager: Alertmanager, store: Store) -> None:
    """Two head nodes: once its lease may have run out, a leader's sync posts nothing (the next leader's does)."""
    settings = AlertmanagerSettings(url=alertmanager.url, interval=60)
    await node_alert(store, "gpu03")
    async with Sync(settings, NotifySettings(), store, poll=0.1, trust_env=False) as sync:
        sync.may_send = lambda: False
        assert await sync.sync_once(force=True) is False
        await asyncio.sleep(0.5)  # time enough for a wrong post
        assert firing(alertmanager) == {}
        sync.may_send = lambda: True
        await until(lambda: firing(alertmanager), lambda f: "1" in f, "the alert once it leads")


async def test_an_alertmanager_that_was_down_gets_the_alerts_once_it_is_back(
    alertmanager: Alertmanager, store: Store
) -> None:
    alertmanager.stop()
    settings = AlertmanagerSettings(url=alertmanager.url, interval=60)
    async with Sync(settings, NotifySettings(), store, poll=0.1, trust_env=False) as sync:
        await node_alert(store, "gpu01")
        await until(lambda: sync.failures, lambda n: n >= 2, "posts that fail while it is down")
        await asyncio.to_thread(alertmanager.start)
        shown = await until(lambda: firing(alertmanager), lambda f: "1" in f, "the alert once it is back")
        assert shown["1"]["labels"]["node"] == "gpu01"


def test_an_alert_fires_until_three_intervals_after_its_last_post_and_a_resolved_one_ended_when_resolved() -> None:
    from ftconsole.scheduler.store.records import StoredAlert

    alert = StoredAlert(id=7, time=1_700_000_000.0, kind="job_hung", severity="warning", job=12, node=None,
                        message="job 12 (train, ann) suspected hung", state="resolved", acked_by="bob",
                        acked_at=None, resolved_at=1_700_000_100.0, resolved_by="ftconsole", data={})  # fmt: skip
    doc = am_alert(alert, cluster_id="c1", labels={"team": "ml"}, ends=alert.resolved_at or 0, job=("train", "ann"))
    assert doc["labels"] == {"team": "ml", "alertname": "job_hung", "severity": "warning", "ftconsole_id": "7",
                             "cluster": "c1", "job": "12", "job_name": "train", "owner": "ann"}  # fmt: skip
    assert (doc["startsAt"], doc["endsAt"]) == ("2023-11-14T22:13:20Z", stamp(1_700_000_100.0))
