"""Notifications: each new alert sent to people, through a webhook (a JSON POST; a Slack or Mattermost incoming
hook works as is, it reads the `text` field) and a command (an argv list run with the alert JSON on stdin, for
mail or SMS gateways; never through a shell).

`serve` runs one `Dispatcher` beside the control loop (`running`). It polls the store for alerts with an id
above the last one it read, leaves out job alerts of jobs that did not opt in (`notify.jobs`), and hands each
notification to every target in a task of its own: a slow or dead target never holds up the loop, the API or
the other target. A failed try is tried again after 1 s, 2 s, 4 s ... (`notify.retries`); one whose last try
failed is logged (with what the target answered) and written as a `notify-failed` event, so operators see it in
`ftconsole events`; the event, which every user reads, says only what failed (`DeliveryFailed`), no answer's body.

Delivery is at least once across restarts: the store keeps a cursor per target (`Store.notify_cursors`), the id
of the last alert up to which every alert is done for it (accepted by the target, given up with its
`notify-failed` event, or not for it), advanced only then. A scheduler starts after each target's cursor, so an
alert raised while none ran, or just before a crash, or still being tried (or held by the rate limit) when it
stopped, goes out at the next start; one accepted just before a crash, before its cursor moved, may go out
twice. That second one carries the same key (`notification_key` in the JSON, and the webhook's
`Idempotency-Key` header: the cluster id and the alert ids), so a receiver can drop it. A target met for the
first time starts after the newest alert stored: nothing old is sent to it.

Only new alerts are sent, not their acknowledgement or resolution (those are events, made by a person or by
ftconsole itself; the console and `ftconsole alerts` show them).

What is sent is text a job's user may have written (a run's error, a job's name): every text of a notification is
sent without control characters (`usertext.clean`), and its `text`, what a chat hook shows, is escaped as Slack's
message formatting asks (`&`, `<`, `>` as `&amp;`, `&lt;`, `&gt;`; `chat_escape`), so that `<!channel>`,
`<!here>`, `<@U123>` or a link written by a user reach the channel as plain text, never as a mention or a link.
The other fields (`message`, ...) carry the plain text.

The pure parts are tested from tables: the payloads (`alert_payload`, `coalesced_payload`) and the rate limit
(`Throttle`): at most `rate_limit` notifications in any minute; the alerts over it are held and go out together
as one "N more alerts" notification as soon as the limit allows: never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
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

from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.serve.payloads import (
    AlertInfo,
    alert_payload,
    coalesced_payload,
    id_ranges,
    notification_key,
    one_line,
)
from ftconsole.scheduler.spec.config import NotifySettings
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import StoredAlert

if TYPE_CHECKING:  # httpx is imported when a webhook is set: the CLI, which imports this module, never needs it
    import httpx

log = logging.getLogger("ftconsole.notify")
RECORD_AT_STOP_S = 5.0  # how long a stopping dispatcher waits to record the notifications its targets accepted

FAILED_EVENT = "notify-failed"  # the event of a notification whose every try failed
WINDOW_S = 60.0  # rate_limit counts notifications per this many seconds
POLL_S = 2.0  # how often the store is asked for new alerts (the loop's default tick)
BACKOFF_S = 1.0  # the first retry waits this long, each next one twice as long
BODY_LOGGED = 200  # characters of a webhook's error body, a command's stderr, kept in the log (never in an event)
PARALLEL_PER_TARGET = 4  # notifications in flight to one target at a time
READ_PAGE = 500  # alerts read from the store at a time (a long downtime may have left many to send)


class DeliveryFailed(FtError):
    """One try to reach a target failed; `retry`: a later try may succeed (not so for a 404, say). The message
    goes into a `notify-failed` event, which every user reads: it says only what failed (an HTTP status and its
    standard reason, a command's exit, a network error); `detail`, what the target answered (a webhook's error
    body, a command's stderr: it may echo the notification's alerts, a token or the receiver's internals), goes
    to the scheduler's log only."""

    title = "notification failed"

    def __init__(self, message: str, *, retry: bool = True, detail: str = "") -> None:
        super().__init__(message)
        self.retry = retry
        self.detail = detail


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
    key: str  # its cursor's name in the store: "webhook" or "command" (a config has one of each at most)

    async def send(self, body: bytes, key: str) -> None:
        """Deliver one notification (`key`: the same each time these alerts are sent); DeliveryFailed if it did
        not arrive."""


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
        self.key = "webhook"  # not the URL: a new token in it is the same target, which goes on where it was

    async def send(self, body: bytes, key: str) -> None:
        import httpx

        try:
            headers = {**self.headers, "Idempotency-Key": key}  # the same on a resend: a receiver may drop it
            response = await self.client.post(self.url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise DeliveryFailed(f"no answer in time ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            text = str(exc).replace(self.url, url_origin(self.url))  # the URL's path is a secret
            raise DeliveryFailed(f"{type(exc).__name__}: {text}") from exc
        if response.is_success:
            return
        code = response.status_code
        # the status's standard reason, not the server's own phrase (any text it likes); its body: the log's only
        reason = f"HTTP {code} {_phrase(code)}".rstrip()
        text = response.text[: BODY_LOGGED * 4].replace(self.url, url_origin(self.url))  # echoed, the path is secret
        answer = one_line(text, BODY_LOGGED) if response.content else ""
        raise DeliveryFailed(reason, retry=code >= 500 or code in (408, 429), detail=answer)


def _phrase(code: int) -> str:
    """The standard reason phrase of an HTTP status ("Internal Server Error"); "" for a status without one."""
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return ""


class CommandTarget:
    """An argv run with the JSON on stdin (no shell); exit 0 is delivered. It runs in a session of its own,
    killed whole when it outlives the timeout."""

    def __init__(self, argv: Sequence[str], timeout: float) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.name = f"command {os.path.basename(self.argv[0])}"
        self.key = "command"

    async def send(self, body: bytes, key: str) -> None:  # the key is in the JSON: `notification_key`
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
            tail = one_line(err.decode(errors="replace")[-BODY_LOGGED * 4 :], BODY_LOGGED)
            how = f"exit {code}" if code > 0 else f"signal {-code}"
            raise DeliveryFailed(how, detail=tail)  # its stderr (a curl's may hold the answer's body): the log's only


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# -- the dispatcher (I/O) ----------------------------------------------------------------------------------


class Dispatcher:
    """Polls the store for new alerts and sends them (see the module's doc). Use as an async context manager:
    each target's cursor is read from the store on entry (a new target's is set after the newest alert stored),
    the polling task runs until exit; on exit, notifications still in flight are cancelled (their alerts go out
    at the next start: their cursors have not passed them)."""

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
        self.after = 0  # the id of the last alert read
        self.targets: list[Target] = []
        self._start: dict[str, int] = {}  # target key -> its cursor at the start: alerts up to it are not for it
        self._cursor: dict[str, int] = {}  # target key -> its cursor as stored
        self._pending: dict[str, set[int]] = {}  # target key -> ids of alerts handed to it and not done yet
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._recording: set[asyncio.Task[None]] = set()  # the cursor moves of accepted notifications (`_deliver`)
        self._slots: dict[str, asyncio.Semaphore] = {}
        # False once this scheduler's lease may have run out (scheduler.serve.leadership): nothing more is sent, and
        # the cursors stay where they are, so the next leader sends what this one did not
        self.may_send: Callable[[], bool] = lambda: True

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
            await self._load_cursors()
        except BaseException:
            await self._close_client()
            raise
        self._task = asyncio.create_task(self._run(), name="notify")
        log.info(
            "notifications: alerts after %s go to %s (job alerts: %s; at most %d a minute)",
            ", ".join(f"#{self._start[t.key]} to {t.name}" for t in self.targets),
            ", ".join(t.name for t in self.targets),
            s.jobs,
            s.rate_limit,
        )
        return self

    async def _load_cursors(self) -> None:
        """Each target goes on after its cursor in the store; a target without one (new) after the newest alert,
        its cursor written now so that an alert raised after this start is never missed by the next one."""
        stored = await self.store.notify_cursors()
        newest = await self.store.newest_alert_id()
        for target in self.targets:
            start = stored.get(target.key)
            if start is None:
                start = newest
                await self.store.set_notify_cursor(target.key, start, now=self.wall())
            self._start[target.key] = self._cursor[target.key] = start
            self._pending[target.key] = set()
        self.after = min(self._start.values(), default=newest)

    async def __aexit__(self, *exc: object) -> None:
        tasks = [t for t in (self._task, *self._deliveries) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._recording:  # a clean stop still records what its targets accepted (bounded: the store may be gone)
            await asyncio.wait(self._recording, timeout=RECORD_AT_STOP_S)
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
        """Read the alerts after the last one read, keep those to send, send what the rate limit lets out, and
        move the targets' cursors over what is done."""
        while True:
            alerts = await self.store.alerts_after(self.after, limit=READ_PAGE)
            infos = [await self._info(alert) for alert in alerts]  # a failed read here: all of them again next time
            wanted = []
            for alert, info in zip(alerts, infos, strict=True):
                owed = [t.key for t in self.targets if alert.id > self._start[t.key]]
                if info is not None and owed:
                    wanted.append(info)
                    for key in owed:
                        self._pending[key].add(alert.id)
            if alerts:
                self.after = alerts[-1].id
            for batch in self.throttle.admit(wanted, self.clock()):
                self._send(batch)
            if len(alerts) < READ_PAGE:
                break
        await self._advance()

    async def _advance(self) -> None:
        """Move each target's cursor in the store to just before its oldest alert not done yet (or to the last
        alert read, when none is pending): never past an alert that may still have to go out."""
        for target in self.targets:
            key = target.key
            pending = self._pending[key]
            upto = max(min(pending) - 1 if pending else self.after, self._start[key])
            if upto <= self._cursor[key]:
                continue
            try:
                await self.store.set_notify_cursor(key, upto, now=self.wall())
            except Exception:  # the next delivery or poll tries again; until then a restart may send some twice
                log.exception("notifications: cannot record the cursor of %s", target.name)
                continue
            self._cursor[key] = max(self._cursor[key], upto)

    async def _info(self, alert: StoredAlert) -> AlertInfo | None:
        """The alert with its job's name and owner; None for a job alert whose job did not opt in."""
        if alert.job is None:
            return AlertInfo(alert)  # node alerts always go out
        job = await self.store.job(alert.job)
        if self.settings.jobs == "opted-in" and (job is None or not job.spec.notify):
            return None
        return AlertInfo(alert, job.name if job else None, job.owner if job else None)

    def _send(self, batch: Batch[AlertInfo]) -> None:
        """Hand the batch to every target, each getting the alerts of it past its own cursor at the start (they
        differ only after a restart that found one target further on than the other)."""
        bodies: dict[tuple[int, ...], bytes] = {}
        for target in self.targets:
            items = tuple(i for i in batch.items if i.alert.id > self._start[target.key])
            if not items:
                continue
            mine = Batch(items, coalesced=batch.coalesced and len(items) > 1)
            ids = tuple(i.alert.id for i in items)
            key = notification_key(self.store.cluster_id, ids)
            if ids not in bodies:
                bodies[ids] = json.dumps({**self._payload(mine), "notification_key": key}).encode()
            task = asyncio.create_task(self._deliver(target, mine, bodies[ids], key), name=f"notify {target.name}")
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

    def _payload(self, batch: Batch[AlertInfo]) -> dict[str, Any]:
        if batch.coalesced:
            return coalesced_payload(batch.items, self.store.cluster_id, rate_limit=self.settings.rate_limit)
        return alert_payload(batch.items[0], self.store.cluster_id)

    async def _done(self, target: Target, batch: Batch[AlertInfo]) -> None:
        """The batch is done for the target (accepted, or given up with its event): its cursor may move on."""
        self._pending[target.key].difference_update(i.alert.id for i in batch.items)
        await self._advance()

    async def _deliver(self, target: Target, batch: Batch[AlertInfo], body: bytes, key: str) -> None:
        what = _describe(batch)
        tries = 1 + self.settings.retries
        async with self._slots[target.name]:
            for n in range(1, tries + 1):
                if not self.may_send():
                    log.info("notification of %s to %s not sent: not leading (the leader sends it)", what, target.name)
                    return
                try:
                    await target.send(body, key)
                except DeliveryFailed as exc:
                    failure = exc
                    final = n == tries or not exc.retry
                    log.warning(
                        "notification of %s to %s failed (try %d of %d%s): %s%s",
                        what,
                        target.name,
                        n,
                        tries,
                        ", the last" if final else "",
                        exc,
                        f"; it answered: {exc.detail}" if exc.detail else "",
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
                    # recorded even when the dispatcher stops meanwhile (`__aexit__` waits for it): accepted, it
                    # must not go out again at the next start
                    recording = asyncio.create_task(self._done(target, batch))
                    self._recording.add(recording)
                    recording.add_done_callback(self._recording.discard)
                    await asyncio.shield(recording)
                    return
        await self._record_failure(target, batch, what, n, failure)
        await self._done(target, batch)  # given up: the notify-failed event says so, a restart does not try again

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
    return f"{len(batch.items)} alerts coalesced (#{id_ranges([i.alert.id for i in batch.items])})"


@contextlib.asynccontextmanager
async def running(settings: NotifySettings, store: Store, **options: Any) -> AsyncIterator[Dispatcher | None]:
    """The dispatcher for `serve`, running while inside; None (and nothing runs) when no target is set."""
    if settings.webhook is None and settings.command is None:
        yield None
        return
    async with Dispatcher(settings, store, **options) as dispatcher:
        yield dispatcher
