"""What each view shows, as pure functions of the scheduler's JSON and the time: cells, order, styles.

No widgets here, so the console's content is tested from tables of cases and measured in `bench/console.py`
without a terminal. A cell is a `str` or a `rich.text.Text`; the table widget compares them to decide what to
redraw, so the same data at the same second gives equal cells.

Styles carry meaning twice: a colour, and a word or a mark that still reads without colour (NO_COLOR) and on
light terminals (`bold`, `reverse`, `dim` rather than a fixed background).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from ftconsole.format import age, node_count, node_doing

Cell = str | Text
Row = tuple[Cell, ...]


class Lazy:
    """A row whose cells are built when first needed (drawn, filtered or read), then kept: of 10,000 jobs, the
    Jobs view's running ones change every second, and only those on screen need their cells."""

    __slots__ = ("_args", "_build", "_cells")

    def __init__(self, build: Callable[..., Row], *args: Any) -> None:
        self._build: Callable[..., Row] | None = build
        self._args = args
        self._cells: Row | None = None

    def cells(self) -> Row:
        if self._cells is None:
            assert self._build is not None
            self._cells = self._build(*self._args)
            self._build, self._args = None, ()
        return self._cells


def cells_of(row: Row | Lazy) -> Row:
    return row.cells() if isinstance(row, Lazy) else row


STALL_AFTER_S = 600.0  # a running job without new output for this long is shown as stalled
FAILED_RECENT_S = 6 * 3600.0  # a job that failed this recently stays among the jobs that need attention

# Styles name a role; the palette of the terminal's background (dark or light, see `use_palette`) gives the
# colour. Every role also reads without colour: the words are there, and bad states are bold or reversed.
PALETTES = {
    "dark": {
        "ok": "green", "ok_dim": "dim green", "warn": "yellow", "warn_strong": "bold yellow reverse",
        "bad": "bold red", "bad_strong": "bold red reverse", "info": "cyan", "info_strong": "bold cyan reverse",
        "odd": "bold magenta", "muted": "dim", "strong": "bold",
    },
    "light": {
        "ok": "green4", "ok_dim": "dark_green", "warn": "dark_orange3", "warn_strong": "bold dark_orange3 reverse",
        "bad": "bold red3", "bad_strong": "bold red3 reverse", "info": "dark_cyan",
        "info_strong": "bold dark_cyan reverse", "odd": "bold magenta3", "muted": "dim", "strong": "bold",
    },
}  # fmt: skip
_palette = dict(PALETTES["dark"])


def use_palette(name: str) -> None:
    """Colours for a dark or a light background (the app calls this when its theme changes)."""
    _palette.clear()
    _palette.update(PALETTES["light" if name == "light" else "dark"])


def style(role: str | None) -> str:
    return _palette.get(role, role) if role else ""


STATUS_STYLE = {
    "running": "ok",
    "queued": "warn",
    "held": "muted",
    "succeeded": "ok_dim",
    "error": "bad",
    "stopped": "muted",
    "expired": "odd",
    "stopping": "warn",
    "stalled": "warn_strong",
}
NODE_STATE_STYLE = {
    "healthy": "ok",
    "degraded": "warn",
    "unhealthy": "bad",
    "unreachable": "odd",
    "drained": "info",
    "isolated": "info_strong",
    "unknown": "muted",
}
SEVERITY_STYLE = {"critical": "bad_strong", "error": "bad", "warning": "warn", "info": "muted"}
CHECK_STYLE = {"pass": "ok", "warn": "warn", "fail": "bad", "skip": "muted"}
# Worst first, so the nodes that need attention are at the top.
NODE_STATE_ORDER = ("unreachable", "unhealthy", "isolated", "degraded", "drained", "unknown", "healthy")
PRIORITY_RANK = {"very-urgent": 0, "urgent": 1, "normal": 2}
SPARK = " ▁▂▃▄▅▆▇█"
MARK = "●"
FLAKY_MARK = "⚑"  # after the state of a flaky node (too many faults within probes.flaky_window)


def styled(value: str, role: str | None) -> Cell:
    """`value` in the style of `role` (a palette role such as "bad", or a plain Rich style)."""
    return Text(value, style=style(role)) if role else value


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int | None = None  # None: sized to the content
    min_width: int = 0  # sized to the content, never narrower than this (the view sets it once mounted)


