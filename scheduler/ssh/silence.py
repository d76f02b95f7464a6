"""Node silence: how long the loop has waited for each node's answer, and why it gets none.

`NodeSilence` owns, per node: when it last answered a command of the loop (`answered`); since when an answer
about its runs is awaited (`waiting`: the clock of `scheduler.node_timeout`, started by the first unanswered
ask); the SSH error its last unanswered command met (`silence`); and what a fresh TCP connection to it (a
"knock", `SSHPool.knock`) found once half of `node_timeout` went by without an answer (`knocked`). When a
node's clock starts, a timer wakes the loop just after its `node_timeout` runs out, so `reconcile` gives the
node up at once, not at the next tick after (a node's death costs node_timeout, not node_timeout plus up to a
tick). Any answer, an error included, stops the clock and clears the rest.

The executor (executor.py) runs each node command through `ask`, starts the knocks `to_knock` names, and
`forget`s the nodes `reconcile` gave up; the loop hands `waiting`, `answered` and the text of `silence` and
`knocked` to `reconcile` in its `Snapshot`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from ftconsole.scheduler.errors import FtError, SSHError, UnreachableError
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh.transport import REFUSED, Transport

KNOCK_S = 3.0  # at most this long for a fresh TCP connection to a silent node to say whether it hung or died
TIMEOUT_WAKE_MARGIN_S = 0.05  # the wake-up at a node's node_timeout comes this much after it (clocks differ)


class NodeSilence:
    """Each node's answers and silences, and the wake-ups of the loop at their `node_timeout`."""

    def __init__(
        self, transport: Transport, *, clock: Callable[[], float], poke: Callable[[], None], node_timeout: float
    ) -> None:
        self.transport = transport
        self.clock = clock
        self._poke = poke
        self.node_timeout = node_timeout
        self.waiting: dict[str, float] = {}  # node -> since when an answer about its runs is awaited
        self.answered: dict[str, float] = {}  # node -> its last answer
        self.silence: dict[str, SSHError] = {}  # node -> why its last command got no answer (since then)
        self.knocked: dict[str, str] = {}  # node -> what a fresh connection found once it was half silent
        # nodes proven down before node_timeout: their connection was lost and their SSH port refuses
        self.dead: set[str] = set()
        self._deadlines: dict[str, asyncio.TimerHandle] = {}  # node -> the wake-up when its node_timeout runs out

    async def ask(self, name: str, work: Coroutine[Any, Any, Any], *, heartbeat: bool = True) -> Any:
        """Await one command on node `name`, keeping count of whether it answers. With `heartbeat` (a command
        about its runs) the silence clock starts, if it has not: `node_timeout` later the node is given up."""
        if heartbeat:
            self.awaited(name, self.clock())
        try:
            result = await work
        except SSHError as exc:
            if heartbeat:
                self.silence[name] = exc  # no answer: unreachable, timed out, refused us
            raise
        except FtError:
            self.heard(name)  # it answered, with an error
            raise
        self.heard(name)
        return result

    def to_knock(self, now: float) -> list[str]:
        """The nodes (by name) that no knock has asked about yet and that are silent for half of `node_timeout`
        at `now`, or whose connection was lost or refused (a dead node is told from a hung one at once)."""
        half = self.node_timeout / 2
        return [
            name
            for name, since in sorted(self.waiting.items())
            if name not in self.knocked
            and (now - since >= half or isinstance(self.silence.get(name), UnreachableError))
        ]

    async def knock(self, node: Node) -> None:
        """Half of `node_timeout` without an answer: find out whether the node hung or died, for the events."""
        knock = getattr(self.transport, "knock", None)
        found = await knock(node, min(self.node_timeout / 2, KNOCK_S)) if knock is not None else None
        if node.name in self.waiting:
            self.knocked[node.name] = found or ""  # "": nothing to tell (a ProxyJump), not asked again
            lost = isinstance(self.silence.get(node.name), UnreachableError)
            if found is not None and found.startswith(REFUSED) and lost:
                self.dead.add(node.name)  # the loop need not wait for node_timeout
                self._poke()

    def awaited(self, name: str, since: float) -> None:
        """An answer of node `name` is awaited since `since` (a command about its runs was sent, or its channel's
        heartbeat was due): its silence clock starts then, unless it started earlier, and the loop wakes at its
        end."""
        if name in self.waiting and self.waiting[name] <= since:
            return
        self._cancel_deadline(name)
        self.waiting[name] = since
        wait = max(0.0, since + self.node_timeout - self.clock())
        self._deadlines[name] = asyncio.get_running_loop().call_later(wait + TIMEOUT_WAKE_MARGIN_S, self._poke)

    def heard(self, name: str, at: float | None = None) -> None:
        """The node answered (at `at`, else now): its silence clock stops."""
        self.answered[name] = self.clock() if at is None else at
        self._clear(name)

    def forget(self, name: str) -> None:
        """The node was given up: its silence clock starts again with the next ask."""
        self.answered.pop(name, None)
        self._clear(name)

    def close(self) -> None:
        """Cancel the wake-ups still to come."""
        for name in list(self._deadlines):
            self._cancel_deadline(name)

    def _clear(self, name: str) -> None:
        self.dead.discard(name)
        self.waiting.pop(name, None)
        self.silence.pop(name, None)
        self.knocked.pop(name, None)
        self._cancel_deadline(name)

    def _cancel_deadline(self, name: str) -> None:
        handle = self._deadlines.pop(name, None)
        if handle is not None:
            handle.cancel()
