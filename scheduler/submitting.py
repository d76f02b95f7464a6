"""Group commit: the writes that arrive while one is being committed go into the next transaction together.

A submit is answered once it is on disk, and the disk's flush is most of its time (SQLite's WAL with
synchronous FULL, PostgreSQL's commit). Written one transaction each, concurrent submits wait for each other's
flush; written together, they share one. Each part runs in a savepoint of its own (`JobTx.savepoint`): a part
that fails (a quota, a cap, a value the store refuses) rolls back its own writes and fails its own caller, the
others are committed. A part is written in the order it arrived, and each sees what the parts before it
wrote (a cap counts the jobs submitted just before in the same transaction). A caller that goes away before its
part is written (cancelled) leaves it out. A lone write waits for nobody: the first starts a transaction at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.jobtx import JobTx

T = TypeVar("T")
Part = Callable[[JobTx], Awaitable[Any]]


class GroupCommit(Generic[T]):
    def __init__(self, store: Store, what: str) -> None:
        self.store = store
        self.what = what
        self._pending: list[tuple[Part, asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.transactions = 0  # committed or not: how many the parts took (the tests' and benchmarks' count)

    async def write(self, part: Callable[[JobTx], Awaitable[T]]) -> T:
        """`part(tx)` written in a transaction, with the others that arrive meanwhile; its result, or its error."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((part, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await done

    async def _drain(self) -> None:
        while self._pending:
            batch = [(part, done) for part, done in self._pending if not done.cancelled()]
            self._pending = []
            if batch:
                await self._commit(batch)

    async def _commit(self, batch: list[tuple[Part, asyncio.Future[Any]]]) -> None:
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        what = self.what if len(batch) == 1 else f"{self.what} ({len(batch)} at once)"
        self.transactions += 1
        try:
            async with self.store.jobs_tx(what) as tx:
                if len(batch) == 1:  # alone: its failure is the transaction's, no savepoint needed
                    outcomes.append((batch[0][1], await batch[0][0](tx), None))
                else:
                    for part, done in batch:
                        self.store.forget()  # its reads (a cap, a quota) see the parts before it
                        try:
                            async with tx.savepoint():
                                outcomes.append((done, await part(tx), None))
                        except Exception as refused:  # this part alone: the others go on
                            outcomes.append((done, None, refused))
        except BaseException as exc:  # nothing was written (the commit failed, the store is gone...): each is told
            for _, done in batch:
                if not done.done():
                    done.cancel() if isinstance(exc, asyncio.CancelledError) else done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for done, value, error in outcomes:
            if done.done():
                continue
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(value)