# -- jobs ------------------------------------------------------------------------------------------------------

JOB_COLUMNS = (
    Column("mark", " ", 1),
    Column("id", "ID"),
    Column("name", "NAME"),
    Column("owner", "OWNER"),
    Column("status", "STATUS", min_width=9),  # "succeeded"; an array's counts ("8▶ 80○ 12✓") widen it
    Column("priority", "PRIO"),
    Column("mode", "MODE"),
    Column("shape", "NODESxGPU"),
    Column("attempt", "TRY"),
    Column("runtime", "RUNTIME/MAX", 13),
    Column("output", "OUTPUT", 7),
    Column("util", "GPU%", 8),  # a running job's GPUs' mean utilisation at its nodes' last probes
    Column("alerts", "ALERTS"),  # "!1 hung?": the count, and what the detectors found
    Column("where", "NODES"),
    Column("message", "MESSAGE"),
)


def job_state(job: Mapping[str, Any], now: float) -> str:
    """The status word a job shows: its status, `held` for a queued job held (`hold`), or `stopping` / `stalled`
    for running jobs that are."""
    status = str(job["status"])
    if status == "queued" and job.get("held"):
        return "held"
    if status != "running":
        return status
    if job.get("stop_requested"):
        return "stopping"
    last = job.get("last_output") or job.get("started")
    if last is not None and now - float(last) > STALL_AFTER_S:
        return "stalled"
    return status


def job_needs_attention(job: Mapping[str, Any], now: float) -> bool:
    state = job_state(job, now)
    if state == "stalled" or (job.get("open_alerts") or 0) > 0:
        return True
    return state == "error" and job.get("ended") is not None and now - float(job["ended"]) < FAILED_RECENT_S


def job_order(job: Mapping[str, Any], now: float) -> tuple[Any, ...]:
    """Attention first (stalled, alerted, just failed), then running, queued by priority, then the ended."""
    status = job["status"]
    if job_needs_attention(job, now):
        return (0, -float(job.get("ended") or job.get("started") or 0), job["id"])
    if status == "running":
        return (1, PRIORITY_RANK.get(job["priority"], 9), job["id"])
    if status == "queued":
        return (2, PRIORITY_RANK.get(job["priority"], 9), job["submitted"], job["id"])
    return (3, -float(job.get("ended") or 0), -int(job["id"]))


def job_clock(job: Mapping[str, Any], now: float) -> tuple[str, ...]:
    """What of a job's row moves with the clock alone: equal values give equal rows for the same job data."""
    status = job["status"]
    if status == "running":
        last = job.get("last_output")
        started = job.get("started")
        return (
            job_state(job, now),
            "" if started is None else age(now - float(started)),
            "" if last is None else age(now - float(last)),
        )
    if status == "error":
        return (str(job_needs_attention(job, now)),)
    return ()


def order_holds(job: Mapping[str, Any], now: float) -> float:
    """For how long, at least, the clock alone leaves a job's status word and order as they are now
    (`job_state`, `job_order`): until a running job turns stalled, or a failed one stops counting as just
    failed. Its ages (runtime, output) move every second; only the rows on screen show them."""
    status = job["status"]
    if status == "running":
        since = job.get("last_output") or job.get("started")
        if since is None or job.get("stop_requested"):
            return math.inf
        return _until(STALL_AFTER_S - (now - float(since)))
    if status == "error" and job.get("ended") is not None:
        return _until(FAILED_RECENT_S - (now - float(job["ended"])))
    return math.inf


def _until(left: float) -> float:
    """A threshold `left` seconds ahead: crossed then (already crossed: it stays so)."""
    return math.inf if left < 0 else left


