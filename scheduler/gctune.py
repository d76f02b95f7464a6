"""The garbage collector's thresholds for a long-lived process that keeps a large heap (`ftconsole serve` with a deep
queue, the console with 10,000 jobs): its young generation is collected every 50,000 allocations, not Python's 700.

At 700, the transient objects of a placement pass or of a console update lived long enough to be promoted, and the
older generations filled with them, which brought a full collection of the whole heap (0.1 to 0.25 s with 100,000
queued jobs, with the event loop waiting) every 1 to 4 s. With 50,000, most of them are freed by their reference
counts before any collection looks (bench/deepqueue.py and bench/console.py, docs/benchmarks.md).

`serving` adds what the scheduler's process needs on top: Python's switch interval at 1 ms instead of 5. At each of
its turns the event loop (a request being answered) waits for the GIL behind the pass's worker threads, up to the
switch interval each time: right after a submit of 10,000 tasks at 100,000 queued, the slowest `show` of five took
0.19 to 0.28 s at 5 ms and 0.11 to 0.21 s at 1 ms (four runs each), for about 5 ms a second more CPU.
"""

from __future__ import annotations

import gc
import sys

THRESHOLDS = (50_000, 20, 10)
SWITCH_INTERVAL_S = 0.001
# a console collects between its updates itself (`between_updates`): the collector's own collections are a
# safety net, should those not come (a young collection every 1,000,000 allocations)
BETWEEN_UPDATES = (1_000_000, 20, 10)
FULL_EVERY = 30  # `between_updates` collects every generation at every 30th call, the young and middle ones else


def serving() -> None:
    """`tune`, and the switch interval of a process that answers requests while its threads compute."""
    tune()
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def tune(thresholds: tuple[int, int, int] = THRESHOLDS) -> tuple[int, int, int]:
    """Set the thresholds (THRESHOLDS); the thresholds before, to give back."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    return before


class BetweenUpdates:
    """The collections of a process that updates a screen once a second (the console): made right after an
    update's frame, where nobody waits for them, instead of in the middle of the next update (a collection of the
    middle generation was 15 to 35 ms of an update's p99 at 1,000 nodes and 10,000 jobs, bench/console.py). The
    collector's own thresholds are raised to BETWEEN_UPDATES, a safety net should these calls stop."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        gc.collect(2 if self.calls % FULL_EVERY == 0 else 1)
