"""The health state machine of a node: pure, data in, decision out.

A node's *health* follows its observations (probe reports or the reason it could not be probed); an
operator's *admin state* (drained) or the recovery policy's (isolated) overlays it. The state shown
everywhere is the overlay when set, else the health.

Damping against flapping: a worse state applies at once (a failing node must stop taking work now), a
better one only after `recover_after` consecutive observations at least that good. A node never probed,
or whose last probe is older than `stale_after`, is `unknown`, never `healthy`.

Isolation (issue 12): an isolated node stays out until an operator resumes it or, with `resume_isolated_after`
N, until N probes in a row pass every check (then the scheduler resumes it, with an event). A drained node is
an operator's decision and never resumed by the scheduler; a node that is flaky (`flaky_faults` faults within
`flaky_window`) while isolated waits for an operator even once its faults age out of the window.

Partial evidence (issue 26): a probe of some checks only (`probe --checks dns`) is folded with the node's last
known result of every other check (`merge_partial`), and it may make the node's health worse, never better: a
check it did not run keeps its last result, and only a probe of every check clears a fault, ends a recovery
streak's wait or counts as a pass of an isolated node. It does not refresh `last_probe` either (staleness).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ftconsole.probes.results import ALL_CHECKS, CheckResult, CheckStatus, ProbeReport


class NodeState(StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNREACHABLE = "unreachable"
    DRAINED = "drained"
    ISOLATED = "isolated"


# Severity of observed states; worse applies at once, better needs a streak.
_SEVERITY = {
    NodeState.UNKNOWN: 0,
    NodeState.HEALTHY: 1,
    NodeState.DEGRADED: 2,
    NodeState.UNHEALTHY: 3,
    NodeState.UNREACHABLE: 4,
}
ADMIN_STATES = (NodeState.DRAINED, NodeState.ISOLATED)
FAULT_STATES = ("unhealthy", "unreachable")  # a node event into one of these (or `isolated`) counts as a fault


@dataclass(frozen=True)
class Observation:
    """One probe of one node: a report, or why there is none."""

    time: float
    report: ProbeReport | None = None
    error: str | None = None  # e.g. "connect timed out after 2s", "host key changed: ..."
    # some checks only (`probe --checks`): it may make health worse, never better, and never counts as a pass
    partial: bool = False

    def __post_init__(self) -> None:
        if (self.report is None) == (self.error is None):
            raise ValueError("an observation has either a report or an error")


@dataclass(frozen=True)
class NodeEvent:
    time: float
    node: str
    kind: str  # state-changed | rebooted | drained | resumed | isolated
    message: str
    data: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeHealth:
    node: str
    health: NodeState = NodeState.UNKNOWN
    reasons: tuple[str, ...] = ("not probed yet",)
    since: float | None = None
    admin: NodeState | None = None
    admin_reason: str = ""
    admin_since: float | None = None
    admin_by: str = ""
    pending: NodeState | None = None  # a better state seen `good_streak` times in a row, not yet confirmed
    good_streak: int = 0
    boot_id: str | None = None
    last_probe: float | None = None
    isolated_passes: int = 0  # probes in a row that passed every check since it was isolated
    needs_operator: bool = False  # it was flaky while isolated: only an operator resumes it

    @property
    def state(self) -> NodeState:
        return self.admin or self.health

    def all_reasons(self) -> tuple[str, ...]:
        if self.admin is None:
            return self.reasons
        return (
            f"{self.admin.value}: {self.admin_reason}" if self.admin_reason else self.admin.value,
            *self.reasons,
        )

    def schedulable(self, allow_degraded: bool = False) -> bool:
        if self.admin is not None:
            return False
        return self.health is NodeState.HEALTHY or (allow_degraded and self.health is NodeState.DEGRADED)


def classify(obs: Observation) -> tuple[NodeState, tuple[str, ...]]:
    """The state one observation points to, with its reasons (failing checks first)."""
    if obs.report is None:
        return NodeState.UNREACHABLE, (obs.error or "unreachable",)
    fails = [c for c in obs.report.checks if c.status is CheckStatus.FAIL]
    warns = [c for c in obs.report.checks if c.status is CheckStatus.WARN]
    reasons = tuple(f"{c.name}: {c.message}" if c.message else c.name for c in fails + warns)
    if fails:
        return NodeState.UNHEALTHY, reasons
    if warns:
        return NodeState.DEGRADED, reasons
    return NodeState.HEALTHY, ()


def merge_partial(report: ProbeReport, last: ProbeReport | None) -> ProbeReport:
    """A partial probe's report completed with the node's last known result of each check it did not run (from
    `last`, the node's last report; None: there is none), checks in the agent's order: a failed check nobody ran
    again stays failed. Facts and GPUs are the partial probe's own, as it read them."""
    ran = {c.name for c in report.checks}
    kept = [c for c in (last.checks if last is not None else ()) if c.name not in ran]
    order = {name: i for i, name in enumerate(ALL_CHECKS)}
    checks: list[CheckResult] = sorted([*kept, *report.checks], key=lambda c: order.get(c.name, len(order)))
    return replace(report, checks=tuple(checks))


def _partial_applies(current: NodeState, target: NodeState) -> bool:
    """Whether a partial observation pointing to `target` may fold into a node now `current`: the same state (its
    reasons are updated) or a worse one it found (a check failed or warned); never a better one."""
    if target is current:
        return True
    return target in (NodeState.DEGRADED, NodeState.UNHEALTHY) and _SEVERITY[target] > _SEVERITY[current]


def observe(
    h: NodeHealth,
    obs: Observation,
    *,
    recover_after: int = 2,
    resume_isolated_after: int | None = None,
    flaky: bool = False,
    tests_first: bool = False,
) -> tuple[NodeHealth, list[NodeEvent]]:
    """Fold one observation into a node's health; return the new health and the events it caused.

    `resume_isolated_after` N: an isolated node whose last N probes in a row passed every check (and whose health
    reads healthy) is resumed; None: only an operator resumes it. `flaky`: the node has too many recent faults; an
    isolated flaky node is held for an operator (`needs_operator`), however many probes it passes. `tests_first`:
    such a node is not resumed here but left `due_for_tests` (the node tests decide: `resume_tested`).
    """
    target, _ = classify(obs)
    health, events = _fold(h, obs, recover_after)
    return _isolation(health, obs, target, events, resume_isolated_after, flaky, tests_first), events


def _fold(h: NodeHealth, obs: Observation, recover_after: int) -> tuple[NodeHealth, list[NodeEvent]]:
    target, reasons = classify(obs)
    events: list[NodeEvent] = []
    boot_id = h.boot_id
    if obs.report is not None and obs.report.facts.boot_id:
        new_boot = obs.report.facts.boot_id
        if boot_id is not None and new_boot != boot_id:
            events.append(NodeEvent(obs.time, h.node, "rebooted", "node rebooted (boot id changed)"))
        boot_id = new_boot
    base = replace(h, boot_id=boot_id, last_probe=h.last_probe if obs.partial else obs.time)
    if obs.partial and not _partial_applies(h.health, target):
        return base, events  # no evidence about the checks it did not run: only a full probe makes it better

    if target is h.health:
        return replace(base, reasons=reasons, pending=None, good_streak=0), events

    worse = _SEVERITY[target] > _SEVERITY[h.health]
    if worse or h.health is NodeState.UNKNOWN:
        return _move(base, target, reasons, obs.time, events), events

    # Better than now: confirm over a streak of consecutive observations pointing to the same state.
    streak = h.good_streak + 1 if h.pending is target else 1
    if streak >= recover_after:
        return _move(base, target, reasons, obs.time, events), events
    note = f"recovering: {streak} of {recover_after} probes {target.value}"
    kept = tuple(r for r in h.reasons if not r.startswith("recovering: "))
    return replace(base, reasons=(*kept, note), pending=target, good_streak=streak), events


def _move(
    h: NodeHealth, target: NodeState, reasons: tuple[str, ...], now: float, events: list[NodeEvent]
) -> NodeHealth:
    why = "; ".join(reasons) if reasons else "all checks pass"
    events.append(
        NodeEvent(
            now,
            h.node,
            "state-changed",
            f"{h.health.value} -> {target.value}: {why}",
            {"from": h.health.value, "to": target.value},
        )
    )
    return replace(h, health=target, reasons=reasons, since=now, pending=None, good_streak=0)


def _isolation(
    h: NodeHealth,
    obs: Observation,
    target: NodeState,
    events: list[NodeEvent],
    resume_after: int | None,
    flaky: bool,
    tests_first: bool = False,
) -> NodeHealth:
    """An isolated node's streak of passing probes, and its resume by the scheduler once the streak is long enough
    (with `tests_first`, once its node tests pass as well: `due_for_tests`)."""
    if h.admin is not NodeState.ISOLATED:
        return h
    held = h.needs_operator or flaky
    if target is not NodeState.HEALTHY:
        return replace(h, isolated_passes=0, needs_operator=held)
    passes = h.isolated_passes + (0 if obs.partial else 1)
    h = replace(h, isolated_passes=passes, needs_operator=held)
    if resume_after is None or held or passes < resume_after or h.health is not NodeState.HEALTHY or tests_first:
        return h
    was = f"isolated by {h.admin_by}: {h.admin_reason}" if h.admin_reason else f"isolated by {h.admin_by}"
    message = f"resumed by scheduler: passed the checks {passes} times in a row since it was isolated ({was})"
    data = {"by": "scheduler", "passes": passes, "out_s": _out_s(h, obs.time)}
    events.append(NodeEvent(obs.time, h.node, "resumed", message, data))
    return _no_admin(h)


def due_for_tests(h: NodeHealth, resume_after: int | None) -> bool:
    """An isolated node that its probes would resume (`resume_after` passes in a row, healthy, not held for an
    operator): the node tests decide whether it takes work again."""
    return (
        h.admin is NodeState.ISOLATED and resume_after is not None and not h.needs_operator
        and h.isolated_passes >= resume_after and h.health is NodeState.HEALTHY
    )  # fmt: skip


def resume_tested(h: NodeHealth, passed: bool, line: str, now: float) -> tuple[NodeHealth, list[NodeEvent]]:
    """The node tests of an isolated node that was `due_for_tests`: a pass resumes it (by the scheduler); a failure
    keeps it isolated, with the failing tests as its reason, and its streak of passing probes starts again."""
    if h.admin is not NodeState.ISOLATED:
        return h, []  # an operator resumed or drained it meanwhile: theirs to decide
    if not passed:
        return replace(h, isolated_passes=0, admin_reason=f"node tests failed: {line}", admin_by="scheduler"), []
    was = f"isolated by {h.admin_by}: {h.admin_reason}" if h.admin_reason else f"isolated by {h.admin_by}"
    message = (
        f"resumed by scheduler: passed the checks {h.isolated_passes} times in a row and the node tests ({line}) "
        f"since it was isolated ({was})"
    )
    data = {"by": "scheduler", "passes": h.isolated_passes, "tested": True, "out_s": _out_s(h, now)}
    return _no_admin(h), [NodeEvent(now, h.node, "resumed", message, data)]


@dataclass
class Returns:
    """Nodes put back in service (a `resumed` event), and how long they had been out, by who put them back:
    `scheduler` or `operator` (`ftconsole_node_returns_total`, `ftconsole_node_out_of_service_seconds_total`)."""

    count: dict[str, int] = field(default_factory=lambda: {"scheduler": 0, "operator": 0})
    out_s: dict[str, float] = field(default_factory=lambda: {"scheduler": 0.0, "operator": 0.0})

    def add(self, events: Iterable[NodeEvent]) -> None:
        for event in events:
            if event.kind == "resumed":
                who = "scheduler" if str(event.data.get("by", "")).startswith("scheduler") else "operator"
                out = event.data.get("out_s")
                self.count[who] += 1
                self.out_s[who] += float(out) if isinstance(out, int | float) else 0.0


def _out_s(h: NodeHealth, now: float) -> float | None:
    """How long a node being resumed was out of service (drained or isolated), in seconds; None: unknown."""
    return round(max(0.0, now - h.admin_since), 1) if h.admin_since is not None else None


def _no_admin(h: NodeHealth) -> NodeHealth:
    return replace(
        h, admin=None, admin_reason="", admin_since=None, admin_by="", isolated_passes=0, needs_operator=False
    )


def is_fault(kind: str, data: Mapping[str, Any]) -> bool:
    """A node event that counts as a fault: into unhealthy or unreachable, or isolated."""
    return kind == "isolated" or (kind == "state-changed" and data.get("to") in FAULT_STATES)


def faults_in_window(times: Iterable[float], now: float, window: float) -> int:
    """How many of these fault times fall within the `window` seconds up to `now` (its start included; a time
    after `now`, from a clock a little ahead, counts too)."""
    return sum(1 for t in times if t >= now - window)


def stale(h: NodeHealth, now: float, stale_after: float) -> NodeHealth:
    """A node whose last probe is too old reads `unknown`: old good news is no news."""
    if h.last_probe is None or now - h.last_probe <= stale_after or h.health is NodeState.UNKNOWN:
        return h
    return replace(h, health=NodeState.UNKNOWN, reasons=(f"last probe {now - h.last_probe:.0f}s ago",))


def set_admin(
    h: NodeHealth, state: NodeState | None, reason: str, by: str, now: float
) -> tuple[NodeHealth, list[NodeEvent]]:
    """Drain, isolate or resume a node (state None = resume).

    Isolating a drained node keeps it drained (an operator's decision, which the scheduler never lifts); the
    `isolated` event still records the fault. Any change restarts an isolated node's streak of passing probes.
    """
    if state is not None and state not in ADMIN_STATES:
        raise ValueError(f"{state} is not an admin state")
    if state is None:
        if h.admin is None:
            return h, []
        data: dict[str, object] = {"by": by, "out_s": _out_s(h, now)}
        event = NodeEvent(now, h.node, "resumed", f"resumed by {by} (was {h.admin.value}: {h.admin_reason})", data)
        return _no_admin(h), [event]
    if state is NodeState.ISOLATED and h.admin is NodeState.DRAINED:
        message = f"isolated by {by}: {reason} (it stays drained: {h.admin_reason})"
        return h, [NodeEvent(now, h.node, state.value, message, {"reason": reason, "kept": h.admin.value})]
    event = NodeEvent(now, h.node, state.value, f"{state.value} by {by}: {reason}", {"reason": reason})
    held = h.needs_operator and state is NodeState.ISOLATED and h.admin is NodeState.ISOLATED
    changed = replace(h, admin=state, admin_reason=reason, admin_since=now, admin_by=by)
    return replace(changed, isolated_passes=0, needs_operator=held), [event]
