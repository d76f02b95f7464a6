"""Job arrays: one submit, many tasks (Slurm's `--array`): the `array` key and the names of tasks.

`array: 0-99%8` makes 100 tasks, indexes 0 to 99, at most 8 running at once. The indexes are a comma-separated
list of `N`, `N-M` or `N-M:STEP`; `%LIMIT` (optional) caps the tasks of the array that run at once. Each task
is a job of its own (its own id, attempts, runs, output folder and log) that knows its array (the id of its
first task, which names the whole array) and its index (`FT_ARRAY_INDEX`). Users name the array by that id
(`12`), one task by `12[7]`.

The throttle is decide/arrays.py.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_TASKS = 10_000  # tasks one array may have
MAX_INDEX = 1_000_000  # the largest index

_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_REF = re.compile(r"\s*#?(\d+)\[(\d+)\]\s*")


@dataclass(frozen=True, slots=True)
class Array:
    indexes: tuple[int, ...]  # in the order given, each once
    limit: int | None  # the most tasks running at once; None: no limit

    def __str__(self) -> str:
        return f"{_ranges(self.indexes)}{'' if self.limit is None else f'%{self.limit}'}"


@functools.lru_cache(maxsize=1024)  # every queued task of an array asks for its own, each placement pass
def parse(text: str) -> Array:
    """`0-99%8`, `1,3,5-7`, `0-30:10%2`; ValueError saying what is wrong."""
    body, percent, limit_text = str(text).strip().partition("%")
    limit = None
    if percent:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"{text!r}: the limit after % must be a whole number of at least 1")
        limit = int(limit_text)
    indexes: list[int] = []
    for item in body.split(","):
        found = _ITEM.fullmatch(item.strip())
        if found is None:
            raise ValueError(f"{text!r}: {item.strip()!r} is not N, N-M or N-M:STEP (e.g. 0-99%8, 1,3,5-7)")
        first = int(found[1])
        last = int(found[2]) if found[2] is not None else first
        step = int(found[3]) if found[3] is not None else 1
        if last < first:
            raise ValueError(f"{text!r}: {item.strip()!r} ends before it starts")
        if step < 1:
            raise ValueError(f"{text!r}: {item.strip()!r}: the step must be at least 1")
        if last > MAX_INDEX:
            raise ValueError(f"{text!r}: indexes go up to {MAX_INDEX:,}")
        if len(indexes) + (last - first) // step + 1 > MAX_TASKS:
            raise ValueError(f"{text!r}: more than {MAX_TASKS:,} tasks")
        indexes.extend(range(first, last + 1, step))
    if len(set(indexes)) != len(indexes):
        twice = sorted(i for i, n in Counter(indexes).items() if n > 1)[:3]
        raise ValueError(f"{text!r}: index {', '.join(map(str, twice))} given twice")
    return Array(tuple(indexes), limit)


def ref(text: str) -> tuple[int, int] | None:
    """`12[7]` -> (12, 7): a task named by its array and index; None for anything else."""
    found = _REF.fullmatch(str(text))
    return None if found is None else (int(found[1]), int(found[2]))


def task_name(array_id: int, index: int) -> str:
    return f"{array_id}[{index}]"


def _ranges(indexes: Sequence[int]) -> str:
    """1,2,3,5,7,8 -> '1-3,5,7-8'."""
    parts: list[str] = []
    i = 0
    while i < len(indexes):
        j = i
        while j + 1 < len(indexes) and indexes[j + 1] == indexes[j] + 1:
            j += 1
        parts.append(str(indexes[i]) if i == j else f"{indexes[i]}-{indexes[j]}")
        i = j + 1
    return ",".join(parts)
