"""Alerts to a Prometheus Alertmanager (the config's `alertmanager`), so that routing, grouping, silences and paging are
the Alertmanager's, as for every other alert an on-call team already handles.

Alertmanager keeps a view of what fires, which its clients send again and again (as Prometheus does at each
evaluation); an alert not sent again is resolved by it once its `endsAt` has passed. So `serve` runs one `Sync`
beside the control loop: every `interval` (60 s by default), and within `POLL_S` of a change (an alert raised,
acknowledged or resolved), it posts (its v2 API, `POST /api/v2/alerts`) every alert still open or acknowledged,
firing, with `endsAt` three intervals ahead (a scheduler that dies leaves nothing firing for ever), and every alert
resolved since the last post, ended at its resolution. An acknowledged alert still fires (the annotation `acked_by`
says who is on it). A post that fails is tried again at the next poll (2 s); what it would have said is then
said by the next one, as the view is sent whole. Job alerts of jobs that did not opt in (`notify.jobs`) are left
out, as for the other targets.

Each alert's labels: `alertname` (its kind: job_hung, node_unreachable...), `severity`, `ftconsole_id` (its id),
`cluster` (the store's cluster id), `job`, `job_name`, `owner` or `node` where it has them, and the config's
`labels`; annotations: `summary` (the one line the other targets send), `description` (its whole message) and,
once acknowledged, `acked_by`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ftconsole.scheduler.serve.payloads import alert_text, one_line
from ftconsole.scheduler.spec.config import AlertmanagerSettings, ClusterConfig, NotifySettings
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import StoredAlert

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("ftconsole.notify")

POLL_S = 2.0  # how often the store is asked whether the alerts changed
OPEN_MAX = 10_000  # open alerts sent at most (the newest)
RESOLVED_MAX = 1_000  # alerts resolved since the last post sent at most (the newest)
EXPIRY = 3  # intervals after which Alertmanager resolves an alert not sent again


def stamp(t: float) -> str:
    """RFC 3339 in UTC, as Alertmanager reads it."""
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def am_alert(
    alert: StoredAlert,
    *,
    cluster_id: str,
    labels: dict[str, str],
    ends: float,
    job: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One alert as Alertmanager's v2 API takes it (pure). `job`: (its name, its owner)."""
    own: dict[str, str] = {"alertname": alert.kind, "severity": alert.severity, "ftconsole_id": str(alert.id),
                           "cluster": cluster_id}  # fmt: skip
    if alert.job is not None:
        own["job"] = str(alert.job)
        if job is not None:
            own["job_name"], own["owner"] = job
    if alert.node:
        own["node"] = alert.node
    notes = {"summary": alert_text(alert), "description": one_line(alert.message, 4000)}
    if alert.acked_by and alert.state != "resolved":
        notes["acked_by"] = alert.acked_by  # an annotation: labels name the alert, and an ack does not change it
    return {
        "labels": {**labels, **own},
        "annotations": notes,
        "startsAt": stamp(alert.time),
        "endsAt": stamp(ends),
    }


