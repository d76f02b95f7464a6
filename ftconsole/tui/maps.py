"""The cluster map's content, as pure functions of the scheduler's JSON: what each GPU is doing, how the nodes
group, and where each node sits on a screen of a given width.

Every GPU is one cell. Its kind says what it does, worst first (a GPU shows the first that holds):

    ?  unreachable, or no data (the node's probes fail, or the console has no fresh data)
    ✗  failed (its node is unhealthy; bold where a check names this GPU)
    ⊘  isolated
    ◆  held for debugging by a failed job (debug.hold_nodes)
    !  named by a warning check of a degraded node (hot, ECC, NVLink)
    ▪  busy with a preemptible job
    ○  busy, but under 10 % utilisation
    ▁…█ busy, the bar's height its utilisation
    ─  drained
    □  in an active reservation, idle
    ·  idle

The symbols read without colour (NO_COLOR); colour adds the same again. Where a screen is too small for a cell
per GPU, the map halves its width with half blocks (two GPUs a cell, one above the other, colour alone), so 1,000
nodes of 8 GPUs fit a 200x50 terminal; without colour it keeps a cell per GPU and scrolls.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# kind -> (symbol, palette role, legend word); the order is the legend's
KINDS: dict[str, tuple[str, str, str]] = {
    "busy": ("█", "ok", "busy (height: utilisation)"),
    "flat": ("○", "warn", "busy, under 10%"),
    "preempt": ("▪", "info", "preemptible job"),
    "idle": ("·", "muted", "idle"),
    "reserved": ("□", "info", "reserved"),
    "drained": ("─", "info", "drained"),
    "warn": ("!", "warn_strong", "warning"),
    "debug": ("◆", "odd", "debug hold"),
    "isolated": ("⊘", "info_strong", "isolated"),
    "failed": ("✗", "bad", "failed"),
    "down": ("?", "odd", "unreachable / no data"),
}
BARS = "▁▂▃▄▅▆▇█"
FLAT_BELOW = 10.0  # a held GPU under this utilisation (%) reads `flat`
_GPU_NAMED = re.compile(r"\bgpu ?(\d+)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Gpu:
    """One cell. Cells are shared (`cell`): a map of 8,000 GPUs holds a few dozen objects, compared by identity."""

    kind: str
    level: int = 0  # busy: 0-7, the bar's height
    emphasis: bool = False  # a failed GPU that a check names

    @property
    def symbol(self) -> str:
        return BARS[self.level] if self.kind == "busy" else KINDS[self.kind][0]


_CELLS = {(k, level, strong): Gpu(k, level, strong) for k in KINDS for level in range(8) for strong in (False, True)}


def cell(kind: str, level: int = 0, emphasis: bool = False) -> Gpu:
    return _CELLS[kind, level, emphasis]


def named_gpus(reasons: Iterable[str]) -> set[int]:
    """The GPU indexes a node's reasons name (`gpu3 temperature 87C > 85C`, `gpu 5: ...`)."""
    return {int(m) for r in reasons for m in _GPU_NAMED.findall(str(r))}


def gpu_cells(
    node: Mapping[str, Any],
    count: int,
    preemptible: Collection[int] = frozenset(),
    reserved: Collection[str] = frozenset(),
) -> tuple[Gpu, ...]:
    """What each of a node's GPUs does. `count` cells: its GPUs as probed, or, for a node with no GPU data
    (never probed, or its probes fail), as many as its group's nodes have. `preemptible`: the ids of the
    preemptible jobs; `reserved`: the nodes in an active reservation."""
    state = node.get("state") or "unknown"
    if state in ("unreachable", "unknown"):
        return (_DOWN,) * count
    reasons = node.get("reasons")
    named = named_gpus(reasons) if reasons else _NONE
    if state == "unhealthy":
        return tuple(_CELLS["failed", 0, i in named] for i in range(count))
    if state == "isolated":
        return (_ISOLATED,) * count
    rest = _CELLS["drained" if state == "drained" else "reserved" if node.get("name") in reserved else "idle", 0, False]
    holders = node.get("held") or ()
    debug = {h.get("gpu") for h in node.get("held_for_debug") or ()}
    warned = named and state == "degraded"
    if not holders and not debug and not warned:
        return (rest,) * count
    util: dict[Any, Any] = {g.get("index"): g.get("utilization") for g in node.get("gpus") or ()}
    if not debug and not warned:  # the most common: GPUs held or not (at 1,000 nodes, each probe's every node)
        cells = [rest] * count
        for h in holders:
            i = h.get("gpu")
            if type(i) is int:
                if 0 <= i < count:
                    cells[i] = _PREEMPT if h.get("job") in preemptible else _busy(util.get(i))
            elif i is not None:
                break  # an index that is no int (1.0, True: equal to 1 as a key) is looked up as one below
        else:
            return tuple(cells)
    held = {h.get("gpu"): h.get("job") for h in holders}
    out = []
    for i in range(count):
        if i in debug:
            out.append(_DEBUG)
        elif i in named and state == "degraded":
            out.append(_WARN)
        elif i in held:
            out.append(_PREEMPT if held[i] in preemptible else _busy(util.get(i)))
        else:
            out.append(rest)
    return tuple(out)