def job_cells(
    job: Mapping[str, Any], now: float, marked: bool = False, found: Sequence[str] = (), util: Sequence[Any] = ()
) -> Row:
    """`found`: the marks of the job's detector alerts (`job_alert_marks`), shown after the alert count; `util`:
    its GPUs' utilisation at the last probes (API `job_util`), a sparkline while it runs."""
    state = job_state(job, now)
    runtime: str = "-"
    started, ended = job.get("started"), job.get("ended")
    if started is not None:
        elapsed = (ended if ended is not None else now) - float(started)
        runtime = age(elapsed)
    limit = job.get("max_runtime_s")
    if limit:
        runtime += f"/{age(float(limit))}"
    last = job.get("last_output")
    output: Cell = "-"
    if last is not None:
        output = age(now - float(last)) if job["status"] == "running" else "done"
        if state == "stalled":
            output = styled(age(now - float(last)), "warn")
    where = job.get("node_names") or []
    return (
        MARK if marked else " ",
        str(job.get("ref") or job["id"]),  # a task of an array: 12[7]
        str(job["name"]),
        str(job["owner"]),
        styled(state, STATUS_STYLE.get(state)),
        styled(str(job["priority"]), "strong" if job["priority"] != "normal" else None),
        str(job["mode"]),
        f"{node_count(job)}x{job['gpus_per_node']}",
        str(job.get("attempt") or 0),
        runtime,
        output,
        sparkline(util, 8) if job["status"] == "running" else "",
        alerts_cell(int(job.get("open_alerts") or 0), found),
        compress_names(where),
        str(job.get("message") or ""),
    )


# -- arrays of jobs: one row each, its tasks' rows under it when expanded -----------------------------------------

# A task's state -> its mark in the STATUS of its array's row ("8▶ 80○ 12✓"), those that need attention first.
ARRAY_MARKS = {"stalled": "!", "error": "✗", "running": "▶", "stopping": "▷", "queued": "○", "held": "‖",
               "succeeded": "✓", "stopped": "■", "expired": "⊘"}  # fmt: skip
FOLDED, UNFOLDED = "▸", "▾"  # in the mark column of an array's row: its tasks hidden, shown


def array_key(array_id: int) -> str:
    """The row key of an array: not a number, so it never meets a job's key (`12`, its first task's)."""
    return f"array:{array_id}"


def array_of_key(key: str) -> int | None:
    """The array a row key names (`array:12` -> 12); None for a job's key."""
    return int(key[6:]) if key.startswith("array:") and key[6:].isdecimal() else None


def array_lead(tasks: Iterable[Mapping[str, Any]], now: float) -> Mapping[str, Any]:
    """The task an array's row stands for: its most pressing one by `job_order`, where the array's row sorts."""
    return min(tasks, key=lambda t: job_order(t, now))


def array_status(states: Iterable[str]) -> Text:
    """`1✗ 8▶ 80○ 12✓`: how many tasks are in each state, each count in its state's style, with a mark."""
    counts = Counter(states)
    parts: list[Any] = []
    for state, mark in ARRAY_MARKS.items():
        if counts.get(state):
            parts += [" " if parts else "", (f"{counts[state]}{mark}", style(STATUS_STYLE.get(state)))]
    if other := sum(n for s, n in counts.items() if s not in ARRAY_MARKS):  # a status this console does not know
        parts += [" " if parts else "", f"{other}?"]
    return Text.assemble(*parts)


def array_cells(
    tasks: Iterable[Mapping[str, Any]],
    now: float,
    marked: bool = False,
    expanded: bool = False,
    found: Mapping[int, Sequence[str]] | None = None,
) -> Row:
    """An array's row from its tasks (one or more, any order): name, owner, mode, shape of its first task, the tasks
    counted by state, their priorities and alerts (`found`: `job_alert_marks`), the nodes of the running ones, and
    the message of its first queued task (why the array waits), else of its first."""
    first = queued = None
    states: list[str] = []
    priorities, marks, where, alerts = set[str](), set[str](), set[str](), 0
    for t in tasks:
        if first is None or int(t["id"]) < int(first["id"]):
            first = t
        if t["status"] == "queued" and (queued is None or int(t["id"]) < int(queued["id"])):
            queued = t
        states.append(job_state(t, now))
        priorities.add(str(t["priority"]))
        alerts += int(t.get("open_alerts") or 0)
        marks.update((found or {}).get(int(t["id"]), ()))
        where.update(t.get("node_names") or [] if t["status"] == "running" else [])
    assert first is not None, "an array has a task"
    prio = "/".join(sorted(priorities, key=lambda p: (PRIORITY_RANK.get(p, 9), p)))
    return (
        MARK if marked else UNFOLDED if expanded else FOLDED,
        f"{first['array_id']}[{first.get('array') or '?'}]",
        str(first["name"]),
        str(first["owner"]),
        array_status(states),
        styled(prio, "strong" if prio != "normal" else None),
        str(first["mode"]),
        f"{node_count(first)}x{first['gpus_per_node']}",
        *("-", "-", "-", ""),  # attempt, runtime, output, GPU%: each task's own
        alerts_cell(alerts, [m for m in JOB_ALERT_MARKS.values() if m in marks]),
        compress_names(sorted(where)),
        str((queued or first).get("message") or ""),
    )


