"""The node health state machine, from tables: worse at once, better after a streak."""

from __future__ import annotations

import pytest

from ftconsole.probes.health import NodeHealth, NodeState, Observation, classify, observe, set_admin, stale
from ftconsole.probes.results import CheckResult, CheckStatus, NodeFacts, ProbeReport

H, D, U, X, K = (NodeState.HEALTHY, NodeState.DEGRADED, NodeState.UNHEALTHY, NodeState.UNREACHABLE, NodeState.UNKNOWN)


def report(*statuses: CheckStatus, boot: str = "b1") -> ProbeReport:
    checks = tuple(CheckResult(f"check{i}", s, message=f"m{i}") for i, s in enumerate(statuses))
    return ProbeReport(facts=NodeFacts(boot_id=boot), gpus=(), checks=checks)


def obs_for(state: NodeState, t: float = 0.0) -> Observation:
    if state is X:
        return Observation(t, error="connect timed out after 2s")
    status = {H: CheckStatus.PASS, D: CheckStatus.WARN, U: CheckStatus.FAIL}[state]
    return Observation(t, report=report(CheckStatus.PASS, status))


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        ([H], [H]),
        ([U], [U]),
        ([H, U], [H, U]),  # worse applies at once
        ([H, X], [H, X]),
        ([U, H], [U, U]),  # better waits for the streak (recover_after=2)
        ([U, H, H], [U, U, H]),
        ([U, H, U, H, H], [U, U, U, U, H]),  # a relapse restarts the streak
        ([X, D, D], [X, X, D]),
        ([X, D, H, H], [X, X, X, H]),  # the streak counts the same target only
        ([H, D, H, H], [H, D, D, H]),
        ([D, U, D, D], [D, U, U, D]),
    ],
)
def test_transitions_with_damping(sequence: list[NodeState], expected: list[NodeState]) -> None:
    h = NodeHealth("n1")
    seen = []
    for i, state in enumerate(sequence):
        h, _ = observe(h, obs_for(state, float(i)), recover_after=2)
        seen.append(h.health)
    assert seen == expected


def test_recover_after_one_is_immediate() -> None:
    h, _ = observe(NodeHealth("n1"), obs_for(U), recover_after=1)
    h, _ = observe(h, obs_for(H, 1), recover_after=1)
    assert h.health is H


def test_state_change_events_and_reasons() -> None:
    h, events = observe(NodeHealth("n1"), obs_for(H, 1))
    assert [e.kind for e in events] == ["state-changed"] and h.reasons == ()
    h, events = observe(h, obs_for(U, 2))
    assert h.reasons == ("check1: m1",)
    assert events[0].data == {"from": "healthy", "to": "unhealthy"}
    h, events = observe(h, obs_for(U, 3))
    assert events == [] and h.since == 2
    h, events = observe(h, obs_for(H, 4))
    assert events == [] and h.reasons[-1] == "recovering: 1 of 2 probes healthy"


def test_reboot_detected_from_boot_id() -> None:
    h, _ = observe(NodeHealth("n1"), Observation(1, report=report(boot="a")))
    h, events = observe(h, Observation(2, report=report(boot="b")))
    assert [e.kind for e in events] == ["rebooted"] and h.boot_id == "b"


def test_classify_orders_failures_before_warnings() -> None:
    state, reasons = classify(Observation(0, report=report(CheckStatus.WARN, CheckStatus.FAIL, CheckStatus.SKIP)))
    assert state is U and reasons == ("check1: m1", "check0: m0")


def test_observation_needs_exactly_one_of_report_or_error() -> None:
    with pytest.raises(ValueError):
        Observation(0)
    with pytest.raises(ValueError):
        Observation(0, report=report(), error="x")


def test_admin_overlay_keeps_health_underneath() -> None:
    h, _ = observe(NodeHealth("n1"), obs_for(H))
    h, events = set_admin(h, NodeState.DRAINED, "bad fan", "alice", 5)
    assert h.state is NodeState.DRAINED and h.health is H and not h.schedulable()
    assert events[0].message == "drained by alice: bad fan"
    h, _ = observe(h, obs_for(U, 6))
    assert h.state is NodeState.DRAINED and h.health is U
    h, events = set_admin(h, None, "", "bob", 7)
    assert h.state is U and "resumed by bob" in events[0].message
    assert set_admin(h, None, "", "bob", 8) == (h, [])


def test_schedulable() -> None:
    healthy, _ = observe(NodeHealth("n"), obs_for(H))
    degraded, _ = observe(NodeHealth("n"), obs_for(D))
    assert healthy.schedulable() and not degraded.schedulable() and degraded.schedulable(allow_degraded=True)
    assert not NodeHealth("n").schedulable()


def test_stale_reads_unknown_never_healthy() -> None:
    h, _ = observe(NodeHealth("n1"), obs_for(H, 100))
    assert stale(h, 150, 60).health is H
    old = stale(h, 200, 60)
    assert old.health is K and old.reasons == ("last probe 100s ago",)
