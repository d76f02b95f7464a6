"""The numbered views: Jobs, Nodes, Alerts, Events, Cluster.

A view is a title line (counts, the `/` filter, the age of its data) over a `LineTable`. `update_view` turns
the feed into rows (`rows.py`), filters them and hands them to the table, which redraws only what changed.
Rows that cannot change with the clock (a queued or ended job) are built once and reused until their data
changes, and the Jobs view's update looks only at the jobs that can have changed, so an update over 10,000 jobs
costs what the running ones and the changed ones cost. An array of jobs is one row (`array:12`), built again
when one of its tasks changes or runs; expanded, its tasks' rows (keyed by job id, as any job's) follow it.
"""

from __future__ import annotations

import bisect
import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual.widgets.data_table import ColumnKey

from ftconsole.format import age
from ftconsole.tui import rows as R
from ftconsole.tui.clusterrows import CLUSTER_NODE_COLUMNS, cluster_node_cells
from ftconsole.tui.feed import READ_EVERY_S, Feed
from ftconsole.tui.linetable import LineTable


class View(Vertical):
    """Subclasses set `title`, `columns`, `sources` (what the feed must read for it) and `build`."""

    DEFAULT_CSS = """
    View { height: 1fr; }
    View > .view-title { height: 1; padding: 0 1; background: $boost; }
    """
    title: ClassVar[str] = ""
    columns: ClassVar[Sequence[R.Column]] = ()
    sources: ClassVar[tuple[str, ...]] = ()
    kind: ClassVar[str] = ""  # what a row is: job, node, alert (for the actions that apply)

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.pattern: re.Pattern[str] | None = None
        self.marked: set[str] = set()
        self.table = LineTable(self.columns, id=f"{id}-table")
        self.counts = ""

    def compose(self) -> ComposeResult:
        yield Static(self.title, classes="view-title")
        yield self.table

    def on_mount(self) -> None:
        # the table has its columns by now (children mount first): the content-sized ones get their least width
        for c in self.columns:
            column = self.table.columns.get(ColumnKey(c.key))
            if c.min_width and column is not None and column.auto_width:
                column.content_width = max(column.content_width, c.min_width)

    # -- what subclasses provide ---------------------------------------------------------------------------

    def build(self, feed: Feed, now: float) -> tuple[Mapping[str, R.Row | R.Lazy], list[str]]:
        raise NotImplementedError

    def summary(self, feed: Feed, now: float) -> Text:
        return Text("")

    # -- updating ------------------------------------------------------------------------------------------

    def update_view(self, feed: Feed, now: float) -> None:
        rows, order = self.build(feed, now)
        total = len(order)
        if self.pattern is not None:
            order = [k for k in order if self.pattern.search(R.row_text(rows[k]))]
            rows = {k: rows[k] for k in order}
        self.marked &= rows.keys()
        self.table.apply(rows, order)
        self._title(feed, now, len(order), total)

    def _title(self, feed: Feed, now: float, shown: int, total: int) -> None:
        parts: list[str | Text | tuple[str, str]] = [(self.title, "bold"), "  ", self.summary(feed, now)]
        if self.pattern is not None:
            parts += ["  ", (f"/{self.pattern.pattern}/ {shown} of {total}", "reverse")]
        if self.marked:
            parts += ["  ", (f"{len(self.marked)} marked", "bold")]
        errors = [feed.sources[s].error for s in self.sources if feed.sources[s].error]
        if errors:
            parts += ["  ", (str(errors[0]), R.style("bad"))]
        # the age of what is read at every refresh: a source read less often (the fabric every 30 s) is not late
        ages = [feed.age(s) for s in self.sources if s not in READ_EVERY_S] or [feed.age(s) for s in self.sources]
        known = [a for a in ages if a is not None]
        parts += ["  ", (f"data {age(max(known))} old" if len(known) == len(ages) else "loading…", "dim")]
        set_line(self.query_one(".view-title", Static), Text.assemble(*parts))

    def restyle(self) -> None:
        """The palette changed: cells kept from earlier updates must be built again."""

    def set_filter(self, text: str) -> None:
        """ValueError for an invalid expression (the old filter stays)."""
        self.pattern = R.compile_filter(text)

    def toggle_mark(self, key: str) -> None:
        self.marked ^= {key}

    def targets(self) -> list[str]:
        """What an action applies to: the marked rows, else the row under the cursor."""
        if self.marked:
            return [k for k in self.table.keys if k in self.marked]
        key = self.table.selected_key()
        return [key] if key is not None else []