def alerts_cell(count: int, found: Sequence[str]) -> Cell:
    """`!2 hung? slow`: the count of the job's open alerts, then a word for each thing the detectors found."""
    if not found:
        return styled(f"!{count}", "bad") if count else ""
    parts: list[Any] = [(f"!{count}", style("bad"))] if count else []
    for mark in found:
        parts += [" " if parts else "", (mark, style(JOB_ALERT_STYLE.get(mark, "warn_strong")))]
    return Text.assemble(*parts)


def compress_names(names: Sequence[str], limit: int = 40) -> str:
    """node01,node02,node03 -> node[01-03] (ClusterShell's folding), cut to `limit` characters."""
    if not names:
        return ""
    # a running job's row is built again every second: its folded names are remembered
    text = names[0] if len(names) == 1 else _fold(tuple(names))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@functools.lru_cache(maxsize=4096)
def _fold(names: tuple[str, ...]) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(names)))


# -- nodes -----------------------------------------------------------------------------------------------------

NODE_COLUMNS = (
    Column("mark", " ", 1),
    Column("node", "NODE"),
    Column("state", "STATE", 13),  # "unreachable ⚑"
    Column("pool", "POOL"),
    Column("gpus", "GPUS"),
    Column("used", "USED"),
    Column("jobs", "JOBS"),
    Column("util", "UTIL", 5),
    Column("spark", "UTIL HISTORY", 12),
    Column("faults", "FAULTS", 6),
    Column("probed", "PROBED", 6),
    Column("reasons", "REASONS"),
)


def node_order(node: Mapping[str, Any]) -> tuple[Any, ...]:
    state = str(node["state"])
    rank = NODE_STATE_ORDER.index(state) if state in NODE_STATE_ORDER else len(NODE_STATE_ORDER)
    return (rank, str(node["name"]))


def mean_util(node: Mapping[str, Any]) -> float | None:
    utils = [g["utilization"] for g in node.get("gpus") or [] if g.get("utilization") is not None]
    return sum(utils) / len(utils) if utils else None


def sparkline(values: Iterable[float | None], width: int = 12) -> str:
    """Percentages as block characters, newest last: 0 % the lowest bar, a gap (no reading) a space."""
    tail = list(values)[-width:]
    return "".join(" " if v is None else SPARK[1 + min(7, max(0, int(v * 8 / 100.0001)))] for v in tail)


def node_cells(node: Mapping[str, Any], now: float, history: Sequence[float | None] = (), marked: bool = False) -> Row:
    gpus = node.get("gpus") or []
    debug = node.get("held_for_debug") or []
    held = [*(node.get("held") or []), *debug]
    util = mean_util(node)
    last = node.get("last_probe")
    job_ids: list[int | str] = sorted({int(h["job"]) for h in held if h.get("job") is not None})
    # a failed job holding its GPUs for debugging (debug.hold_nodes) reads `12:debug`
    held_for_debug = {int(h["job"]) for h in debug if h.get("job") is not None}
    job_ids = [f"{j}:debug" if j in held_for_debug else j for j in job_ids]
    if any(h.get("private") for h in held):
        job_ids.append("private")
    faults = int(node.get("faults") or 0)
    return (
        MARK if marked else " ",
        str(node["name"]),
        node_state_cell(node),
        str(node.get("pool") or ""),
        _gpu_model(gpus),
        f"{len(held)}/{len(gpus)}" if gpus else "-",
        ",".join(str(j) for j in job_ids[:4]) + ("…" if len(job_ids) > 4 else ""),
        "-" if util is None else f"{util:.0f}%",
        sparkline(history),
        styled(str(faults), "warn") if faults else "0",
        age(now - float(last)) if last is not None else "never",
        "; ".join(node_doing(node) + list(node.get("reasons") or [])),
    )