class Sync:
    """Posts the alerts' view to one Alertmanager (see the module's doc); an async context manager."""

    def __init__(
        self,
        settings: AlertmanagerSettings,
        notify: NotifySettings,
        store: Store,
        *,
        poll: float = POLL_S,
        wall: Callable[[], float] = time.time,
        trust_env: bool = True,
    ) -> None:
        self.settings = settings
        self.notify = notify
        self.store = store
        self.poll = poll
        self.wall = wall
        self.trust_env = trust_env
        self.url = settings.url.rstrip("/") + "/api/v2/alerts"
        self.posted: dict[int, str] = {}  # alert id -> its state, as last posted
        self.posted_at: float | None = None
        self.failures = 0  # posts in a row that failed
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._jobs: dict[int, tuple[str, str] | None] = {}  # job id -> (name, owner) when it opted in
        # False once this scheduler's lease may have run out (scheduler.serve.leadership): nothing is posted, as
        # the notifications' dispatcher does; the next leader keeps the Alertmanager in sync
        self.may_send: Callable[[], bool] = lambda: True

    async def __aenter__(self) -> Sync:
        import httpx

        agent = {"User-Agent": "ftconsole-notify"}
        self._client = httpx.AsyncClient(timeout=self.notify.timeout, follow_redirects=False,
                                         trust_env=self.trust_env, headers=agent)  # fmt: skip
        self._task = asyncio.create_task(self._run(), name="alertmanager")
        log.info("notifications: alerts kept in sync with the Alertmanager at %s every %gs", self.settings.url,
                 self.settings.interval)  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.sync_once()
            except Exception:  # never let a bad read end it (nor serve): log it, try again
                log.exception("alertmanager: syncing the alerts failed; trying again in %gs", self.poll)
            await asyncio.sleep(self.poll)

    async def sync_once(self, *, force: bool = False) -> bool:
        """Post the view if it changed, or the interval is over (or `force`); True when a post was made. Nothing
        while this scheduler may no longer lead (`may_send`)."""
        if not self.may_send():
            return False
        now = self.wall()
        current = [a for a in await self.store.alerts(limit=OPEN_MAX) if await self._wanted(a)]
        states = {a.id: a.state for a in current}
        gone = [i for i in self.posted if i not in states]  # resolved since (or deleted with their job)
        due = self.posted_at is None or now - self.posted_at >= self.settings.interval
        if not (force or due or gone or states != {i: s for i, s in self.posted.items() if i in states}):
            return False
        ended = await self._resolved(gone)
        ends = now + EXPIRY * self.settings.interval
        body = [self._json(a, ends) for a in current] + [self._json(a, a.resolved_at or now) for a in ended]
        if await self._post(body):
            self.posted, self.posted_at, self.failures = states, now, 0
            return True
        return False

    async def _resolved(self, ids: Sequence[int]) -> list[StoredAlert]:
        if not ids:
            return []
        wanted = set(ids)
        recent = await self.store.alerts(states=["resolved"], limit=RESOLVED_MAX)
        return [a for a in recent if a.id in wanted]

    def _json(self, alert: StoredAlert, ends: float) -> dict[str, Any]:
        job = self._jobs.get(alert.job) if alert.job is not None else None
        return am_alert(alert, cluster_id=self.store.cluster_id, labels=self.settings.labels, ends=ends, job=job)

    async def _wanted(self, alert: StoredAlert) -> bool:
        """Node alerts always; a job's only when it opted in (`notify.jobs`)."""
        if alert.job is None:
            return True
        if alert.job not in self._jobs:
            job = await self.store.job(alert.job)
            opted = job is not None and (self.notify.jobs == "all" or job.spec.notify)
            self._jobs[alert.job] = (job.name, job.owner) if opted and job is not None else None
        return self._jobs[alert.job] is not None

    async def _post(self, body: list[dict[str, Any]]) -> bool:
        import httpx

        assert self._client is not None
        try:
            response = await self._client.post(self.url, content=json.dumps(body).encode(),
                                               headers={"Content-Type": "application/json"})  # fmt: skip
        except httpx.HTTPError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if response.is_success:
            return True
        self._failed(f"HTTP {response.status_code}: {one_line(response.text, 200)}")
        return False

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 30 == 0:  # once, then about once a minute
            log.warning("alertmanager at %s: cannot post the alerts (%d tries in a row): %s", self.settings.url,
                        self.failures, why)  # fmt: skip


@contextlib.asynccontextmanager
async def running(config: ClusterConfig, store: Store, **options: Any) -> AsyncIterator[Sync | None]:
    """The sync for `serve`, running while inside; None when no Alertmanager is set."""
    if config.alertmanager is None:
        yield None
        return
    async with Sync(config.alertmanager, config.notify, store, **options) as sync:
        yield sync
