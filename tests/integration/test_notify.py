"""Notifications end to end on loopback: a real store, a real dispatcher, a real HTTP server on 127.0.0.1 (run by
the test in a thread) and a real command hook (a script that writes its stdin to a file). An alert stored is
POSTed as JSON; a server answering 500 is tried again, then a `notify-failed` event says so; the rate limit
coalesces the rest into one notification; `serve` starts the dispatcher and a node going unreachable reaches the
webhook. Every wait is bounded; every server is stopped."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.errors import StoreError
from ftconsole.scheduler.serve.daemon import serve
from ftconsole.scheduler.serve.notify import FAILED_EVENT, Dispatcher
from ftconsole.scheduler.spec.config import NotifySettings, load_config
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import NewAlert, StoredEvent

WAIT = 15.0
# trust_env off: no proxy from the environment, traffic stays on loopback
FAST: dict[str, Any] = {"poll": 0.05, "backoff": 0.05, "trust_env": False}


class Hook:
    """A webhook on 127.0.0.1: records each POST (path, headers, JSON) and answers with the next status of
    `statuses` (the last one once they run out)."""

    def __init__(self, statuses: list[int], *, body: bytes = b"") -> None:
        self.statuses = statuses
        self.body = body  # what an answer carries
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.lock:
                    hook.posts.append({"path": self.path, "headers": dict(self.headers), "json": json.loads(body)})
                    status = hook.statuses.pop(0) if len(hook.statuses) > 1 else hook.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", str(len(hook.body)))
                self.end_headers()
                self.wfile.write(hook.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hooks/SECRET-TOKEN"

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.posts)


@pytest.fixture
def hook_statuses() -> list[int]:
    return [200]


@pytest.fixture
def hook_body() -> bytes:
    return b""


@pytest.fixture
def hook(hook_statuses: list[int], hook_body: bytes) -> Iterator[Hook]:
    h = Hook(hook_statuses, body=hook_body)
    h.thread.start()
    try:
        yield h
    finally:
        h.server.shutdown()
        h.server.server_close()
        h.thread.join(5)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "state.db") as s:
        yield s


async def until(probe: Callable[[], Any], done: Callable[[Any], bool], what: str, wait: float = WAIT) -> Any:
    """probe() (awaited when it is a coroutine) until done(value), at most `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        value = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {wait:g}s waiting for {what}; last: {value!r}")
        await asyncio.sleep(0.05)


async def node_alert(store: Store, node: str, kind: str = "node_unreachable", severity: str = "error") -> None:
    await store.save_nodes(
        [], alerts=[NewAlert(time.time(), kind, severity, f"{node} is unreachable: refused", node=node)]
    )


async def job_alert(store: Store, *, notify: bool, name: str = "train") -> int:
    spec = JobSpec.from_json({"name": name, "command": "python3 train.py", "notify": notify})
    job = Job(
        id=0, name=name, owner="ann", uid=1000, spec=spec, status=JobStatus.QUEUED, priority="normal",
        project="default", access="none", submitted=time.time(),
    )  # fmt: skip
    async with store.jobs_tx("submit and fail") as tx:
        job_id = await tx.add_job(job)
        await tx.alert(time.time(), "job_failed", "error", f"job {job_id} ({name}, ann) failed: exit 1", job=job_id)
    return job_id


async def failures(store: Store) -> list[StoredEvent]:
    return [e for e in await store.events(limit=1000) if e.kind == FAILED_EVENT]


# -- the webhook ---------------------------------------------------------------------------------------------


async def test_a_new_alert_is_posted_old_ones_are_not(store: Store, hook: Hook) -> None:
    await node_alert(store, "old01")  # stored before the dispatcher starts: never sent
    settings = NotifySettings(webhook=hook.url, headers={"Authorization": "Bearer abc"})
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu01")
        posts = await until(hook.received, lambda p: len(p) >= 1, "the POST")
        await asyncio.sleep(0.3)  # time enough for a wrong second POST
    assert len(hook.received()) == 1
    post = posts[0]
    assert post["path"] == "/hooks/SECRET-TOKEN"
    assert post["headers"]["Authorization"] == "Bearer abc"
    assert post["headers"]["Content-Type"] == "application/json"
    body = post["json"]
    assert body["text"] == f"[ftconsole] ERROR node_unreachable #{body['id']}: gpu01 is unreachable: refused"
    assert (body["kind"], body["severity"], body["node"], body["job"], body["state"]) == (
        "node_unreachable", "error", "gpu01", None, "open",
    )  # fmt: skip
    assert body["cluster_id"] == store.cluster_id
    assert (
        body["notification_key"] == post["headers"]["Idempotency-Key"] == f"ftconsole-{store.cluster_id}-{body['id']}"
    )
    assert await failures(store) == []


async def test_job_alerts_only_of_jobs_that_opted_in(store: Store, hook: Hook) -> None:
    async with Dispatcher(NotifySettings(webhook=hook.url), store, **FAST):
        await job_alert(store, notify=False, name="quiet")
        loud = await job_alert(store, notify=True, name="loud")
        await node_alert(store, "gpu02")  # node alerts always go out
        posts = await until(hook.received, lambda p: len(p) >= 2, "two POSTs")
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 2
    by_kind = {p["json"]["kind"]: p["json"] for p in posts}
    assert (by_kind["job_failed"]["job"], by_kind["job_failed"]["job_name"], by_kind["job_failed"]["owner"]) == (
        loud, "loud", "ann",
    )  # fmt: skip
    assert by_kind["node_unreachable"]["node"] == "gpu02"


async def test_jobs_all_sends_every_job_alert(store: Store, hook: Hook) -> None:
    async with Dispatcher(NotifySettings(webhook=hook.url, jobs="all"), store, **FAST):
        await job_alert(store, notify=False, name="quiet")
        posts = await until(hook.received, lambda p: len(p) >= 1, "the POST")
    assert posts[0]["json"]["job_name"] == "quiet"


@pytest.mark.parametrize("hook_statuses", [[500]])
async def test_a_failing_webhook_is_retried_then_an_event_says_so(
    store: Store, hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = NotifySettings(webhook=hook.url, retries=2)
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu03")
        events = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert len(hook.received()) == 3  # the first try and 2 retries
    event = events[0]
    assert event.node == "gpu03"
    assert event.message.startswith("notification of alert #")
    assert f"to webhook {hook.url.rsplit('/hooks', 1)[0]} failed after 3 tries: HTTP 500" in event.message
    assert "SECRET" not in event.message and "SECRET" not in json.dumps(event.data)  # the hook's path is a secret
    assert event.data["tries"] == 3 and event.data["target"].startswith("webhook http://127.0.0.1:")
    assert "(try 1 of 3): HTTP 500" in caplog.text and "(try 3 of 3, the last)" in caplog.text
    assert "SECRET" not in caplog.text  # not in our log lines, nor in httpx's


@pytest.mark.parametrize("hook_statuses", [[500]])
@pytest.mark.parametrize(
    "hook_body", [b'{"error": "invalid_auth", "token": "xoxb-T0K3N", "echo": "job 7 (secret-run)"}']
)
async def test_a_webhooks_answer_goes_to_the_log_not_to_the_event_every_user_reads(
    store: Store, hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    """The notify-failed event (`ftconsole events` shows it to every user) says the status and its reason; what the
    webhook answered (its body: a token, the alerts it echoes) is in the scheduler's log only."""
    caplog.set_level(logging.INFO)
    async with Dispatcher(NotifySettings(webhook=hook.url, retries=0), store, **FAST):
        await node_alert(store, "gpu03")
        (event,) = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert event.message.endswith("failed after 1 try: HTTP 500 Internal Server Error"), event.message
    assert event.data["error"] == "HTTP 500 Internal Server Error"
    assert "T0K3N" not in json.dumps(event.to_json()) and "secret-run" not in json.dumps(event.to_json())
    assert 'HTTP 500 Internal Server Error; it answered: {"error": "invalid_auth", "token": "xoxb-T0K3N"' in caplog.text


@pytest.mark.parametrize("hook_statuses", [[503, 500, 200]])
async def test_a_retry_that_gets_through_leaves_no_event(store: Store, hook: Hook) -> None:
    async with Dispatcher(NotifySettings(webhook=hook.url), store, **FAST):
        await node_alert(store, "gpu04")
        await until(hook.received, lambda p: len(p) >= 3, "three tries")
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 3
    assert await failures(store) == []


@pytest.mark.parametrize("hook_statuses", [[404]])
async def test_a_404_is_not_tried_again(store: Store, hook: Hook) -> None:
    async with Dispatcher(NotifySettings(webhook=hook.url, retries=3), store, **FAST):
        await node_alert(store, "gpu05")
        events = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert len(hook.received()) == 1
    assert "failed after 1 try: HTTP 404" in events[0].message


async def test_nothing_listens_then_an_event(store: Store) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = NotifySettings(webhook=f"http://127.0.0.1:{port}/x", retries=1, timeout=2)
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu06")
        events = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert "failed after 2 tries: ConnectError" in events[0].message


async def test_a_failed_store_read_loses_no_alert(
    store: Store, hook: Hook, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_job = store.job
    calls = 0

    async def flaky_job(job_id: int) -> Job | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise StoreError("database is locked")
        return await real_job(job_id)

    monkeypatch.setattr(store, "job", flaky_job)
    async with Dispatcher(NotifySettings(webhook=hook.url, jobs="all"), store, **FAST):
        await node_alert(store, "gpu11")
        job_id = await job_alert(store, notify=False)
        posts = await until(hook.received, lambda p: len(p) >= 2, "both alerts, the job's after a second read")
    assert sorted((p["json"]["kind"], p["json"]["job"]) for p in posts) == [
        ("job_failed", job_id), ("node_unreachable", None),
    ]  # fmt: skip
    assert calls >= 2 and "reading new alerts failed" in caplog.text


# -- the rate limit ------------------------------------------------------------------------------------------


async def test_over_the_rate_limit_alerts_are_coalesced_into_one(store: Store, hook: Hook) -> None:
    settings = NotifySettings(webhook=hook.url, rate_limit=2)
    async with Dispatcher(settings, store, window=1.0, **FAST) as dispatcher:
        for i in range(5):
            await node_alert(store, f"gpu{i:02}")
        posts = await until(hook.received, lambda p: len(p) >= 2, "the first two")
        assert len(dispatcher.throttle.held) == 3
        posts = await until(hook.received, lambda p: len(p) >= 3, "the coalesced one", wait=5)
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 3
    singles = [p["json"] for p in posts if p["json"]["kind"] == "node_unreachable"]
    (summary,) = [p["json"] for p in posts if p["json"]["kind"] == "coalesced"]
    assert sorted(s["node"] for s in singles) == ["gpu00", "gpu01"]
    assert summary["count"] == 3
    assert [a["node"] for a in summary["alerts"]] == ["gpu02", "gpu03", "gpu04"]
    assert summary["text"].startswith("[ftconsole] ERROR 3 more alerts (over the limit of 2 a minute)")
    ids = sorted(s["id"] for s in singles) + summary["ids"]
    assert ids == list(range(ids[0], ids[0] + 5))  # every alert, once


# -- the command hook ----------------------------------------------------------------------------------------

WRITE_STDIN = """
import pathlib, sys
out = pathlib.Path(sys.argv[1])
n = len(list(out.glob("*.json")))
data = sys.stdin.buffer.read()
(out / f"{n}.json").write_bytes(data)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "hook.py"
    path.write_text(WRITE_STDIN)
    (tmp_path / "out").mkdir()
    return path


async def test_the_command_gets_the_json_on_stdin(store: Store, script: Path, tmp_path: Path, hook: Hook) -> None:
    out = tmp_path / "out"
    settings = NotifySettings(webhook=hook.url, command=[sys.executable, str(script), str(out)])
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu07", kind="host_key", severity="critical")
        files = await until(lambda: sorted(out.glob("*.json")), lambda f: len(f) >= 1, "the command's file")
        await until(hook.received, lambda p: len(p) >= 1, "the POST too")  # both targets get it
    body = json.loads(files[0].read_bytes())
    assert (body["kind"], body["severity"], body["node"]) == ("host_key", "critical", "gpu07")
    assert body["text"].startswith("[ftconsole] CRITICAL host_key #")
    assert body == hook.received()[0]["json"]


async def test_a_failing_command_is_retried_then_an_event(store: Store, script: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    settings = NotifySettings(command=[sys.executable, str(script), str(out), "3"], retries=1)
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu08")
        events = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert len(list(out.glob("*.json"))) == 2
    assert "to command python" in events[0].message and "failed after 2 tries: exit 3" in events[0].message


async def test_a_command_over_its_timeout_is_killed(store: Store, tmp_path: Path) -> None:
    settings = NotifySettings(command=[sys.executable, "-c", "import time; time.sleep(60)"], retries=0, timeout=0.3)
    started = time.monotonic()
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu09")
        events = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert time.monotonic() - started < 10
    assert "still running after 0.3s: killed" in events[0].message


async def test_a_missing_program_is_an_event(store: Store) -> None:
    settings = NotifySettings(command=["/nonexistent/page-oncall"], retries=0)
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu10")
        events = await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
    assert "cannot run /nonexistent/page-oncall" in events[0].message


# -- serve ---------------------------------------------------------------------------------------------------


async def test_serve_sends_a_node_going_unreachable(
    tmp_path: Path, sock_dir: Path, hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)  # serve's client reads the environment: keep it on loopback
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: the node refuses connections
    config = tmp_path / "cluster.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"ssh: {{config_file: null, known_hosts: {tmp_path / 'known_hosts'}, connect_timeout: 2s}}\n"
        f"nodes:\n  - {{name: dead01, host: 127.0.0.1, port: {port}}}\n"
        f"api: {{socket: {sock_dir / 'ft.sock'}}}\n"
        f"notify: {{webhook: '{hook.url}', retries: 0}}\n"
    )
    stop = asyncio.Event()
    server = asyncio.create_task(serve(load_config(config), stop))
    try:
        posts = await until(hook.received, lambda p: len(p) >= 1, "the unreachable node's alert", wait=30)
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
    body = posts[0]["json"]
    assert (body["kind"], body["node"]) == ("node_unreachable", "dead01")
    assert body["text"].startswith("[ftconsole] ERROR node_unreachable #")


# -- across restarts: at least once, from each target's cursor in the store ----------------------------------


async def test_an_alert_raised_while_no_scheduler_ran_goes_out_at_the_next_start(store: Store, hook: Hook) -> None:
    settings = NotifySettings(webhook=hook.url)
    async with Dispatcher(settings, store, **FAST):  # the first start with this target: its cursor is written
        pass
    await node_alert(store, "gpu20")  # no dispatcher runs (a scheduler crashed, or the CLI wrote it)
    async with Dispatcher(settings, store, **FAST):
        posts = await until(hook.received, lambda p: len(p) >= 1, "the alert raised while none ran")
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 1 and posts[0]["json"]["node"] == "gpu20"
    async with Dispatcher(settings, store, **FAST):  # sent once: the next start has nothing to send
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 1
    assert (await store.notify_cursors())["webhook"] == posts[0]["json"]["id"]


@pytest.mark.parametrize("hook_statuses", [[503]])
async def test_an_alert_still_being_tried_when_it_stopped_goes_out_at_the_next_start(store: Store, hook: Hook) -> None:
    settings = NotifySettings(webhook=hook.url, retries=5)
    async with Dispatcher(settings, store, poll=0.05, backoff=30, trust_env=False):
        await node_alert(store, "gpu21")
        await until(hook.received, lambda p: len(p) >= 1, "the first try (503; the next one in 30 s)")
    cursor = (await store.notify_cursors())["webhook"]
    hook.statuses[:] = [200]
    async with Dispatcher(settings, store, **FAST):
        posts = await until(hook.received, lambda p: len(p) >= 2, "the alert again, after the restart")
        await until(store.notify_cursors, lambda c: c["webhook"] > cursor, "the cursor to move past it")
    assert [p["json"]["node"] for p in posts] == ["gpu21", "gpu21"]
    # sent again after a restart: under the same key, which a receiver may drop it by
    assert posts[0]["headers"]["Idempotency-Key"] == posts[1]["headers"]["Idempotency-Key"]
    assert await failures(store) == []


async def test_a_notification_accepted_as_the_dispatcher_stops_is_recorded_and_not_sent_again(
    store: Store, hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped while it records what its target accepted, a dispatcher still records it: the next start does
    not send it again."""
    recording = asyncio.Event()
    real = store.set_notify_cursor

    async def slow(*args: Any, **kwargs: Any) -> None:
        recording.set()
        await asyncio.sleep(0.5)  # the stop comes in here
        await real(*args, **kwargs)

    settings = NotifySettings(webhook=hook.url)
    async with Dispatcher(settings, store, **FAST):
        monkeypatch.setattr(store, "set_notify_cursor", slow)
        await node_alert(store, "gpu40")
        await asyncio.wait_for(recording.wait(), 30)
    first = hook.received()[0]["json"]["id"]
    assert (await store.notify_cursors())["webhook"] >= first
    monkeypatch.setattr(store, "set_notify_cursor", real)
    async with Dispatcher(settings, store, **FAST):
        await asyncio.sleep(0.5)  # time enough for a wrong second POST
    assert [p["json"]["node"] for p in hook.received()] == ["gpu40"]


async def test_alerts_held_by_the_rate_limit_when_it_stopped_go_out_at_the_next_start(store: Store, hook: Hook) -> None:
    settings = NotifySettings(webhook=hook.url, rate_limit=1)
    async with Dispatcher(settings, store, window=60, **FAST) as dispatcher:
        for i in range(3):
            await node_alert(store, f"gpu3{i}")
        first = (await until(hook.received, lambda p: len(p) >= 1, "the first"))[0]["json"]["id"]
        await until(lambda: len(dispatcher.throttle.held), lambda n: n == 2, "two held")
        # its answer read and recorded (stopped before that, it would be sent again: at least once)
        await until(store.notify_cursors, lambda c: c["webhook"] >= first, "the first one's cursor")
    async with Dispatcher(settings, store, window=60, **FAST):
        posts = await until(hook.received, lambda p: len(p) >= 2, "the held ones, after the restart")
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 2
    assert [posts[0]["json"]["node"], posts[1]["json"]["kind"]] == ["gpu30", "node_unreachable"]
    assert posts[1]["json"]["node"] == "gpu31"  # the first of them alone: the limit lets one out a minute


async def test_each_target_goes_on_from_its_own_cursor(store: Store, script: Path, tmp_path: Path, hook: Hook) -> None:
    """The webhook took alerts the command did not before a restart: the command gets them, the webhook not."""
    out = tmp_path / "out"
    settings = NotifySettings(webhook=hook.url, command=[sys.executable, str(script), str(out)])
    async with Dispatcher(settings, store, **FAST):
        pass
    await node_alert(store, "gpu40")
    newest = await store.newest_alert_id()
    await store.set_notify_cursor("webhook", newest, now=time.time())
    async with Dispatcher(settings, store, **FAST):
        files = await until(lambda: sorted(out.glob("*.json")), lambda f: len(f) >= 1, "the command's file")
        await until(store.notify_cursors, lambda c: c == {"webhook": newest, "command": newest}, "both cursors")
        await asyncio.sleep(0.3)
    assert json.loads(files[0].read_bytes())["node"] == "gpu40"
    assert hook.received() == []


@pytest.mark.parametrize("hook_statuses", [[404]])
async def test_an_alert_given_up_is_not_tried_again_after_a_restart(store: Store, hook: Hook) -> None:
    settings = NotifySettings(webhook=hook.url)
    async with Dispatcher(settings, store, **FAST):
        await node_alert(store, "gpu50")
        await until(lambda: failures(store), lambda e: len(e) == 1, "the notify-failed event")
        await until(store.notify_cursors, lambda c: c["webhook"] == 1, "the cursor past it")
    async with Dispatcher(settings, store, **FAST):
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 1


async def test_serve_killed_while_its_webhook_failed_sends_the_alert_after_its_restart(
    tmp_path: Path, sock_dir: Path
) -> None:
    """`ftconsole serve` raises node_unreachable, its webhook answers 503, and serve is killed (-9) before a
    retry; the next serve sends the alert (the node is still down: no new alert is raised for it)."""
    hook = Hook([503])
    hook.thread.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: the node refuses connections
    config = tmp_path / "cluster.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"ssh: {{config_file: null, known_hosts: {tmp_path / 'known_hosts'}, connect_timeout: 2s}}\n"
        f"nodes:\n  - {{name: dead01, host: 127.0.0.1, port: {port}}}\n"
        f"api: {{socket: {sock_dir / 'ft.sock'}}}\n"
        f"notify: {{webhook: '{hook.url}', retries: 10}}\n"
    )
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.pop("FTCONSOLE_FAILPOINTS", None)

    def serve() -> subprocess.Popen[bytes]:
        with open(tmp_path / "serve.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "ftconsole.cli", "--config", str(config), "serve"],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    proc = serve()
    try:
        await until(hook.received, lambda p: len(p) >= 1, "the first try (503)", wait=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
        hook.statuses[:] = [200]
        tried = len(hook.received())
        proc = serve()
        posts = await until(hook.received, lambda p: len(p) > tried, "the alert after the restart", wait=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(WAIT)
        hook.server.shutdown()
        hook.server.server_close()
        hook.thread.join(5)
    body = posts[-1]["json"]
    assert (body["kind"], body["node"]) == ("node_unreachable", "dead01"), (tmp_path / "serve.log").read_text()
    assert body["id"] == posts[0]["json"]["id"]  # the same alert: not raised again, sent again


async def test_a_dispatcher_no_longer_leading_sends_nothing_and_the_next_leader_sends_it_once(
    store: Store, hook: Hook
) -> None:
    """Two head nodes (docs/operations.md): once its lease may have run out, a leader's dispatcher sends nothing
    and leaves its cursor, so the next leader's sends the alert, once."""
    async with Dispatcher(NotifySettings(webhook=hook.url), store, **FAST) as old:
        old.may_send = lambda: False
        await node_alert(store, "gpu09")
        await asyncio.sleep(0.5)  # time enough for a wrong POST
    assert hook.received() == []
    async with Dispatcher(NotifySettings(webhook=hook.url), store, **FAST):
        posts = await until(hook.received, lambda p: len(p) >= 1, "the POST")
        await asyncio.sleep(0.3)
    assert len(hook.received()) == 1 and posts[0]["json"]["node"] == "gpu09"
