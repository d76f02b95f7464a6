"""A node's silence clock (`NodeSilence`): it starts at the earliest moment an answer was awaited, so a late
heartbeat found after a command was sent still counts from when the node was last heard."""

from __future__ import annotations

import asyncio

from ftconsole.scheduler.ssh.silence import NodeSilence


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_clock_starts_at_the_earliest_wait_and_its_wake_up_moves_with_it() -> None:
    clock, woken = _Clock(), asyncio.Event()
    silence = NodeSilence(None, clock=clock, poke=woken.set, node_timeout=0.3)  # type: ignore[arg-type]
    silence.awaited("n1", 100.0)  # a command was sent
    silence.awaited("n1", 100.2)  # another: the clock runs from the first
    assert silence.waiting == {"n1": 100.0}
    clock.now = 100.1
    loop = asyncio.get_running_loop()
    first = silence._deadlines["n1"].when()
    silence.awaited("n1", 99.95)  # its channel was last heard before: the node is silent since then
    after = loop.time()
    assert silence.waiting == {"n1": 99.95} and len(silence._deadlines) == 1
    # the wake-up is now 0.15 s (+ its margin) after this call, no longer at the first deadline
    assert silence._deadlines["n1"].when() <= after + 0.15 + 0.05 + 1e-6 < first
    await asyncio.wait_for(woken.wait(), 5)
    silence.heard("n1")
    assert silence.waiting == {} and silence._deadlines == {}