def set_line(line: Static, content: str | Text) -> None:
    """A line whose height the CSS fixes (a title, a status line) shows `content`: nothing to do when it already
    does, and no layout when it changes (a `Static.update` lays the whole screen out again, which redraws every
    widget: that was most of a frame's 20 ms at each update)."""
    if line.content != content:
        line.update(content, layout=False)


# a job row as last built: job dict, marked, clock, detector marks, cells, order key, its GPUs' utilisation
_Cached = tuple[Mapping[str, Any], bool, tuple[str, ...], tuple[str, ...], R.Lazy, tuple[Any, ...], tuple[Any, ...]]
_CLOCKED = ("running", "error")  # the statuses whose row, state word or order can move with the clock alone


class JobsView(View):
    """Each update looks only at the jobs that can have changed since the last: those the feed read anew, the
    running and failed ones (their clocks), and those whose alerts, GPU utilisation or mark changed; the rest keep
    their rows, order keys and counts. Anything else (the first update, an array expanded or closed, a palette,
    a feed read too far back) builds every row again, as `_build_all`."""

    title = "Jobs"
    columns = R.JOB_COLUMNS
    sources = ("jobs", "job_util")
    kind = "job"

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        # id -> (the job dict the cells came from, marked, what the clock shows of it, what the detectors found
        # (its alerts), cells, order key, its GPUs' utilisation): reused while all five hold still
        self._cache: dict[int, _Cached] = {}
        self._rows: dict[str, R.Row | R.Lazy] = {}
        self._top: dict[str, tuple[Any, ...]] = {}  # row key -> order key: the jobs that are no array's, the arrays
        self._inner: dict[str, list[str]] = {}  # an expanded array's row key -> its tasks' row keys, in order
        self._order: list[str] = []
        self._ordered = False  # whether `_order` follows `_top` and `_inner`
        # the keys of `_top` sorted by their order keys (`_sorted`), and what changed since they were: key -> its
        # order key then (None: it was not there)
        self._sorted: tuple[list[tuple[Any, ...]], list[str]] = ([], [])
        self._moved: dict[str, tuple[Any, ...] | None] = {}
        self._states: Counter[str] = Counter()  # the jobs by the status word they show, for the title
        self._state_of: dict[int, str] = {}  # each job's word in `_states`
        # the jobs whose rows move with the clock alone (`_CLOCKED`), by when their status word or order may next
        # change (`order_holds`): an update looks at those due, and at the rows on screen (their ages), not at
        # every running job
        self._due: dict[int, float] = {}
        self._due_heap: list[tuple[float, int]] = []
        # the jobs whose GPUs' utilisation was read anew since their rows were built: it shows in their cells
        # alone (not the order, not the counts), so only a row on screen (or filtered) is built again for it. At
        # 2,000 running jobs, each read of it (every 5 s) built every running job's row again: 25 to 30 ms
        self._util_stale: set[int] = set()
        self._array_of: dict[int, int] = {}  # a task's id -> its array's
        self.arrays: dict[int, dict[int, Mapping[str, Any]]] = {}  # array id -> its tasks by id
        self.expanded: set[int] = set()  # the arrays whose tasks have a row each
        # what the last update saw: the feed's read of the jobs (None: build all), the alerts' marks, the
        # utilisation, the marked rows and the expanded arrays
        self._seen: int | None = None
        self._found: dict[int, tuple[str, ...]] = {}
        self._util: Mapping[int, tuple[Any, ...]] = {}
        self._marked_seen: set[str] = set()
        self._expanded_seen: set[int] = set()
        self._jobs: Mapping[int, Mapping[str, Any]] = {}  # the feed's jobs, and the time, at the last update
        self._now = 0.0

    def restyle(self) -> None:
        self._cache.clear()
        self._seen = None

    def toggle_array(self, array_id: int) -> None:
        self.expanded ^= {array_id}

    def build(self, feed: Feed, now: float) -> tuple[dict[str, R.Row | R.Lazy], list[str]]:
        found = R.job_alert_marks(feed.alerts.values())  # the alerts are read on every refresh, whatever the view
        changed = None
        if self._seen is not None and self.expanded == self._expanded_seen:
            changed = feed.jobs_changed_since(self._seen)
        if changed is None:
            self._build_all(feed, now, found)
        else:
            ids = changed | self._due_now(now)
            ids.update(j for j in found.keys() | self._found.keys() if found.get(j) != self._found.get(j))
            util = feed.job_util
            if util is not self._util:
                self._util_stale.update(j for j in util.keys() | self._util.keys() if util.get(j) != self._util.get(j))
            arrays: set[int] = set()
            for key in self.marked ^ self._marked_seen:
                if (array_id := R.array_of_key(key)) is not None:
                    arrays.add(array_id)
                elif key.isdecimal():
                    ids.add(int(key))
            for job_id in ids:
                self._job(job_id, feed.jobs.get(job_id), now, found, util, arrays)
            for array_id in arrays:
                self._array(array_id, now, found)
        self._seen, self._found, self._util = feed.jobs_read, found, feed.job_util
        self._jobs, self._now = feed.jobs, now
        if self.pattern is not None:  # the filter reads every row, their ages too: all of them as of now
            self.freshen([str(job_id) for job_id in self._due.keys() | self._util_stale])
        self._marked_seen, self._expanded_seen = set(self.marked), set(self.expanded)
        if not self._ordered:
            self._order = self._ordering()
            self._ordered = True
        return self._rows, self._order

    def _ordering(self) -> list[str]:
        """The rows in order: each job that is no array's and each array by its order key, an expanded array's
        tasks after it. A few keys moved (of 10,000 jobs, what changed in a second): each is taken out and put
        back in its place; many, or none known: sorted again."""
        top, inner = self._top, self._inner
        orders, keys = self._sorted
        if len(self._moved) > max(64, len(top) // 20) or len(keys) + self._growth() != len(top):
            keys = sorted(top, key=top.__getitem__)
            orders = [top[k] for k in keys]
        else:
            for was in self._moved.values():
                if was is not None:
                    at = bisect.bisect_left(orders, was)
                    del orders[at], keys[at]
            for key in self._moved:
                if (now := top.get(key)) is not None:
                    at = bisect.bisect_left(orders, now)
                    orders.insert(at, now)
                    keys.insert(at, key)
        self._sorted, self._moved = (orders, keys), {}
        return [k for key in keys for k in (key, *inner.get(key, ()))] if inner else list(keys)

    def _growth(self) -> int:
        """How many keys `_top` has gained since `_sorted` was made (less those it lost)."""
        return sum((key in self._top) - (was is not None) for key, was in self._moved.items())

    def _set_top(self, key: str, order: tuple[Any, ...] | None) -> None:
        """A row's order key (None: it has none now); what moved is kept for `_ordering`."""
        was = self._top.get(key)
        if was == order:
            return
        if key not in self._moved:
            self._moved[key] = was
        if order is None:
            del self._top[key]
        else:
            self._top[key] = order
        self._ordered = False

    def _build_all(self, feed: Feed, now: float, found: Mapping[int, tuple[str, ...]]) -> None:
        self._rows, self._top, self._inner, self._ordered = {}, {}, {}, False
        self._sorted, self._moved = ([], []), {}
        self._states, self._state_of, self._array_of, self.arrays = Counter(), {}, {}, {}
        self._due, self._due_heap, self._util_stale = {}, [], set()
        cache, self._cache = self._cache, {}
        arrays: set[int] = set()
        for job_id, job in feed.jobs.items():
            self._job(job_id, job, now, found, feed.job_util, arrays, cache.get(job_id))
        for array_id in arrays:
            self._array(array_id, now, found)

    def _job(
        self,
        job_id: int,
        job: Mapping[str, Any] | None,
        now: float,
        found: Mapping[int, tuple[str, ...]],
        utils: Mapping[int, tuple[Any, ...]],
        arrays: set[int],
        hit: _Cached | None = None,
    ) -> None:
        """Bring one job's row, order key, state count and array up to date (`job` None: it is gone); the arrays
        whose rows must be built again are added to `arrays`."""
        key = str(job_id)
        self._util_stale.discard(job_id)
        if (word := self._state_of.pop(job_id, None)) is not None:
            self._states[word] -= 1
        if (array_id := self._array_of.pop(job_id, None)) is not None:
            self.arrays[array_id].pop(job_id, None)
            arrays.add(array_id)
        if job is None or job["status"] not in _CLOCKED:
            self._due.pop(job_id, None)
        else:
            self._look_again(job_id, now + R.order_holds(job, now))
        if job is None:
            self._cache.pop(job_id, None)
            self._rows.pop(key, None)
            self._set_top(key, None)
            return
        array_id = job.get("array_id")
        if array_id is not None:
            self.arrays.setdefault(array_id, {})[job_id] = job
            self._array_of[job_id] = array_id
            arrays.add(array_id)
            if array_id not in self.expanded:
                self._count(job_id, R.job_state(job, now))
                self._cache.pop(job_id, None)
                self._rows.pop(key, None)
                return
        marked = key in self.marked
        clock = R.job_clock(job, now)
        self._count(job_id, clock[0] if job["status"] == "running" else job["status"])  # job_state's, for the title
        marks = found.get(job_id, ())
        util = utils.get(job_id, ())
        if hit is None:
            hit = self._cache.get(job_id)
        if hit is None or hit[0] is not job or hit[1] != marked or hit[2] != clock or hit[3] != marks or hit[6] != util:
            cells = R.Lazy(R.job_cells, job, now, marked, marks, util)  # built once drawn (or filtered)
            hit = (job, marked, clock, marks, cells, R.job_order(job, now), util)
        self._cache[job_id] = hit
        self._rows[key] = hit[4]
        if array_id is None:
            self._set_top(key, hit[5])

    def update_view(self, feed: Feed, now: float) -> None:
        super().update_view(feed, now)
        self._on_screen()

    def on_line_table_scrolled(self, message: LineTable.Scrolled) -> None:
        message.stop()
        self._on_screen()

    def _on_screen(self) -> None:
        """The rows on screen, with the running and failed jobs' ages as of the last update: a row that comes on
        screen (a scroll, or the order moved) shows them as of then, not as of when it was last built."""
        for key in self.freshen(self.table.visible_keys()):
            self.table.replace(key, self._rows[key])

    def freshen(self, keys: Iterable[str]) -> list[str]:
        """Bring these rows' clocks (runtime, output's age) to the last update's time, and their GPUs' utilisation
        to the last read; the keys of the rows built again. An update keeps the status words, the order and the
        counts right for every row (`order_holds`)."""
        if self._seen is None:
            return []
        now, arrays, rows, again = self._now, set(), self._rows, []
        for key in keys:
            if (array_id := R.array_of_key(key)) is not None:
                arrays.add(array_id)
            elif key.isdecimal() and (int(key) in self._due or int(key) in self._util_stale):
                was = rows.get(key)
                self._job(int(key), self._jobs.get(int(key)), now, self._found, self._util, arrays)
                if key in rows and rows[key] is not was:
                    again.append(key)
        for array_id in arrays:
            was = rows.get(key := R.array_key(array_id))
            self._array(array_id, now, self._found)
            if key in rows and rows[key] is not was:
                again.append(key)
        return again

    def _look_again(self, job_id: int, when: float) -> None:
        if self._due.get(job_id) != when:
            self._due[job_id] = when
            if when != math.inf:
                heapq.heappush(self._due_heap, (when, job_id))

    def _due_now(self, now: float) -> set[int]:
        """The jobs whose clocks may show something else by `now` (each is looked at, and its next time kept)."""
        heap, due, out = self._due_heap, self._due, set()
        while heap and heap[0][0] <= now:
            when, job_id = heapq.heappop(heap)
            if due.get(job_id) == when:  # else the job was looked at since, or is gone: a stale entry
                del due[job_id]  # `_job` keeps its next time
                out.add(job_id)
        if len(heap) > 4 * len(due) + 64:  # stale entries pile up as jobs change: keep the heap to the live ones
            self._due_heap = [(when, job_id) for job_id, when in due.items() if when != math.inf]
            heapq.heapify(self._due_heap)
        return out

    def _count(self, job_id: int, word: str) -> None:
        self._state_of[job_id] = word
        self._states[word] += 1

    def _array(self, array_id: int, now: float, found: Mapping[int, tuple[str, ...]]) -> None:
        """An array's row, order key and (expanded) its tasks' order, from its tasks as they are now."""
        key = R.array_key(array_id)
        tasks = list(self.arrays.get(array_id, {}).values())
        if not tasks:
            self.arrays.pop(array_id, None)
            self._rows.pop(key, None)
            self._inner.pop(key, None)
            self._set_top(key, None)
            return
        expanded = array_id in self.expanded
        self._rows[key] = R.array_cells(tasks, now, key in self.marked, expanded, found)
        lead = R.job_order(R.array_lead(tasks, now), now)
        inner = [str(t["id"]) for t in sorted(tasks, key=lambda t: self._cache[t["id"]][5])] if expanded else None
        self._set_top(key, lead)
        if self._inner.get(key) != inner:
            if inner is None:
                self._inner.pop(key, None)
            else:
                self._inner[key] = inner
            self._ordered = False

    def summary(self, feed: Feed, now: float) -> Text:
        counts = self._states  # counted by `build`, which just ran (an array's tasks with the rest)
        shown = ("stalled", "error", "running", "stopping", "queued")
        return Text.assemble(*_counts(counts, shown, R.STATUS_STYLE), f"{len(feed.jobs)} jobs")


class NodesView(View):
    title = "Nodes"
    columns = R.NODE_COLUMNS
    sources = ("nodes",)
    kind = "node"

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self._node_views: list[dict[str, Any]] = []  # as `build` last saw them (`unknown` when too old)

    def build(self, feed: Feed, now: float) -> tuple[dict[str, R.Row | R.Lazy], list[str]]:
        self._node_views = nodes = feed.node_views()
        marked, util = self.marked, feed.util
        # each row's cells built when drawn, filtered or read (R.Lazy): of 1,000 nodes, whose probes move every
        # second, some 40 are on screen
        rows: dict[str, R.Row | R.Lazy] = {
            n["name"]: R.Lazy(R.node_cells, n, now, util.get(n["name"], ()), n["name"] in marked) for n in nodes
        }
        order = [n["name"] for n in sorted(nodes, key=R.node_order)]
        return rows, order

    def summary(self, feed: Feed, now: float) -> Text:
        counts = Counter(n["state"] for n in self._node_views)
        gpus = sum(len(n.get("gpus") or []) for n in self._node_views)
        held = sum(len(n.get("held") or []) for n in self._node_views)
        debug = sum(len(n.get("held_for_debug") or []) for n in self._node_views)
        return Text.assemble(
            *_counts(counts, R.NODE_STATE_ORDER, R.NODE_STATE_STYLE),
            f"{len(self._node_views)} nodes · GPUs {held}/{gpus} used",
            f" ({debug} held for debug)" if debug else "",
        )


def _counts(counts: Mapping[str, int], states: Sequence[str], styles: Mapping[str, str]) -> list[Any]:
    """`3 running · 1 error · ` for the states present, in the given order, each in its style."""
    return [part for s in states if counts.get(s) for part in ((f"{counts[s]} {s}", R.style(styles.get(s))), " · ")]


class AlertsView(View):
    title = "Alerts"
    columns = R.ALERT_COLUMNS
    sources = ("alerts",)
    kind = "alert"

    def build(self, feed: Feed, now: float) -> tuple[dict[str, R.Row], list[str]]:
        alerts = list(feed.alerts.values())
        rows = {str(a["id"]): R.alert_cells(a, now, str(a["id"]) in self.marked) for a in alerts}
        return rows, [str(a["id"]) for a in sorted(alerts, key=R.alert_order)]

    def summary(self, feed: Feed, now: float) -> Text:
        open_ = sum(1 for a in feed.alerts.values() if a["state"] == "open")
        acked = len(feed.alerts) - open_
        return Text.assemble((f"{open_} open", R.style("bad" if open_ else "ok")), f" · {acked} acknowledged")


class EventsView(View):
    title = "Events"
    columns = R.EVENT_COLUMNS
    sources = ("events",)
    kind = "event"

    def build(self, feed: Feed, now: float) -> tuple[dict[str, R.Row], list[str]]:
        events = feed.events
        rows = {R.event_key(e): R.event_cells(e, now) for e in events}
        return rows, [R.event_key(e) for e in reversed(events)]  # newest first

    def summary(self, feed: Feed, now: float) -> Text:
        return Text(f"the latest {len(feed.events)} events, newest first")


class ClusterView(View):
    """Seed 003's resource view: each node's make-up and load, idle or tight per spec, demand per GPU model."""

    title = "Cluster"
    columns = CLUSTER_NODE_COLUMNS
    sources = ("cluster",)
    kind = "node"

    def compose(self) -> ComposeResult:
        yield Static(self.title, classes="view-title")
        yield Static("", id="cluster-specs", classes="cluster-specs")
        yield self.table

    DEFAULT_CSS = """
    ClusterView > .cluster-specs { height: auto; max-height: 12; padding: 0 1; border-bottom: solid $primary; }
    """

    def build(self, feed: Feed, now: float) -> tuple[dict[str, R.Row], list[str]]:
        cluster = feed.cluster or {"nodes": []}
        nodes = cluster.get("nodes") or []
        self.query_one("#cluster-specs", Static).update(_specs_text(cluster))
        rows = {n["name"]: cluster_node_cells(n) for n in nodes}
        return rows, [n["name"] for n in sorted(nodes, key=R.node_order)]

    def summary(self, feed: Feed, now: float) -> Text:
        nodes = (feed.cluster or {}).get("nodes") or []
        used = sum(n.get("gpus_used", 0) for n in nodes)
        total = sum(n.get("gpus_total", 0) for n in nodes)
        good = (feed.cluster or {}).get("goodput") or {}
        ratio = good.get("goodput")  # useful GPU time against the time lost to failures, last 7 days
        shown = f" · goodput {ratio:.1%} (7 days; lost {good['lost_gpu_hours']:.1f} GPU-h)" if ratio is not None else ""
        return Text(f"{len(nodes)} nodes · GPUs {used}/{total} used{shown}{_standby_text(feed.cluster or {})}")


def _standby_text(cluster: Mapping[str, Any]) -> str:
    """ " · standby (leader: HOST, SOCKET)" when attached to a standby scheduler (two head nodes), else ""."""
    lead = cluster.get("leadership") or {}
    if lead.get("role") != "standby":
        return ""
    leader = lead.get("leader")
    return f" · standby (leader: {leader['host']}, {leader['socket']})" if leader else " · standby (no leader now)"


def _specs_text(cluster: Mapping[str, Any]) -> Text:
    lines: list[Any] = []
    specs = cluster.get("specs") or []
    if specs:
        lines.append(("Specs  ", "bold"))
        for s in specs:
            state = str(s.get("state") or "?")
            lines += [
                f"{s['spec']} ({s['gpus_per_node']} GPU/node): ",
                (state, R.style("ok" if state == "idle" else "warn_strong")),
                f" {s['nodes_free']}/{s['nodes']} nodes free, {s['gpus_free']} GPUs   ",
            ]
        lines.append("\n")
    demand = cluster.get("queued_demand") or {}
    if demand:
        lines.append(("Queued demand  ", "bold"))
        lines.append("   ".join(f"{model}: {gpus} GPUs" for model, gpus in demand.items()))
    return Text.assemble(*lines) if lines else Text("no specs configured, nothing queued", style="dim")