def _busy(utilization: Any) -> Gpu:
    """A held GPU's cell by its utilisation: a bar of 8 levels, `flat` under FLAT_BELOW, full when unknown."""
    if utilization is None:
        return _BUSY[7]
    return _FLAT if utilization < FLAT_BELOW else _BUSY[min(7, max(0, int(utilization * 0.08)))]


_DOWN, _ISOLATED, _DEBUG, _WARN = (_CELLS[k, 0, False] for k in ("down", "isolated", "debug", "warn"))
_PREEMPT, _FLAT = _CELLS["preempt", 0, False], _CELLS["flat", 0, False]
_BUSY = tuple(_CELLS["busy", level, False] for level in range(8))
_NONE: frozenset[int] = frozenset()


def preemptible_jobs(jobs: Mapping[int, Mapping[str, Any]]) -> set[int]:
    return {job_id for job_id, job in jobs.items() if job.get("preemptible")}


def node_jobs(node: Mapping[str, Any]) -> list[int]:
    """The jobs holding a node's GPUs (for debugging too), by id."""
    held = [*(node.get("held") or ()), *(node.get("held_for_debug") or ())]
    return sorted({int(h["job"]) for h in held if h.get("job") is not None})


def gpu_model(node: Mapping[str, Any]) -> str | None:
    names = {str(g.get("name") or "?").replace("NVIDIA ", "") for g in node.get("gpus") or ()}
    return None if not names else names.pop() if len(names) == 1 else "mixed"


