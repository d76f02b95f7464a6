"""The alerts a change of a node's health raises and resolves (pure): unhealthy, unreachable, a host key,
isolated, flaky. The node service (nodeops.py) and the node gate (nodegate.py) write them with the change."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState, is_fault
from ftconsole.scheduler.spec.config import ProbeSettings, format_duration
from ftconsole.scheduler.ssh.probing import ProbeFailure
from ftconsole.scheduler.store.records import AutoResolve, NewAlert, StoredEvent

HOST_KEY_FAILURES = ("host-key-unknown", "host-key-changed")
_RECOVERED = (NodeState.HEALTHY, NodeState.DEGRADED)


def node_alerts(
    before: NodeHealth, after: NodeHealth, failure: ProbeFailure | None, open_kinds: Collection[str], now: float
) -> tuple[list[NewAlert], list[AutoResolve]]:
    """The alerts one probe raises and resolves for a node (pure): on a change of its health, not every probe.

    Into unhealthy: node_unhealthy (and an open node_unreachable is over: it answers). Into unreachable:
    node_unreachable. Back to healthy or degraded: both resolved. A host key that is unknown or changed: host_key
    (critical) while none is open; resolved by the first probe that gets a report. The store raises each kind
    only while none is open for the node, so a state reached again before it recovered raises nothing new.
    """
    name = after.node
    raised: list[NewAlert] = []
    resolved: list[AutoResolve] = []
    why = "; ".join(after.reasons) or after.health.value
    if after.health is not before.health:
        if after.health is NodeState.UNHEALTHY:
            raised.append(NewAlert(now, "node_unhealthy", "error", f"{name} is unhealthy: {why}", node=name))
            resolved.append(AutoResolve(now, name, "node_unreachable", "it answers probes again"))
        elif after.health is NodeState.UNREACHABLE:
            raised.append(NewAlert(now, "node_unreachable", "error", f"{name} is unreachable: {why}", node=name))
        elif after.health in _RECOVERED:
            for kind in ("node_unhealthy", "node_unreachable"):
                resolved.append(AutoResolve(now, name, kind, f"{name} is {after.health.value} again"))
    if failure is not None and failure.kind in HOST_KEY_FAILURES:
        if "host_key" not in open_kinds:
            message = f"{name}: {failure.message}"
            raised.append(NewAlert(now, "host_key", "critical", message, node=name))
    elif failure is None and "host_key" in open_kinds:
        resolved.append(AutoResolve(now, name, "host_key", "its host key was verified"))
    return raised, resolved


def isolation_alerts(events: Sequence[NodeEvent]) -> tuple[list[NewAlert], list[AutoResolve]]:
    """A node isolated (by the recovery policy, or an operator) raises `node_isolated`: a person decides when
    it comes back, or sees it come back by itself (probes.isolation_recover_after); resumed: resolved."""
    raised, resolved = [], []
    for e in events:
        if e.kind == NodeState.ISOLATED.value:
            raised.append(NewAlert(e.time, "node_isolated", "error", f"{e.node} {e.message}", node=e.node))
        elif e.kind == "resumed":
            resolved.append(AutoResolve(e.time, e.node, "node_isolated", e.message))
    return raised, resolved


FLAKY_ALERT_LAST = 3  # the faults a node_flaky alert names, newest last


def flaky_alert(
    name: str, past: Sequence[StoredEvent], events: Sequence[NodeEvent], now: float, settings: ProbeSettings
) -> NewAlert | None:
    """The node_flaky alert a change of a node raises (pure): when one of its `events` is a fault and, with it, the
    node's faults within `flaky_window` (`past`: its fault events so far) reach `flaky_faults`.

    The store raises it only while none is open or acknowledged for the node; ftconsole never resolves it (an
    operator looks at the node first), and a fault after it was resolved raises a new one while still flaky.
    """
    new = [(e.time, e.message) for e in events if is_fault(e.kind, e.data)]
    if not new:
        return None
    since = now - settings.flaky_window
    recent = [(t, message) for t, message in [*((e.time, e.message) for e in past), *new] if t >= since]
    if len(recent) < settings.flaky_faults:
        return None
    last = "; ".join(f"{_clock(t)} {_cut(message)}" for t, message in recent[-FLAKY_ALERT_LAST:])
    message = (
        f"{name} is flaky: {len(recent)} faults within {format_duration(settings.flaky_window)} (the last: {last}); "
        f"it is not resumed automatically: look at it before `ftconsole resume {name}`"
    )
    return NewAlert(now, "node_flaky", "warning", message, node=name)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _cut(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
