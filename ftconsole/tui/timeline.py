"""The queue as a timeline (pure): each running job until its time limit, each queued job from its expected start
(the scheduler's `forecast`: its own placement passes run forward) to its expected end, reservations as bands,
by pool; what has no expected start last, with why. `timelineview.py` draws it.

A row is a `Bar` (a job, or the tasks of an array that wait alike) or a `Band` (a reservation). `cells` turns a
row into the characters of the chart for a window of time (`Window`: the time at its left edge and the seconds
per column), `axis` the line of times above it. The symbols tell the kinds apart without colour (`SYMBOLS`).
"""

from __future__ import annotations

import math
import operator
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.tui import rows as R

NOT_FORESEEN = "no expected start"
# what each kind of row is drawn with, its role (rows.PALETTES) and the legend's word
SYMBOLS: dict[str, tuple[str, str, str]] = {
    "running": ("█", "ok", "running, until its time limit"),
    "expected": ("▒", "warn", "queued: expected start to end"),
    "preemptible": ("▚", "info", "preemptible (marked before its name)"),
    "reserved": ("╱", "info", "reservation"),
    "maintenance": ("╳", "odd", "maintenance"),
}
OPEN_END = "→"  # a job without a time limit runs past the right edge
NOW_MARK = "┊"
STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)  # seconds per column
TICKS = (300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800)  # seconds between labels
LABEL_COLUMNS = 40


@dataclass(frozen=True, slots=True)
class Bar:
    key: str  # the row's key: a job's id, or `array:12` for an array's tasks that have no expected start
    label: str
    kind: str  # running | expected | none
    start: float | None = None
    end: float | None = None  # None: no time limit (or no start)
    preemptible: bool = False
    note: str = ""  # what the line under the chart says of it


@dataclass(frozen=True, slots=True)
class Band:
    name: str
    label: str
    start: float
    end: float
    maintenance: bool = False


Row = Bar | Band


@dataclass(frozen=True, slots=True)
class Group:
    title: str
    rows: tuple[Row, ...]
    note: str = ""  # a line after the rows


@dataclass(frozen=True, slots=True)
class Window:
    left: float  # the time at the chart's first column
    step: float  # seconds per column
    width: int  # columns

    def column(self, when: float) -> float:
        return (when - self.left) / self.step


def clock(ts: float, now: float) -> str:
    """`14:50`, or `Mon 14:50` past the next 24 hours."""
    return time.strftime("%H:%M" if ts - now < 86400 else "%a %H:%M", time.localtime(ts))


def step_words(step: float) -> str:
    """60 -> `1 min`, 7200 -> `2 h`, 86400 -> `1 day`."""
    if step >= 86400:
        return f"{step / 86400:g} day"
    return f"{step / 3600:g} h" if step >= 3600 else f"{step / 60:g} min"


def _shape(job: Mapping[str, Any]) -> str:
    gpus = job.get("gpus_per_node")
    return f"{job.get('nodes') or 1}×{gpus if gpus is not None else '?'}"


def _label(ref: Any, name: str, owner: str, shape: str, preemptible: bool) -> str:
    mark = SYMBOLS["preemptible"][0] if preemptible else " "
    return f"{ref!s:>8} {mark}{name[:16]:<16} {owner[:6]:<6} {shape}"


