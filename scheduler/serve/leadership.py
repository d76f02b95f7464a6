"""Leadership among several `ftconsole serve` sharing one PostgreSQL store (docs/operations.md, Two head nodes).

`Leadership` keeps this scheduler's side of the lease (`scheduler.decide.leadership` decides, `scheduler.store.lease`
reads and writes it) in a task of its own; `serve` runs the control loop, the notifications and the metrics only
while it leads, with the store's writes fenced by its epoch, and stands by otherwise: the API socket stays up,
answers reads from the store and refuses writes naming the leader (`daemon.Operations`).

Each time it leads is a term: a fresh `Scheduler` whose loop starts as after a restart (it reads back the runs
already on the nodes), and ends as soon as the lease may have run out by this process's clock, or another holds
it. Imported only for a PostgreSQL store (it loads asyncpg).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ftconsole.scheduler.decide.leadership import LeaseRow, Step, Timing, decide, fenced
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.spec.config import LoadedConfig
from ftconsole.scheduler.store.lease import LeaseTable

log = logging.getLogger("ftconsole.daemon")

HOLDER_FILE = "lease-holder"  # in state_dir: the random part of its schedulers' lease holder id (`holder_id`)
STANDBY_EPOCH = -1  # the epoch a standby's store checks its writes against: no lease has it, so none is written


class Leadership:
    """This scheduler's side of the lease: `leading()` says, at any instant, whether it may act."""

    def __init__(
        self,
        table: LeaseTable,
        *,
        host: str,
        socket: str,
        timing: Timing,
        me: str | None = None,
        clock: Callable[[], float] = lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
    ) -> None:
        self.table = table
        # the lease holder's id: its state_dir's (`holder_id`), so that a scheduler restarted there takes back its
        # own lease at once; by default one of its own
        self.me = me or secrets.token_hex(8)
        self.host, self.socket = host, socket
        self.timing = timing
        self.clock = clock
        self.epoch: int | None = None  # the epoch this scheduler leads with; None: it stands by
        self.row: LeaseRow | None = None  # the lease as last read
        self._sent: float | None = None  # when the last successful renewal (or the takeover) was sent
        self.changed = asyncio.Event()  # set at each renewal and each change of role
        self.looked = asyncio.Event()  # set once the first step is done

    def leading(self) -> bool:
        return self.epoch is not None and not fenced(self._since_sent(), self.timing)

    def _since_sent(self) -> float | None:
        return None if self._sent is None else self.clock() - self._sent

    def to_json(self) -> dict[str, Any]:
        """The `leadership` field of the status and cluster ops."""
        row = self.row
        leader = None if row is None or row.expired else {"host": row.host, "socket": row.socket, "epoch": row.epoch}
        return {"role": "leader" if self.leading() else "standby", "epoch": self.epoch, "leader": leader}

    def refusal(self, op: str) -> str:
        row = self.row
        if row is None or row.expired:
            where = "no scheduler holds the lease now (one takes it within seconds): try again"
        else:
            where = f"the leader is on {row.host}, socket {row.socket} (epoch {row.epoch}): send it there"
        return f"{op}: this scheduler ({self.host}, {self.socket}) is a standby and makes no changes; {where}"

    async def _ask(self, what: Awaitable[LeaseRow | None]) -> tuple[bool, LeaseRow | None]:
        """(answered, the row) of one statement, bounded by the renewal period."""
        try:
            return True, await asyncio.wait_for(what, timeout=self.timing.renew_s)
        except self.table.errors as exc:
            self.table.drop()
            log.warning("lease: the database did not answer: %s", exc or type(exc).__name__)
            return False, None

    async def step(self) -> Step:
        """Read the lease, decide, and renew, take or let it be (see `decide`)."""
        answered, row = await self._ask(self.table.read())
        if answered:
            self.row = row
        step = decide(row if answered else None, self.me, self.epoch, self._since_sent(), self.timing)
        if step is Step.RENEW:
            assert self.epoch is not None
            sent = self.clock()
            answered, renewed = await self._ask(self.table.renew(self.me, self.epoch, self.timing.lease_s))
            if answered and renewed is None:
                step = Step.FENCE  # another took it between the read and the renewal
            elif answered:
                self.row, self._sent = renewed, sent
                self.changed.set()
            elif fenced(self._since_sent(), self.timing):
                step = Step.FENCE
        elif step is Step.TAKE_OVER:
            sent = self.clock()
            answered, taken = await self._ask(self.table.take(self.me, self.timing.lease_s, self.host, self.socket))
            if answered and taken is not None:
                last = f"{row.host} (epoch {row.epoch})" if row is not None and row.host else "none"
                self.row, self.epoch, self._sent = taken, taken.epoch, sent
                log.warning("leading: took the lease with epoch %s (the last leader: %s)", taken.epoch, last)
                self.changed.set()
            else:
                step = Step.STAND_BY  # another took it first (or the database did not answer)
        if step is Step.FENCE:
            self._fence(row)
        return step

    def _fence(self, row: LeaseRow | None) -> None:
        if row is not None and row.holder and row.holder != self.me:
            held = f"{row.host}, socket {row.socket}, with epoch {row.epoch}"
            why = f"the lease is held by {held}: my epoch {self.epoch} is stale"
        else:
            why = f"no renewal answered for {self.timing.fence_after:g} s: the lease may run out"
        log.warning("no longer leading: %s; nothing more is done here (standing by)", why)
        self.epoch = None
        self.changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Renew (leading) or check (standing by) until `stop`; a leader wakes at the instant it must fence."""
        standing: tuple[str, int] | None = None
        while not stop.is_set():
            try:
                step = await self.step()
            except Exception:  # a bug of ours must not leave a leader renewing blindly: say so, go on
                log.exception("lease: step failed")
                step = Step.HOLD
            self.looked.set()
            row = self.row
            if step is Step.STAND_BY and row is not None and not row.expired and standing != (row.host, row.epoch):
                standing = (row.host, row.epoch)
                log.info("standing by: %s leads (socket %s, epoch %s)", row.host, row.socket, row.epoch)
            delay = self.timing.check_s
            if self.leading():
                delay = min(self.timing.renew_s, self.until_fenced())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.05, delay))

    def until_fenced(self) -> float:
        since = self._since_sent()
        return 0.0 if since is None else max(0.0, self.timing.fence_after - since)

    async def wait_looked(self, stop: asyncio.Event) -> None:
        """Until the first step is done (or `stop`)."""
        waits = [asyncio.ensure_future(self.looked.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def wait_leading(self, stop: asyncio.Event) -> bool:
        """Until this scheduler leads (True) or `stop` (False)."""
        while not stop.is_set():
            if self.leading():
                return True
            self.changed.clear()
            waits = [asyncio.ensure_future(self.changed.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(waits, timeout=self.timing.check_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        return False

    async def wait_lost(self) -> None:
        """Until this scheduler may no longer act: at the latest when its lease may run out by its clock."""
        while self.leading():
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=self.until_fenced())

    async def let_go(self) -> None:
        """A clean stop: the lease let go, so that a standby takes it at its next check."""
        if self.epoch is None or not self.leading():
            return
        epoch, self.epoch = self.epoch, None
        with contextlib.suppress(*self.table.errors):
            await asyncio.wait_for(self.table.let_go(self.me, epoch), timeout=self.timing.renew_s)
            log.info("lease let go (epoch %s)", epoch)


async def serve(
    loaded: LoadedConfig,
    service: ClusterService,
    ops: Any,
    stop: asyncio.Event,
    lead: Callable[[Scheduler, asyncio.Event, Leadership], Awaitable[None]],
    *,
    ready: Callable[[], None] = lambda: None,
) -> None:
    """Stand by, lead while the lease is ours (`lead(scheduler, term_stop, leadership)`: the loop, notifications
    and metrics of one term), stand by again when it is lost, until `stop`. `ops`: the API's `Operations`, whose
    scheduler is each term's; `ready()` once the lease was first read (and taken, where nobody held it)."""
    state = loaded.cluster.state
    assert state is not None
    table = LeaseTable(state.url)
    host = socket.gethostname()
    lease = Leadership(
        table, host=host, socket=str(loaded.socket_path), timing=Timing.of(state.lease), me=holder_id(loaded, host)
    )
    ops.leadership = lease
    store = service.store
    store.fence(STANDBY_EPOCH)
    runner = asyncio.create_task(lease.run(stop))
    refresher = asyncio.create_task(_refresh_standing_by(service, lease, stop))
    scheduler: Scheduler = ops.scheduler
    try:
        await lease.wait_looked(stop)
        ready()
        while await lease.wait_leading(stop):
            if scheduler.loop.ran:
                scheduler = Scheduler(service)  # a new term starts afresh, as after a restart
            store.fence(lease.epoch)
            scheduler.loop.executor.may_act = lease.leading
            ops.scheduler = scheduler
            term = asyncio.Event()
            watcher = asyncio.create_task(_end_term(lease, stop, term))
            try:
                await lead(scheduler, term, lease)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                store.fence(STANDBY_EPOCH)
            if not stop.is_set():
                log.warning("standing by: this scheduler's term is over (see above); it waits to take the lease again")
    finally:
        for task in (runner, refresher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await lease.let_go()
        await table.close()


def holder_id(loaded: LoadedConfig, host: str) -> str:
    """The lease holder's id of the schedulers of this head node's state_dir: `HOST/RANDOM`, the random part made
    once and kept in state_dir (`lease-holder`). One scheduler at a time holds state_dir's lock, so a lease held
    under this id and found by a scheduler just started there is its dead predecessor's: it takes it back at once
    (`decide`) where another head node would wait for it to run out."""
    path = loaded.state_dir / HOLDER_FILE
    try:
        with open(path, "x", encoding="utf-8") as made:  # made once; private, as the rest of state_dir
            os.chmod(path, 0o600)
            made.write(secrets.token_hex(8) + "\n")
    except FileExistsError:
        pass
    return f"{host}/{path.read_text(encoding='utf-8').strip()}"


async def _refresh_standing_by(service: ClusterService, lease: Leadership, stop: asyncio.Event) -> None:
    """A standby runs no loop, which is what reads the leader's writes each tick: the store's kept reads are
    checked here instead, each second, so that a `wait` or a console on a standby sees jobs change."""
    while not stop.is_set():
        if not lease.leading():
            try:
                await service.store.refresh()
            except Exception as exc:  # the database gone: the lease's own log says so
                log.debug("standby: cannot read the store: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)


async def _end_term(lease: Leadership, stop: asyncio.Event, term: asyncio.Event) -> None:
    lost = asyncio.ensure_future(lease.wait_lost())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([lost, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        stopped.cancel()
        term.set()
