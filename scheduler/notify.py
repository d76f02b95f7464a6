"""Notifications: each new alert sent to people, through a webhook (a JSON POST; a Slack or Mattermost incoming
hook works as is, it reads the `text` field) and a command (an argv list run with the alert JSON on stdin, for
mail or SMS gateways; never through a shell).

`serve` runs one `Dispatcher` beside the control loop (`running`). It polls the store for alerts with an id
above the last one it saw (from the newest alert there is at its start, so nothing old is sent again), leaves
out job alerts of jobs that did not opt in (`notify.jobs`), and hands each notification to every target in a
task of its own: a slow or dead target never holds up the loop, the API or the other target. A failed try is
tried again after 1 s, 2 s, 4 s ... (`notify.retries`); one whose last try failed is logged and written as a
`notify-failed` event, so operators see it in `ftconsole events`.

Only new alerts are sent, not their acknowledgement or resolution (those are events, made by a person or by
ftconsole itself; the console and `ftconsole alerts` show them).

The pure parts are tested from tables: the payloads (`alert_payload`, `coalesced_payload`) and the rate limit
(`Throttle`): at most `rate_limit` notifications in any minute; the alerts over it are held and go out together
as one "N more alerts" notification as soon as the limit allows: never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

from ftconsole.scheduler.config import NotifySettings
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.records import StoredAlert
from ftconsole.scheduler.store import ALERT_STATES, Store

if TYPE_CHECKING:  # httpx is imported when a webhook is set: the CLI, which imports this module, never needs it
    import httpx

log = logging.getLogger("ftconsole.notify")

FAILED_EVENT = "notify-failed"  # the event of a notification whose every try failed
WINDOW_S = 60.0  # rate_limit counts notifications per this many seconds
POLL_S = 2.0  # how often the store is asked for new alerts (the loop's default tick)
BACKOFF_S = 1.0  # the first retry waits this long, each next one twice as long
TEXT_MAX = 400  # characters of the one-line summary (`text`)
LISTED_MAX = 100  # alerts listed in a coalesced notification (all are counted, every id is given)
PARALLEL_PER_TARGET = 4  # notifications in flight to one target at a time
SEVERITY_ORDER = ("info", "warning", "error", "critical")


class DeliveryFailed(FtError):
    """One try to reach a target failed; `retry`: a later try may succeed (not so for a 404, say)."""

    title = "notification failed"

    def __init__(self, message: str, *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


# -- what is sent (pure) -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertInfo:
    """An alert with what a reader of the notification wants beside it: its job's name and owner."""

    alert: StoredAlert
    job_name: str | None = None
    owner: str | None = None


def one_line(text: str, most: int = TEXT_MAX) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= most else flat[: most - 1] + "…"


def alert_text(alert: StoredAlert) -> str:
    """`[ftconsole] ERROR job_failed #12: job 7 (llama, ann) failed: ...` (the message names the job or node)."""
    return one_line(f"[ftconsole] {alert.severity.upper()} {alert.kind} #{alert.id}: {alert.message}")


def alert_payload(info: AlertInfo, cluster_id: str) -> dict[str, Any]:
    """The JSON of one alert: `text` (one line, what a chat hook shows) and the alert's own fields, as
    `ftconsole alerts --json` gives them, with the job's name and owner and the cluster id."""
    return {
        "text": alert_text(info.alert),
        **info.alert.to_json(),
        "job_name": info.job_name,
        "owner": info.owner,
        "cluster_id": cluster_id,
    }


def worst_severity(severities: Iterable[str]) -> str:
    known = [s for s in severities if s in SEVERITY_ORDER]
    return max(known, key=SEVERITY_ORDER.index) if known else "error"


