"""The garbage collector's thresholds for a long-lived process that keeps a large heap (`ftconsole serve` with a deep
queue, the console with 10,000 jobs): its young generation is collected every 50,000 allocations, not Python's 700.

At 700, the transient objects of a placement pass or of a console update lived long enough to be promoted, and the
older generations filled with them, which brought a full collection of the whole heap (0.1 to 0.25 s with 100,000
queued jobs, with the event loop waiting) every 1 to 4 s. With 50,000, most of them are freed by their reference
counts before any collection looks (bench/deepqueue.py and bench/console.py, docs/benchmarks.md).
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 10)


def tune() -> tuple[int, int, int]:
    """Set THRESHOLDS; the thresholds before, to give back."""
    before = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    return before