class Rows:
    """Builds the timeline's groups, keeping each job's row until its record, its expected times or the day
    changes: an update over 10,000 jobs builds the rows of the few that changed."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, Bar]] = {}
        self._running: dict[int, Mapping[str, Any]] = {}  # the running jobs, by id

    def groups(
        self,
        jobs: Mapping[int, Mapping[str, Any]],
        forecast: Mapping[str, Any] | None,
        reservations: Sequence[Mapping[str, Any]],
        now: float,
        changed: Collection[int] | None = None,
    ) -> list[Group]:
        """The timeline's rows by pool (pools in name order; in each, reservations, then running jobs by their
        end, then queued ones in queue order), and last the queued jobs with no expected start (an array's that
        wait alike as one row). The pools are the forecast's (`nodes`: each node's pool). `changed`: the jobs
        changed since the last call (None: look at every job), to find the running ones among them."""
        if changed is None:
            self._running = {i: j for i, j in jobs.items() if j.get("status") == "running"}
        else:
            for job_id in changed:
                job = jobs.get(job_id)
                if job is not None and job.get("status") == "running":
                    self._running[job_id] = job
                else:
                    self._running.pop(job_id, None)
        forecast = forecast or {}
        pool_of: Mapping[str, str] = forecast.get("nodes") or {}
        by_pool: dict[str, list[Row]] = {pool: [] for pool in sorted(set(pool_of.values()))}
        ends = {e["id"]: e["end"] for e in forecast.get("running", ())}
        kept, self._kept = self._kept, {}
        day = int(now // 3600)  # what a row says of a time depends on how far ahead it is: built again each hour
        running = []  # (when it ends, or inf; its id; the job; its end): each end worked out once
        for job_id, job in self._running.items():
            end = ends[job_id] if job_id in ends else _limit(job)
            running.append((end or math.inf, job_id, job, end))
        running.sort(key=_by_end)
        for _, _, job, end in running:
            bar = self._bar(kept, job, (end, day), _running_bar, job, end, now)
            names = job.get("node_names") or []
            by_pool.setdefault(pool_of.get(names[0], "default") if names else "default", []).append(bar)
        unknown: list[Bar] = []
        waiting = 0  # jobs with no expected start (an array's alike are one row)
        tasks: dict[int, list[Mapping[str, Any]]] = {}
        for entry in forecast.get("queued", ()):
            queued = jobs.get(entry["id"])
            if queued is None or queued.get("status") != "queued":
                continue
            job = queued
            if entry["start"] is None:
                waiting += 1
                array = job.get("array_id")
                if array is not None:
                    tasks.setdefault(int(array), []).append(job)
                    if len(tasks[int(array)]) > 1:
                        continue
                why = entry.get("message") or job.get("message") or "not worked out"
                unknown.append(self._bar(kept, job, why, _unknown_bar, job, why))
                continue
            key = (entry["start"], entry["end"], tuple(entry["nodes"]), day, entry["start"] > now + 1)
            bar = self._bar(kept, job, key, _expected_bar, job, entry, now)
            by_pool.setdefault(pool_of.get(entry["nodes"][0], "default") if entry["nodes"] else "default", []).append(
                bar
            )
        for reservation in reservations:
            if reservation.get("end", 0) <= now or reservation.get("state") == "ended":
                continue
            names = list(reservation.get("nodes") or ())
            for pool in sorted({pool_of.get(n, "default") for n in names}):
                here = [n for n in names if pool_of.get(n, "default") == pool]
                band = Band(reservation["name"], _band_label(reservation, here), reservation["start"],
                            reservation["end"], bool(reservation.get("maintenance")))  # fmt: skip
                by_pool.setdefault(pool, []).insert(0, band)
        counts = Counter(pool_of.values())
        out = [Group(_pool_title(pool, rows, counts[pool]), tuple(rows)) for pool, rows in by_pool.items()]
        beyond = forecast.get("beyond") or {}
        past = int(beyond.get("count") or 0)
        if unknown or past:
            rows = [_array_bar(bar, tasks) for bar in unknown]
            note = f"and {past:,} more queued jobs: {beyond.get('message') or ''}" if past else ""
            count = waiting + past
            out.append(Group(f"{NOT_FORESEEN}  {count:,} job{'s' * (count != 1)}", tuple(rows), note))
        return out

    def _bar(
        self, kept: dict[int, tuple[Any, Bar]], job: Mapping[str, Any], key: Any, build: Callable[..., Bar], *args: Any
    ) -> Bar:
        """The job's row as kept, where its record (the same object: the feed replaces a changed job's) and `key`
        are those it was built of; else `build(*args)`."""
        found = kept.get(job["id"])
        bar = found[1] if found is not None and found[0][0] is job and found[0][1] == key else build(*args)
        self._kept[job["id"]] = ((job, key), bar)
        return bar


def groups(
    jobs: Mapping[int, Mapping[str, Any]],
    forecast: Mapping[str, Any] | None,
    reservations: Sequence[Mapping[str, Any]],
    now: float,
) -> list[Group]:
    """`Rows.groups` with nothing kept from an earlier update."""
    return Rows().groups(jobs, forecast, reservations, now)


def _running_bar(job: Mapping[str, Any], end: float | None, now: float) -> Bar:
    ref, preemptible = job.get("ref") or job["id"], bool(job.get("preemptible"))
    until = f"its time limit ends it at {clock(end, now)}" if end is not None else "no time limit"
    names = R.compress_names(job.get("node_names") or [])
    note = f"job {ref} {job['name']} ({job['owner']}): running on {names}; {until}"
    label = _label(ref, job["name"], job["owner"], _shape(job), preemptible)
    return Bar(str(job["id"]), label, "running", job.get("started") or now, end, preemptible, note)


def _expected_bar(job: Mapping[str, Any], entry: Mapping[str, Any], now: float) -> Bar:
    ref, preemptible = job.get("ref") or job["id"], bool(job.get("preemptible"))
    at = clock(entry["start"], now) if entry["start"] > now + 1 else "now (the next pass)"
    until = f" to {clock(entry['end'], now)}" if entry["end"] is not None else ", with no time limit"
    note = f"job {ref} {job['name']} ({job['owner']}): expected from {at}{until} on {R.compress_names(entry['nodes'])}"
    label = _label(ref, job["name"], job["owner"], _shape(job), preemptible)
    return Bar(str(job["id"]), label, "expected", entry["start"], entry["end"], preemptible, note)


def _unknown_bar(job: Mapping[str, Any], why: str) -> Bar:
    ref = job.get("ref") or job["id"]
    label = _label(ref, job["name"], job["owner"], _shape(job), bool(job.get("preemptible")))
    return Bar(str(job["id"]), label, "none", note=f"job {ref} {job['name']} ({job['owner']}): {NOT_FORESEEN}: {why}")


_by_end = operator.itemgetter(0, 1)


def _limit(job: Mapping[str, Any]) -> float | None:
    started, limit = job.get("started"), job.get("max_runtime_s")
    return None if started is None or not limit else float(started) + float(limit)


def _array_bar(bar: Bar, tasks: Mapping[int, Sequence[Mapping[str, Any]]]) -> Bar:
    """The first of an array's tasks with no expected start stands for all of them: one row."""
    for array, alike in tasks.items():
        if len(alike) > 1 and str(alike[0]["id"]) == bar.key:
            first = alike[0]
            label = _label(f"{array}[…]", first["name"], first["owner"], _shape(first), bool(first.get("preemptible")))
            note = bar.note.replace(f"job {first.get('ref') or first['id']}", f"array {array} ({len(alike)} tasks)")
            return Bar(R.array_key(array), label, "none", note=note)
    return bar