@functools.lru_cache(maxsize=65536)
def natural(name: str) -> tuple[Any, ...]:
    """node2 before node10: racks read in order."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class Group:
    pool: str
    model: str
    gpus: int  # per node
    switch: str  # its nodes' leaf switch (the config's topology:), or ""
    nodes: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"{self.pool} · {self.gpus}x {self.model}" + (f" · {self.switch}" if self.switch else "")


def groups(nodes: Sequence[Mapping[str, Any]], leaf_of: Mapping[str, str] | None = None) -> list[Group]:
    """The nodes by pool and GPU make-up (model and count: what a spec asks for), then by leaf switch where the
    config declares them (`leaf_of`), nodes in natural order. A node with no GPU data joins its pool's most common
    make-up, so a dead node keeps its place among its peers."""
    known: dict[str, tuple[str, int]] = {}
    common: dict[str, Counter[tuple[str, int]]] = {}
    for n in nodes:
        model = gpu_model(n)
        if model is not None:
            pool = str(n.get("pool") or "-")
            known[str(n["name"])] = (model, len(n.get("gpus") or ()))
            common.setdefault(pool, Counter())[known[str(n["name"])]] += 1
    by: dict[tuple[str, str, int, str], list[str]] = {}
    for n in nodes:
        name, pool = str(n["name"]), str(n.get("pool") or "-")
        make = known.get(name) or (common[pool].most_common(1)[0][0] if pool in common else ("no GPU data", 1))
        by.setdefault((pool, *make, (leaf_of or {}).get(name, "")), []).append(name)
    ordered = sorted(by.items(), key=lambda item: (*item[0][:3], natural(item[0][3])))
    return [Group(*make, tuple(sorted(names, key=natural))) for make, names in ordered]


@dataclass
class Layout:
    """Lines of the map at one width: a group's header (its index in `groups`) or a row of node names; where each
    node is (line, column of its first cell). `dense`: two GPUs a cell; `label`: the width of the node names shown
    before their cells (0: none)."""

    width: int
    dense: bool
    label: int = 0
    lines: list[int | tuple[str, ...]] = field(default_factory=list)
    where: dict[str, tuple[int, int]] = field(default_factory=dict)

    def span(self, gpus: int) -> int:
        """Columns a node of `gpus` GPUs takes, its gap included."""
        if self.label:
            return self.label + 1 + gpus + 2
        return (gpus + 1) // 2 + 1 if self.dense else gpus + 1


def lay_out(groups_: Sequence[Group], width: int, dense: bool, label: int = 0) -> Layout:
    layout = Layout(width=width, dense=dense, label=label)
    for g, group in enumerate(groups_):
        layout.lines.append(g)
        span = layout.span(group.gpus)
        per_line = max(1, (width + 1) // span)  # the last node's gap may fall off the edge
        for start in range(0, len(group.nodes), per_line):
            row = group.nodes[start : start + per_line]
            for i, name in enumerate(row):
                layout.where[name] = (len(layout.lines), i * span)
            layout.lines.append(row)
    return layout


def fit(groups_: Sequence[Group], width: int, height: int, color: bool) -> Layout:
    """The roomiest layout that fits the height: node names before their cells (a small cluster), a cell per GPU,
    else half blocks (unless there is no colour to tell their halves apart: then a cell per GPU, scrolled)."""
    label = max((len(n) for g in groups_ for n in g.nodes), default=0)
    named = lay_out(groups_, width, dense=False, label=label)
    if len(named.lines) <= height:
        return named
    full = lay_out(groups_, width, dense=False)
    if len(full.lines) <= height or not color:
        return full
    return lay_out(groups_, width, dense=True)


def counts(cells: Iterable[Gpu]) -> Counter[str]:
    """How many GPUs of each kind (busy and flat together as `busy`)."""
    out = Counter(c.kind for c in cells)
    if "flat" in out:
        out["busy"] += out.pop("flat")
    return out


def summary(tally: Counter[str]) -> str:
    """`412 busy · 80 idle · 8 failed`: the kinds present, in the legend's order."""
    words = {"preempt": "preemptible", "warn": "warning", "down": "unreachable"}
    return " · ".join(f"{tally[k]} {words.get(k, k)}" for k in KINDS if k != "flat" and tally.get(k))


def node_line(
    node: Mapping[str, Any], cells: Sequence[Gpu], jobs: Mapping[int, Mapping[str, Any]], reserved: Mapping[str, str]
) -> str:
    """The status line for the node under the cursor."""
    parts = [str(node["name"]), str(node.get("state") or "unknown"), str(node.get("pool") or "-")]
    model = gpu_model(node)
    if model:
        parts.append(f"{len(node.get('gpus') or ())}x {model}")
    parts.append(summary(counts(cells)) or "no GPUs")
    held = node_jobs(node)
    if held:
        names = [f"{j} {jobs[j]['name']}" if j in jobs else str(j) for j in held[:4]]
        parts.append("jobs " + ", ".join(names) + ("…" if len(held) > 4 else ""))
    if node.get("name") in reserved:
        parts.append(f"reserved: {reserved[str(node['name'])]}")
    reasons = [str(r) for r in node.get("reasons") or ()]
    if reasons:
        parts.append("; ".join(reasons[:2]))
    return "  ·  ".join(parts)


def make_up(nodes: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    """What `groups` depends on, cheap to compare: equal make-ups give equal groups."""
    return tuple(
        (
            n["name"],
            n.get("pool"),
            len(gpus),
            gpus[0].get("name") if gpus else None,
            gpus[-1].get("name") if gpus else None,
        )
        for n in nodes
        for gpus in (n.get("gpus") or (),)
    )


def active_reservations(reservations: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node -> the name of the active reservation it is in."""
    return {str(n): str(r["name"]) for r in reservations if r.get("state") == "active" for n in r.get("nodes") or ()}
