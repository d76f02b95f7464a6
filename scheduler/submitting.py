"""Group commit: the writes that arrive while one is being committed go into the next transaction together.

A submit is answered once it is on disk, and the disk's flush is most of its time (SQLite's WAL with
synchronous FULL, PostgreSQL's commit). Written one transaction each, concurrent submits wait for each other's
flush; written together, they share one. A part that fails (a quota, a cap, a value the store refuses) fails its
own caller: its transaction is rolled back and the others are written again without it, in a new one (a
failure costs a second transaction; success, which is the rule, costs no savepoint: two round trips per part on
PostgreSQL). A part is written in the order it arrived, and each sees what the parts before it wrote (a cap
counts the jobs submitted just before in the same transaction: the store's kept reads of a table go as it is
written). A caller that goes away before its part is written (cancelled) leaves it out. A lone write waits for
nobody: the first starts a transaction at once.
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
        while batch:
            refused = await self._try(batch)
            if refused is None:
                return
            index, error = refused  # rolled back: written again without it
            done = batch.pop(index)[1]
            if not done.done():
                done.set_exception(error)
            batch = [(part, done) for part, done in batch if not done.cancelled()]

    async def _try(self, batch: list[tuple[Part, asyncio.Future[Any]]]) -> tuple[int, Exception] | None:
        """Write `batch` in one transaction and answer each part; or, where a part of several failed, roll it all
        back and say which part, with its error."""
        values: list[Any] = []
        refused: tuple[int, Exception] | None = None
        what = self.what if len(batch) == 1 else f"{self.what} ({len(batch)} at once)"
        self.transactions += 1
        try:
            async with self.store.jobs_tx(what) as tx:
                for index, (part, _) in enumerate(batch):
                    try:
                        values.append(await part(tx))
                    except Exception as exc:
                        if len(batch) == 1:  # alone: its failure is the transaction's
                            raise
                        refused = (index, exc)
                        raise _Refused from exc  # the whole transaction rolls back
        except _Refused:
            return refused
        except BaseException as exc:  # nothing was written (a lone part failed, the commit failed...): each is told
            for _, done in batch:
                if not done.done():
                    done.cancel() if isinstance(exc, asyncio.CancelledError) else done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return None
        for (_, done), value in zip(batch, values, strict=True):
            if not done.done():
                done.set_result(value)
        return None


class _Refused(Exception):
    """A part of several failed: its transaction rolls back (`GroupCommit._try`)."""