def coalesced_payload(infos: Sequence[AlertInfo], cluster_id: str, *, rate_limit: int) -> dict[str, Any]:
    """The JSON of alerts held back by the rate limit, sent as one: `kind` "coalesced", their `count`, every
    id, the worst severity, a count per kind, and the first `LISTED_MAX` of them in brief."""
    alerts = [i.alert for i in infos]
    kinds: dict[str, int] = {}
    for a in alerts:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    per_kind = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    noun = "alert" if len(alerts) == 1 else "alerts"
    severity = worst_severity(a.severity for a in alerts)
    text = (
        f"[ftconsole] {severity.upper()} {len(alerts)} more {noun} (over the limit of {rate_limit} a minute): "
        f"{per_kind}; ids {_id_ranges([a.id for a in alerts])}; see `ftconsole alerts`"
    )
    return {
        "text": one_line(text),
        "kind": "coalesced",
        "severity": severity,
        "count": len(alerts),
        "kinds": kinds,
        "ids": [a.id for a in alerts],
        "alerts": [
            {
                "id": i.alert.id,
                "time": i.alert.time,
                "kind": i.alert.kind,
                "severity": i.alert.severity,
                "job": i.alert.job,
                "node": i.alert.node,
                "message": i.alert.message,
                "job_name": i.job_name,
                "owner": i.owner,
            }
            for i in infos[:LISTED_MAX]
        ],
        "cluster_id": cluster_id,
    }


