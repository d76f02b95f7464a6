"""Which alerts one probe raises and resolves for a node (`service.node_alerts`, pure), from a table."""

from __future__ import annotations

import pytest

from ftconsole.probes.health import NodeEvent, NodeHealth, NodeState, set_admin
from ftconsole.scheduler.nodealerts import isolation_alerts, node_alerts
from ftconsole.scheduler.ssh.probing import ProbeFailure

H, D, U, X, K = NodeState.HEALTHY, NodeState.DEGRADED, NodeState.UNHEALTHY, NodeState.UNREACHABLE, NodeState.UNKNOWN
CHANGED = ProbeFailure("host-key-changed", "host key changed: the key of 10.0.0.1 does not match known_hosts")
REFUSED = ProbeFailure("unreachable", "connection refused")


def node(health: NodeState, *reasons: str) -> NodeHealth:
    return NodeHealth("gpu01", health=health, reasons=reasons)


CASES = [
    # (case, before, after, failure, open kinds, raised kinds, resolved kinds)
    ("healthy stays healthy", node(H), node(H), None, set(), [], []),
    ("first probe finds it down", node(K), node(X, "unreachable: refused"), REFUSED, set(), ["node_unreachable"], []),
    ("goes down", node(H), node(X, "unreachable: refused"), REFUSED, set(), ["node_unreachable"], []),
    ("stays down: nothing new", node(X, "r"), node(X, "r"), REFUSED, {"node_unreachable"}, [], []),
    ("a check fails", node(H), node(U, "gpu-health: ECC"), None, set(), ["node_unhealthy"], ["node_unreachable"]),
    ("answers again but unhealthy", node(X), node(U, "x"), None, set(), ["node_unhealthy"], ["node_unreachable"]),
    ("recovering: not yet", node(X), node(X, "recovering: 1 of 2"), None, set(), [], []),
    ("healthy again", node(U), node(H), None, set(), [], ["node_unhealthy", "node_unreachable"]),
    ("degraded counts as well again", node(X), node(D, "w"), None, set(), [], ["node_unhealthy", "node_unreachable"]),
    # a move into healthy or degraded closes whatever is still open, if anything (none here: a no-op)
    ("degrades: no alert", node(H), node(D, "temp"), None, set(), [], ["node_unhealthy", "node_unreachable"]),
    ("host key changed", node(H), node(X, "k"), CHANGED, set(), ["node_unreachable", "host_key"], []),
    ("host key still wrong, alert open", node(X), node(X, "k"), CHANGED, {"host_key", "node_unreachable"}, [], []),
    ("host key verified again", node(X), node(X, "recovering"), None, {"host_key"}, [], ["host_key"]),
    ("unreachable for another reason: host key alert stays", node(X), node(X), REFUSED, {"host_key"}, [], []),
]


@pytest.mark.parametrize(
    ("before", "after", "failure", "open_kinds", "raised", "resolved"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_node_alerts(
    before: NodeHealth,
    after: NodeHealth,
    failure: ProbeFailure | None,
    open_kinds: set[str],
    raised: list[str],
    resolved: list[str],
) -> None:
    up, down = node_alerts(before, after, failure, open_kinds, 7.0)
    assert [a.kind for a in up] == raised
    assert [r.kind for r in down] == resolved
    assert all(a.node == "gpu01" and a.job is None and a.time == 7.0 for a in up)
    assert all(r.node == "gpu01" and r.time == 7.0 for r in down)


def test_alert_messages_and_severities() -> None:
    (down,), _ = node_alerts(node(H), node(X, "unreachable: connection refused"), REFUSED, set(), 1.0)
    assert (down.severity, down.message) == ("error", "gpu01 is unreachable: unreachable: connection refused")
    (sick,), _ = node_alerts(node(H), node(U, "gpu-health: GPU 2 ECC", "load: high"), None, set(), 1.0)
    assert sick.message == "gpu01 is unhealthy: gpu-health: GPU 2 ECC; load: high"
    (_, key), _ = node_alerts(node(H), node(X, "k"), CHANGED, set(), 1.0)
    assert (key.kind, key.severity) == ("host_key", "critical")
    assert key.message == f"gpu01: {CHANGED.message}"
    _, (a, b) = node_alerts(node(U), node(H), None, set(), 1.0)
    assert a.why == b.why == "gpu01 is healthy again"


def test_an_isolation_raises_node_isolated_and_a_resume_resolves_it() -> None:
    isolated, events = set_admin(
        NodeHealth("gpu01"), NodeState.ISOLATED, "job 4 attempt 1: gpu-health: ECC", "scheduler", 5.0
    )
    (alert,), resolved = isolation_alerts(events)
    assert (alert.kind, alert.severity, alert.node, resolved) == ("node_isolated", "error", "gpu01", [])
    assert alert.message == "gpu01 isolated by scheduler: job 4 attempt 1: gpu-health: ECC"
    _, back = set_admin(isolated, None, "", "alice", 9.0)
    raised, (done,) = isolation_alerts(back)
    assert raised == [] and (done.node, done.kind, done.time) == ("gpu01", "node_isolated", 9.0)
    assert done.why.startswith("resumed by alice (was isolated: job 4 attempt 1")
    assert isolation_alerts([NodeEvent(1.0, "gpu01", "drained", "drained by bob: bios")]) == ([], [])
