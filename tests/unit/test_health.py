"""The node health state machine, from tables: worse at once, better after a streak."""

from __future__ import annotations

import pytest

from ftconsole.probes.health import (
    NodeHealth,
    NodeState,
    Observation,
    Returns,
    classify,
    merge_partial,
    observe,
    set_admin,
    stale,
)
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


def test_a_resume_says_how_long_the_node_was_out_and_returns_count_it_by_who() -> None:
    h, _ = observe(NodeHealth("n1"), obs_for(H))
    h, _ = set_admin(h, NodeState.ISOLATED, "Xid 79", "scheduler", 100)
    back, events = set_admin(h, None, "", "alice", 3700)
    assert events[0].data == {"by": "alice", "out_s": 3600.0}
    returns = Returns()
    returns.add(events)
    isolated, _ = set_admin(back, NodeState.ISOLATED, "Xid 48", "scheduler", 4000)
    passed = isolated
    for t in (4010, 4020):  # resumed by the scheduler after 2 passing probes
        passed, more = observe(passed, obs_for(H, t), resume_isolated_after=2)
    returns.add(more)
    assert more[-1].kind == "resumed" and more[-1].data["out_s"] == 20.0
    assert (returns.count, returns.out_s) == ({"scheduler": 1, "operator": 1}, {"scheduler": 20.0, "operator": 3600.0})


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


# -- partial probes (issue 26): some checks only, folded with the last result of the others --------------------

P, W, F = CheckStatus.PASS, CheckStatus.WARN, CheckStatus.FAIL


def checks(**statuses: CheckStatus) -> ProbeReport:
    """A report of named checks (`gpu_health=F` is the check "gpu-health")."""
    named = tuple(CheckResult(name.replace("_", "-"), s, message=f"{name} {s}") for name, s in statuses.items())
    return ProbeReport(facts=NodeFacts(boot_id="b1"), gpus=(), checks=named)


FULL_ECC = checks(dns=P, gpu_health=F, memory=P)  # a full probe: a GPU with uncorrectable ECC errors
FULL_OK = checks(dns=P, gpu_health=P, memory=P)
FULL_DNS = checks(dns=F, gpu_health=P, memory=P)


def fold(steps: list[tuple[ProbeReport, bool]]) -> tuple[NodeHealth, list[str]]:
    """Observe each (report, partial) in turn as the service does: a partial report merged with the last report."""
    h, last, kinds = NodeHealth("n1"), None, []
    for i, (rep, partial) in enumerate(steps):
        known = merge_partial(rep, last) if partial else rep
        h, events = observe(h, Observation(float(i), report=known, partial=partial), recover_after=2)
        kinds += [e.data.get("to", e.kind) for e in events]
        last = known
    return h, [str(k) for k in kinds]


@pytest.mark.parametrize(
    ("steps", "health", "reasons", "changes"),
    [
        pytest.param(  # the issue: two dns-only probes of an ECC-failed node, once read as two passes
            [(FULL_ECC, False), (checks(dns=P), True), (checks(dns=P), True)],
            U,
            ("gpu-health: gpu_health fail",),
            ["unhealthy"],
            id="dns-only-never-clears-ecc",
        ),
        pytest.param(  # the failed check itself, run alone and passing, is still no full evidence
            [(FULL_ECC, False), (checks(gpu_health=P), True), (checks(gpu_health=P), True)],
            U,
            ("gpu-health: gpu_health fail",),
            ["unhealthy"],
            id="partial-pass-of-the-failed-check",
        ),
        pytest.param(  # a partial failure is evidence: worse at once, the others' last results kept
            [(FULL_OK, False), (checks(dns=F), True)],
            U,
            ("dns: dns fail",),
            ["healthy", "unhealthy"],
            id="partial-failure-applies",
        ),
        pytest.param(  # unhealthy for one reason, a partial probe adds another and keeps the first
            [(FULL_ECC, False), (checks(dns=F), True)],
            U,
            ("dns: dns fail", "gpu-health: gpu_health fail"),
            ["unhealthy"],
            id="reasons-merge",
        ),
        pytest.param(
            [(FULL_OK, False), (checks(memory=W), True)],
            D,
            ("memory: memory warn",),
            ["healthy", "degraded"],
            id="partial-warning-applies",
        ),
        pytest.param(  # no full probe yet: a passing partial probe proves nothing
            [(checks(dns=P), True), (checks(dns=P), True)],
            K,
            ("not probed yet",),
            [],
            id="never-probed-stays-unknown",
        ),
        pytest.param(  # only full probes end a fault, two in a row (recover_after=2)
            [(FULL_ECC, False), (checks(dns=P), True), (FULL_OK, False), (checks(dns=P), True), (FULL_OK, False)],
            H,
            (),
            ["unhealthy", "healthy"],
            id="full-probes-recover",
        ),
        pytest.param(  # a partial pass neither counts toward a recovery streak nor breaks it
            [(FULL_DNS, False), (FULL_OK, False), (checks(dns=P), True)],
            U,
            ("dns: dns fail", "recovering: 1 of 2 probes healthy"),
            ["unhealthy"],
            id="streak-not-advanced",
        ),
        pytest.param(  # a partial probe that still sees the fault restarts the streak, as a full one does
            [(FULL_ECC, False), (FULL_OK, False), (checks(gpu_health=F), True)],
            U,
            ("gpu-health: gpu_health fail",),
            ["unhealthy"],
            id="partial-relapse-restarts-streak",
        ),
    ],
)
def test_partial_probes_never_clear_what_they_did_not_check(
    steps: list[tuple[ProbeReport, bool]], health: NodeState, reasons: tuple[str, ...], changes: list[str]
) -> None:
    h, kinds = fold(steps)
    assert (h.health, h.reasons, kinds) == (health, reasons, changes)


def test_an_unreachable_node_is_not_made_reachable_by_a_partial_probe() -> None:
    h, _ = observe(NodeHealth("n1"), Observation(1.0, error="timeout: no answer"))
    h, events = observe(h, Observation(2.0, report=merge_partial(checks(dns=F), None), partial=True))
    assert (h.health, events) == (X, [])


def test_a_partial_probe_does_not_make_old_news_fresh() -> None:
    h, _ = observe(NodeHealth("n1"), Observation(100.0, report=FULL_OK))
    h, _ = observe(h, Observation(500.0, report=merge_partial(checks(dns=P), FULL_OK), partial=True))
    assert h.last_probe == 100.0 and stale(h, 500.0, 60).health is K


@pytest.mark.parametrize(
    ("partial", "last", "names"),
    [
        (checks(dns=P), FULL_ECC, [("dns", P), ("gpu-health", F), ("memory", P)]),
        (checks(gpu_health=P), FULL_ECC, [("dns", P), ("gpu-health", P), ("memory", P)]),
        (checks(dns=F), None, [("dns", F)]),
        (checks(memory=W, dns=P), checks(load=F), [("dns", P), ("memory", W), ("load", F)]),  # the agent's order
    ],
)
def test_merge_partial_keeps_the_last_result_of_checks_not_run(
    partial: ProbeReport, last: ProbeReport | None, names: list[tuple[str, CheckStatus]]
) -> None:
    merged = merge_partial(partial, last)
    assert [(c.name, c.status) for c in merged.checks] == names and merged.facts == partial.facts