def _id_ranges(ids: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out: list[str] = []
    for i in sorted(set(ids)):
        if out and i == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


# -- the rate limit (pure) ---------------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True)
class Batch(Generic[T]):
    """One notification: one alert, or (`coalesced`) the several that the rate limit held back."""

    items: tuple[T, ...]
    coalesced: bool = False


class Throttle(Generic[T]):
    """At most `limit` notifications in any `window` seconds. An item that finds no room is held; the held
    ones go out together as one notification at the first room (before any newer item, so the order holds);
    a lone held item goes out as itself. Nothing is dropped. The clock is the caller's."""

    def __init__(self, limit: int, window: float = WINDOW_S) -> None:
        if limit < 1:
            raise ValueError("the rate limit must be at least 1")
        self.limit = limit
        self.window = window
        self._sent: deque[float] = deque()  # when each notification of the current window went out
        self.held: list[T] = []

    def admit(self, items: Iterable[T], now: float) -> list[Batch[T]]:
        """What to send now, in order; call again with no items to let the held ones out."""
        out: list[Batch[T]] = []
        for item in items:
            self._release(now, out)
            if not self.held and self._room(now):
                self._sent.append(now)
                out.append(Batch((item,)))
            else:
                self.held.append(item)
        self._release(now, out)
        return out

    def _room(self, now: float) -> bool:
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()
        return len(self._sent) < self.limit

    def _release(self, now: float, out: list[Batch[T]]) -> None:
        if self.held and self._room(now):
            self._sent.append(now)
            out.append(Batch(tuple(self.held), coalesced=len(self.held) > 1))
            self.held = []


# -- the targets (I/O) -------------------------------------------------------------------------------------


class Target(Protocol):
    name: str  # for logs and events; never a secret (no URL path, no header)

    async def send(self, body: bytes) -> None:
        """Deliver one notification; DeliveryFailed if it did not arrive."""


def url_origin(url: str) -> str:
    """scheme://host[:port] of a URL: a chat hook's path and query are its secret, so logs show only this."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class WebhookTarget:
    """A JSON POST; any 2xx is delivered. Only failures that may pass are tried again: no answer, 5xx, 408 and
    429; not a redirect (not followed) or another 4xx (a wrong URL or token does not heal)."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
        self.client = client
        self.url = url
        self.headers = {"Content-Type": "application/json", **headers}
        self.name = f"webhook {url_origin(url)}"

    async def send(self, body: bytes) -> None:
        import httpx

        try:
            response = await self.client.post(self.url, content=body, headers=self.headers)
        except httpx.TimeoutException as exc:
            raise DeliveryFailed(f"no answer in time ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            text = str(exc).replace(self.url, url_origin(self.url))  # the URL's path is a secret
            raise DeliveryFailed(f"{type(exc).__name__}: {text}") from exc
        if response.is_success:
            return
        code = response.status_code
        reason = f"HTTP {code} {response.reason_phrase}".rstrip()
        snippet = one_line(response.text, 200) if response.text else ""
        raise DeliveryFailed(reason + (f": {snippet}" if snippet else ""), retry=code >= 500 or code in (408, 429))


class CommandTarget:
    """An argv run with the JSON on stdin (no shell); exit 0 is delivered. It runs in a session of its own,
    killed whole when it outlives the timeout."""

    def __init__(self, argv: Sequence[str], timeout: float) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.name = f"command {os.path.basename(self.argv[0])}"

    async def send(self, body: bytes) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise DeliveryFailed(f"cannot run {self.argv[0]}: {exc.strerror or exc}") from exc
        try:
            _, err = await asyncio.wait_for(proc.communicate(body), self.timeout)
        except TimeoutError:
            _kill_session(proc.pid)
            await proc.wait()
            raise DeliveryFailed(f"still running after {self.timeout:g}s: killed") from None
        except BaseException:
            _kill_session(proc.pid)
            await proc.wait()
            raise
        code = proc.returncode
        if code != 0:
            assert code is not None  # communicate() waited for it
            tail = one_line(err.decode(errors="replace")[-300:], 200)
            how = f"exit {code}" if code > 0 else f"signal {-code}"
            raise DeliveryFailed(how + (f": {tail}" if tail else ""))


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# -- the dispatcher (I/O) ----------------------------------------------------------------------------------


class Dispatcher:
    """Polls the store for new alerts and sends them (see the module's doc). Use as an async context manager:
    the cursor is set on entry (after the newest alert stored), the polling task runs until exit; on exit,
    notifications still in flight are cancelled."""

    def __init__(
        self,
        settings: NotifySettings,
        store: Store,
        *,
        poll: float = POLL_S,
        window: float = WINDOW_S,
        backoff: float = BACKOFF_S,
        trust_env: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.poll = poll
        self.backoff = backoff
        self.trust_env = trust_env  # HTTP(S)_PROXY and NO_PROXY from the environment, as curl reads them
        self.clock = clock
        self.wall = wall
        self.throttle: Throttle[AlertInfo] = Throttle(settings.rate_limit, window)
        self.after = 0  # the id of the last alert seen
        self.targets: list[Target] = []
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def __aenter__(self) -> Dispatcher:
        s = self.settings
        if s.webhook is not None:
            import httpx

            # httpx logs each request's URL at INFO (`serve` logs INFO): a chat hook's URL holds its token
            for name in ("httpx", "httpcore"):
                if logging.getLogger(name).level == logging.NOTSET:
                    logging.getLogger(name).setLevel(logging.WARNING)
            self._client = httpx.AsyncClient(
                timeout=s.timeout,
                follow_redirects=False,
                trust_env=self.trust_env,
                headers={"User-Agent": "ftconsole-notify"},
            )
            self.targets.append(WebhookTarget(self._client, s.webhook, dict(s.headers)))
        if s.command is not None:
            self.targets.append(CommandTarget(s.command, s.timeout))
        self._slots = {t.name: asyncio.Semaphore(PARALLEL_PER_TARGET) for t in self.targets}
        try:
            newest = await self.store.alerts(states=ALERT_STATES, limit=1)
        except BaseException:
            await self._close_client()
            raise
        self.after = newest[-1].id if newest else 0
        self._task = asyncio.create_task(self._run(), name="notify")
        log.info(
            "notifications: new alerts after #%d go to %s (job alerts: %s; at most %d a minute)",
            self.after,
            ", ".join(t.name for t in self.targets),
            s.jobs,
            s.rate_limit,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = [t for t in (self._task, *self._deliveries) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._close_client()

    async def _close_client(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def in_flight(self) -> int:
        return len(self._deliveries)

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never let a bad read end notifications (or serve): log it, ask again
                log.exception("notifications: reading new alerts failed; trying again in %gs", self.poll)
            await asyncio.sleep(self.poll)

    async def poll_once(self) -> None:
        """Read the alerts newer than the cursor, keep those to send, send what the rate limit lets out."""
        alerts = await self._new_alerts()
        infos = [await self._info(alert) for alert in alerts]  # a failed read here: all of them again next time
        if alerts:
            self.after = alerts[-1].id
        wanted = [info for info in infos if info is not None]
        for batch in self.throttle.admit(wanted, self.clock()):
            self._send(batch)

    async def _new_alerts(self) -> list[StoredAlert]:
        """Alerts with an id above the cursor, oldest first (the store gives the newest `limit`: ask for more
        until the oldest given is one already seen)."""
        limit = 16
        while True:
            newest = await self.store.alerts(states=ALERT_STATES, limit=limit)
            new = [a for a in newest if a.id > self.after]
            if len(new) < len(newest) or len(newest) < limit:
                return new
            limit *= 8

    async def _info(self, alert: StoredAlert) -> AlertInfo | None:
        """The alert with its job's name and owner; None for a job alert whose job did not opt in."""
        if alert.job is None:
            return AlertInfo(alert)  # node alerts always go out
        job = await self.store.job(alert.job)
        if self.settings.jobs == "opted-in" and (job is None or not job.spec.notify):
            return None
        return AlertInfo(alert, job.name if job else None, job.owner if job else None)

    def _send(self, batch: Batch[AlertInfo]) -> None:
        if batch.coalesced:
            payload = coalesced_payload(batch.items, self.store.cluster_id, rate_limit=self.settings.rate_limit)
        else:
            payload = alert_payload(batch.items[0], self.store.cluster_id)
        body = json.dumps(payload).encode()
        for target in self.targets:
            task = asyncio.create_task(self._deliver(target, batch, body), name=f"notify {target.name}")
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

    async def _deliver(self, target: Target, batch: Batch[AlertInfo], body: bytes) -> None:
        what = _describe(batch)
        tries = 1 + self.settings.retries
        async with self._slots[target.name]:
            for n in range(1, tries + 1):
                try:
                    await target.send(body)
                except DeliveryFailed as exc:
                    failure = exc
                    final = n == tries or not exc.retry
                    log.warning(
                        "notification of %s to %s failed (try %d of %d%s): %s",
                        what,
                        target.name,
                        n,
                        tries,
                        ", the last" if final else "",
                        exc,
                    )
                    if final:
                        break
                    await asyncio.sleep(self.backoff * 2 ** (n - 1))
                except Exception as exc:  # a bug of ours must not end the dispatcher: say so, give up this one
                    log.exception("notification of %s to %s failed", what, target.name)
                    failure = DeliveryFailed(f"{type(exc).__name__}: {exc}", retry=False)
                    break
                else:
                    log.debug("notification of %s delivered to %s (try %d)", what, target.name, n)
                    return
        await self._record_failure(target, batch, what, n, failure)

    async def _record_failure(
        self, target: Target, batch: Batch[AlertInfo], what: str, tries: int, failure: DeliveryFailed
    ) -> None:
        alerts = [i.alert for i in batch.items]
        single = alerts[0] if len(alerts) == 1 else None
        message = f"notification of {what} to {target.name} failed after {tries} tr{'y' if tries == 1 else 'ies'}: "
        data = {"target": target.name, "alerts": [a.id for a in alerts], "tries": tries, "error": failure.message}
        try:
            async with self.store.jobs_tx("record a failed notification") as tx:
                await tx.event(
                    self.wall(),
                    FAILED_EVENT,
                    message + failure.message,
                    job=single.job if single else None,
                    node=single.node if single else None,
                    data=data,
                )
        except Exception:
            log.exception("notifications: cannot record the failure of %s to %s", what, target.name)


def _describe(batch: Batch[AlertInfo]) -> str:
    if len(batch.items) == 1:
        a = batch.items[0].alert
        return f"alert #{a.id} ({a.kind})"
    return f"{len(batch.items)} alerts coalesced (#{_id_ranges([i.alert.id for i in batch.items])})"


@contextlib.asynccontextmanager
async def running(settings: NotifySettings, store: Store, **options: Any) -> AsyncIterator[Dispatcher | None]:
    """The dispatcher for `serve`, running while inside; None (and nothing runs) when no target is set."""
    if settings.webhook is None and settings.command is None:
        yield None
        return
    async with Dispatcher(settings, store, **options) as dispatcher:
        yield dispatcher