def _band_label(reservation: Mapping[str, Any], names: Sequence[str]) -> str:
    """`⌂ maint-gpu03 maint gpu03`: the reservation, for whom (maintenance, a user, a project), its nodes here."""
    who = "maint" if reservation.get("maintenance") else str(reservation.get("user") or reservation.get("project"))
    return f"{'⌂':>8} {reservation['name'][:12]:<12} {who[:6]:<6} {R.compress_names(names, 11)}"


def _pool_title(pool: str, rows: Iterable[Row], count: int) -> str:
    bars = [r for r in rows if isinstance(r, Bar)]
    running = sum(1 for r in bars if r.kind == "running")
    return f"pool {pool}  {count} node{'s' * (count != 1)} · {running} running · {len(bars) - running} expected"


def fit(rows: Iterable[Row], now: float, width: int) -> float:
    """The seconds per column (of `STEPS`) that show every end and start to come within `width` columns, at
    most a day a column."""
    last = now
    for row in rows:
        for t in (row.start, row.end):
            if t is not None and t > last:
                last = t
    span = (last - now) * 1.05
    return float(next((s for s in STEPS if s * max(width, 1) >= span), STEPS[-1]))


def cells(row: Row, window: Window, now: float) -> list[tuple[str, str]]:
    """The row's chart as runs of (text, role): its bar where the window shows it, the now mark elsewhere."""
    if isinstance(row, Bar) and row.kind == "none":
        text = row.note.split(": ", 2)[-1]
        return [(text[: window.width].ljust(window.width), "muted")]
    end: float | None
    if isinstance(row, Band):
        symbol, role = SYMBOLS["maintenance" if row.maintenance else "reserved"][:2]
        start, end = row.start, row.end
    else:
        symbol, role = SYMBOLS[row.kind][:2]
        role = SYMBOLS["preemptible"][1] if row.preemptible else role
        start = max(row.start if row.start is not None else now, now)
        end = row.end
    first = max(0, math.floor(window.column(start)))
    last = window.width if end is None else min(window.width, math.ceil(window.column(end)))
    if end is not None and last <= first < window.width and window.column(end) > 0:
        last = first + 1  # shorter than a column: still seen
    now_col = math.floor(window.column(now))
    chart = [NOW_MARK if i == now_col else " " for i in range(window.width)]
    for i in range(first, last):
        chart[i] = symbol
    if end is None and last == window.width and first < last:
        chart[-1] = OPEN_END
    out: list[tuple[str, str]] = []
    for char in chart:
        role_here = role if char in (symbol, OPEN_END) else "muted"
        if out and out[-1][1] == role_here:
            out[-1] = (out[-1][0] + char, role_here)
        else:
            out.append((char, role_here))
    return out


def axis(window: Window, now: float) -> str:
    """The times above the chart: a label at each round time, at least 10 columns apart."""
    every = next((t for t in TICKS if t / window.step >= 10), TICKS[-1])
    line = [" "] * window.width
    offset = time.localtime(window.left).tm_gmtoff
    tick = math.ceil((window.left + offset) / every) * every - offset
    while True:
        col = math.floor(window.column(tick))
        if col >= window.width:
            break
        label = "│" + clock(tick, now)
        if col >= 0 and col + len(label) <= window.width:
            line[col : col + len(label)] = list(label)
        tick += every
    now_col = math.floor(window.column(now))
    if 0 <= now_col < window.width and line[now_col] == " ":
        line[now_col] = NOW_MARK
    return "".join(line)


def legend() -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    for symbol, role, word in SYMBOLS.values():
        parts += [(symbol * 2, role), (f" {word}   ", "")]
    return [*parts, (f"{OPEN_END} no time limit   {NOW_MARK} now", "")]