def node_state_cell(node: Mapping[str, Any]) -> Cell:
    """The state word, and the flaky mark after it when the node is flaky (the mark reads without colour)."""
    state = str(node["state"])
    cell = styled(state, NODE_STATE_STYLE.get(state))
    if not node.get("flaky"):
        return cell
    return Text.assemble(cell, " ", (FLAKY_MARK, style("warn_strong")))


def _gpu_model(gpus: Sequence[Mapping[str, Any]]) -> str:
    if not gpus:
        return "-"
    names = {str(g.get("name") or "?").replace("NVIDIA ", "") for g in gpus}
    return f"{len(gpus)}x {names.pop() if len(names) == 1 else 'mixed'}"


# -- what the detectors found about jobs (issue 13) ------------------------------------------------------------

# A detector's alert kind -> the word on its job's row, worst first (the order they show in).
JOB_ALERT_MARKS = {
    "job_rank_error": "rank error",
    "job_hung": "hung?",
    "job_straggler": "straggler",
    "job_slow": "slow",
}
JOB_ALERT_STYLE = {"rank error": "bad"}  # the others: warn_strong (reversed: reads without colour)


def job_alert_marks(alerts: Iterable[Mapping[str, Any]]) -> dict[int, tuple[str, ...]]:
    """Job id -> the marks of its open and acknowledged detector alerts (`JOB_ALERT_MARKS`, in that order)."""
    kinds: dict[int, set[str]] = {}
    for a in alerts:
        if a.get("job") is not None and a["kind"] in JOB_ALERT_MARKS and a["state"] in ("open", "acknowledged"):
            kinds.setdefault(int(a["job"]), set()).add(str(a["kind"]))
    return {job: tuple(m for k, m in JOB_ALERT_MARKS.items() if k in found) for job, found in kinds.items()}


# -- alerts and events -----------------------------------------------------------------------------------------

ALERT_COLUMNS = (
    Column("mark", " ", 1),
    Column("id", "ID"),
    Column("age", "AGE", 5),
    Column("severity", "SEVERITY", 8),
    Column("kind", "KIND"),
    Column("state", "STATE", 12),
    Column("subject", "JOB/NODE"),
    Column("message", "MESSAGE"),
)
SEVERITY_RANK = {"critical": 0, "error": 1, "warning": 2, "info": 3}


def alert_order(alert: Mapping[str, Any]) -> tuple[Any, ...]:
    return (alert["state"] != "open", SEVERITY_RANK.get(alert["severity"], 9), -float(alert["time"]))


def alert_cells(alert: Mapping[str, Any], now: float, marked: bool = False) -> Row:
    subject = f"job {alert['job']}" if alert.get("job") is not None else str(alert.get("node") or "")
    state = str(alert["state"])
    if state == "acknowledged" and alert.get("acked_by"):
        state = f"ack {alert['acked_by']}"
    return (
        MARK if marked else " ",
        str(alert["id"]),
        age(now - float(alert["time"])),
        styled(str(alert["severity"]), SEVERITY_STYLE.get(str(alert["severity"]))),
        str(alert["kind"]),
        styled(state, "strong" if alert["state"] == "open" else "muted"),
        subject,
        str(alert["message"]),
    )


EVENT_COLUMNS = (
    Column("time", "TIME", 8),
    Column("kind", "KIND"),
    Column("subject", "JOB/NODE"),
    Column("message", "MESSAGE"),
)


def event_key(event: Mapping[str, Any]) -> str:
    return str(event["id"])


def event_cells(event: Mapping[str, Any], now: float) -> Row:
    when = time.strftime("%H:%M:%S", time.localtime(float(event["time"])))
    subject = f"job {event['job']}" if event.get("job") else str(event.get("node") or "")
    kind = str(event["kind"])
    bad = any(w in kind.lower() for w in ("fail", "error", "unhealthy", "unreachable", "isolat"))
    return (when, styled(kind, "bad" if bad else None), subject, str(event["message"]))


# -- filtering -------------------------------------------------------------------------------------------------


def compile_filter(text: str) -> re.Pattern[str] | None:
    """The `/` filter: a case-insensitive regular expression; ValueError names what is wrong with it."""
    if not text:
        return None
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {text!r}: {exc}") from None


def row_text(row: Row | Lazy) -> str:
    return " ".join(c.plain if isinstance(c, Text) else c for c in cells_of(row))
