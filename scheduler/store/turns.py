"""Whose turn it is on the store's one connection: a transaction and the statements of everyone else.

The scheduler's tasks share one connection to the store (the loop's passes, each API request, the probes' writes).
A database isolates transactions of different connections, never the statements of one: a read sent while another
task's transaction was half written read it half written (a two-node job running on one node, read between the
inserts of its two runs), and rows a rollback then took back; a statement that wrote joined that transaction, and
went with its rollback.

So a transaction is one context's (the task that began it, and the tasks it starts meanwhile: a context variable
says so), and every other statement on the connection waits until it ends. A transaction in turn waits for the
statements already sent to finish before it begins. Readers are not starved: those waiting when a transaction
ends go before the next one begins, even one its own task begins at once (a placement pass starts its jobs one
transaction each).
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar


class Turns:
    """One connection's turns (`Engine.turns`); the engines call `take` and `give_back` around each transaction, and
    `enter` and `leave` around each statement."""

    def __init__(self) -> None:
        self._mine: ContextVar[object | None] = ContextVar(f"ftconsole-store-transaction-{id(self)}", default=None)
        self._held: object | None = None  # the transaction under way (its token); None: none
        self._ended = asyncio.Event()
        self._ended.set()
        self._running = 0  # statements sent from outside any transaction and not yet answered
        self._waiting = 0  # contexts waiting for a transaction to end
        self._idle = asyncio.Event()
        self._idle.set()

    def whose(self) -> object | None:
        """The transaction under way (a token) where it is this context's; None: none is, or another's."""
        held = self._held
        return held if held is not None and self._mine.get() is held else None

    @property
    def held(self) -> bool:
        return self._held is not None

    async def outside(self) -> None:
        """Until no transaction but this context's own is under way: at once when none is."""
        while self._held is not None and self._mine.get() is not self._held:
            self._waiting += 1
            try:
                await self._ended.wait()
            finally:
                self._waiting -= 1

    async def enter(self) -> bool:
        """Before a statement: wait for another context's transaction to end. True: the statement is counted (it
        runs outside any transaction) and `leave` must follow it."""
        if self._held is not None:
            if self._mine.get() is self._held:
                return False
            await self.outside()
        self._running += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        self._running -= 1
        if not self._running:
            self._idle.set()

    async def take(self) -> None:
        """Before BEGIN: the next transaction is this context's, once another's has ended and the statements sent
        before it are answered."""
        while True:
            await self.outside()
            if self._held is not None:
                raise RuntimeError("a transaction is already under way in this context: transactions do not nest")
            if not self._waiting:
                break
            await asyncio.sleep(0)  # those woken by the last transaction's end go first: they are ready to run
        token = object()
        self._held = token
        self._ended.clear()
        self._mine.set(token)
        try:
            while self._running:
                await self._idle.wait()
        except BaseException:
            self.give_back()
            raise

    def give_back(self) -> None:
        """After COMMIT or ROLLBACK (or a BEGIN that failed): the statements waiting go on."""
        self._held = None
        self._ended.set()
