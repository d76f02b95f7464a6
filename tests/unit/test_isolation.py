"""Isolation (issue 12), the pure parts from tables: an isolated node resumed after N passing probes in a row
(never a drained one, never a flaky one), faults counted within a window, the node_flaky alert, the store's
columns and fault history, the config keys and the console's flaky mark."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rich.text import Text

from ftconsole.probes.health import (
    NodeEvent,
    NodeHealth,
    NodeState,
    Observation,
    faults_in_window,
    is_fault,
    observe,
    set_admin,
)
from ftconsole.probes.results import CheckResult, CheckStatus, NodeFacts, ProbeReport
from ftconsole.scheduler.nodealerts import flaky_alert
from ftconsole.scheduler.nodeops import NodeView
from ftconsole.scheduler.spec.config import Node, ProbeSettings
from ftconsole.scheduler.store.db import Store
from ftconsole.scheduler.store.records import StoredEvent
from ftconsole.tui import rows as R
from tests.unit.conftest import StoreAt

H, D, U, X = NodeState.HEALTHY, NodeState.DEGRADED, NodeState.UNHEALTHY, NodeState.UNREACHABLE
IS = NodeState.ISOLATED
HOUR = 3600.0


def obs_for(state: NodeState, t: float, *, partial: bool = False) -> Observation:
    if state is X:
        return Observation(t, error="connect timed out after 2s")
    status = {H: CheckStatus.PASS, D: CheckStatus.WARN, U: CheckStatus.FAIL}[state]
    checks = (CheckResult("gpu_ecc", status, message="ecc"),)
    return Observation(t, report=ProbeReport(facts=NodeFacts(boot_id="b"), gpus=(), checks=checks), partial=partial)


def isolated(health: NodeState = H) -> NodeHealth:
    h = NodeHealth("n1", health=health, reasons=(), since=0.0, last_probe=0.0)
    h, _ = set_admin(h, NodeState.ISOLATED, "job 7 attempt 1: rank 0 lost", "scheduler", 1.0)
    return h


def run(
    h: NodeHealth, states: list[NodeState], *, after: int | None = 3, flaky: bool = False, partial: bool = False
) -> tuple[NodeHealth, list[NodeEvent], list[tuple[NodeState | None, int]]]:
    """Fold one probe per state in; the health, every event, and (admin, passes) after each probe."""
    events: list[NodeEvent] = []
    seen: list[tuple[NodeState | None, int]] = []
    for i, state in enumerate(states):
        h, new = observe(h, obs_for(state, 10.0 + i, partial=partial), resume_isolated_after=after, flaky=flaky)
        events += new
        seen.append((h.admin, h.isolated_passes))
    return h, events, seen


@pytest.mark.parametrize(
    ("states", "after", "expected"),
    [
        ([H, H, H], 3, [(IS, 1), (IS, 2), (None, 0)]),  # the third passing probe in a row resumes it
        ([H, H, H], 1, [(None, 0), (None, 0), (None, 0)]),
        ([H, H, D, H, H, H], 3, [(IS, 1), (IS, 2), (IS, 0), (IS, 1), (IS, 2), (None, 0)]),  # a warning restarts it
        ([H, U, H, H], 3, [(IS, 1), (IS, 0), (IS, 1), (IS, 2)]),
        ([H, X, H, H, H], 3, [(IS, 1), (IS, 0), (IS, 1), (IS, 2), (None, 0)]),  # no answer is no pass
        ([H, H, H, H], None, [(IS, 1), (IS, 2), (IS, 3), (IS, 4)]),  # not configured: only an operator resumes it
    ],
)
def test_isolated_node_is_resumed_after_n_passing_probes_in_a_row(
    states: list[NodeState], after: int | None, expected: list[tuple[NodeState | None, int]]
) -> None:
    _, _, seen = run(isolated(), states, after=after)
    assert seen == expected


def test_the_resume_is_an_event_naming_the_streak_and_the_isolation() -> None:
    h, events, _ = run(isolated(), [H, H, H])
    (resumed,) = [e for e in events if e.kind == "resumed"]
    assert resumed.message == (
        "resumed by scheduler: passed the checks 3 times in a row since it was isolated "
        "(isolated by scheduler: job 7 attempt 1: rank 0 lost)"
    )
    assert resumed.data == {"by": "scheduler", "passes": 3, "out_s": 11.0} and resumed.time == 12.0
    assert h.state is H and h.schedulable() and (h.admin_reason, h.admin_by, h.admin_since) == ("", "", None)


def test_an_unhealthy_isolated_node_is_resumed_only_once_its_health_reads_healthy() -> None:
    """The damping (recover_after=2) still holds: the first passing probe is not yet healthy, so N=1 waits."""
    h, events, seen = run(isolated(U), [H, H], after=1)
    assert seen == [(IS, 1), (None, 0)]
    assert [e.kind for e in events] == ["state-changed", "resumed"] and h.health is H


def test_a_probe_of_some_checks_only_is_no_pass_but_a_failure_still_counts() -> None:
    h, _, seen = run(isolated(), [H, H, H], partial=True)
    assert seen == [(IS, 0)] * 3
    h, _ = observe(h, obs_for(H, 20.0), resume_isolated_after=3)
    assert h.isolated_passes == 1
    h, _ = observe(h, obs_for(U, 21.0, partial=True), resume_isolated_after=3)
    assert h.isolated_passes == 0


def test_a_drained_node_is_never_resumed_by_the_scheduler() -> None:
    h, _ = set_admin(NodeHealth("n1", health=H, reasons=()), NodeState.DRAINED, "fan alarm", "alice", 1.0)
    h, events, seen = run(h, [H] * 5, after=1)
    assert seen == [(NodeState.DRAINED, 0)] * 5 and events == []


def test_isolating_a_drained_node_keeps_the_drain_and_records_the_fault() -> None:
    h, _ = set_admin(NodeHealth("n1", health=H, reasons=()), NodeState.DRAINED, "fan alarm", "alice", 1.0)
    after, (event,) = set_admin(h, NodeState.ISOLATED, "job 3: NCCL error", "scheduler", 2.0)
    assert after == h  # still drained by alice: an operator's decision stands
    assert event.kind == "isolated" and is_fault(event.kind, event.data)
    assert event.message == "isolated by scheduler: job 3: NCCL error (it stays drained: fan alarm)"
    assert run(after, [H] * 3, after=1)[0].admin is NodeState.DRAINED


def test_a_flaky_isolated_node_waits_for_an_operator_even_after_its_faults_age_out() -> None:
    h, events, seen = run(isolated(), [H, H, H, H], after=2, flaky=True)
    assert [a for a, _ in seen] == [IS] * 4 and events == [] and h.needs_operator
    h, events, seen = run(h, [H, H, H], after=2, flaky=False)  # the window moved on: still held
    assert [a for a, _ in seen] == [IS] * 3 and events == [] and h.needs_operator
    h, (event,) = set_admin(h, None, "", "alice", 30.0)  # an operator looked
    assert event.message.startswith("resumed by alice (was isolated: ") and not h.needs_operator
    assert h.state is H and h.isolated_passes == 0


def test_flaky_is_held_from_a_failing_probe_too_and_kept_when_isolated_again() -> None:
    h, _, _ = run(isolated(), [U], flaky=True)
    assert h.needs_operator
    h, _ = set_admin(h, NodeState.ISOLATED, "again", "scheduler", 40.0)
    assert h.needs_operator and h.isolated_passes == 0
    h, _ = set_admin(h, NodeState.DRAINED, "look", "alice", 41.0)
    assert not h.needs_operator


def test_a_node_not_isolated_counts_no_passes() -> None:
    _, events, seen = run(NodeHealth("n1", health=H, reasons=()), [H, H, H], after=1)
    assert seen == [(None, 0)] * 3 and events == []


# -- faults within a window ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("times", "now", "window", "expected"),
    [
        ([], 100.0, 50.0, 0),
        ([10.0, 60.0, 90.0], 100.0, 50.0, 2),
        ([50.0], 100.0, 50.0, 1),  # the window's start counts
        ([49.9], 100.0, 50.0, 0),
        ([101.0], 100.0, 50.0, 1),  # a clock a little ahead
        ([0.0, 1.0, 2.0], 24 * HOUR, 24 * HOUR, 3),
    ],
)
def test_faults_in_window(times: list[float], now: float, window: float, expected: int) -> None:
    assert faults_in_window(times, now, window) == expected


@pytest.mark.parametrize(
    ("kind", "data", "fault"),
    [
        ("state-changed", {"to": "unhealthy"}, True),
        ("state-changed", {"to": "unreachable"}, True),
        ("state-changed", {"to": "degraded"}, False),
        ("state-changed", {"to": "healthy"}, False),
        ("isolated", {"reason": "x"}, True),
        ("drained", {"reason": "x"}, False),
        ("resumed", {}, False),
        ("rebooted", {}, False),
    ],
)
def test_what_counts_as_a_fault(kind: str, data: dict[str, str], fault: bool) -> None:
    assert is_fault(kind, data) is fault


def stored(i: int, t: float, message: str) -> StoredEvent:
    return StoredEvent(i, t, "state-changed", "n1", None, message, {"from": "healthy", "to": "unhealthy"})


def into_unhealthy(t: float) -> NodeEvent:
    return NodeEvent(t, "n1", "state-changed", "healthy -> unhealthy: gpu_ecc: 1", {"to": "unhealthy"})


SETTINGS = ProbeSettings(flaky_faults=3, flaky_window="24h")


def test_flaky_alert_when_a_fault_reaches_the_threshold_within_the_window() -> None:
    now = 100 * HOUR
    past = [stored(1, now - 30 * HOUR, "too old"), stored(2, now - 5 * HOUR, "first"), stored(3, now - HOUR, "second")]
    alert = flaky_alert("n1", past, [into_unhealthy(now)], now, SETTINGS)
    assert alert is not None
    assert (alert.kind, alert.severity, alert.node, alert.job, alert.time) == ("node_flaky", "warning", "n1", None, now)
    assert alert.message.startswith("n1 is flaky: 3 faults within 1d (the last: ")
    assert "first" in alert.message and "second" in alert.message and "too old" not in alert.message
    assert alert.message.endswith("healthy -> unhealthy: gpu_ecc: 1); it is not resumed automatically: look at it "
                                  "before `ftconsole resume n1`")  # fmt: skip


@pytest.mark.parametrize(
    ("past", "events"),
    [
        ([stored(1, 99 * HOUR, "one")], [into_unhealthy(100 * HOUR)]),  # 2 of 3
        ([stored(1, 10 * HOUR, "old"), stored(2, 11 * HOUR, "old")], [into_unhealthy(100 * HOUR)]),
        ([stored(i, 99 * HOUR, "x") for i in range(5)], []),  # flaky already, but this change is no new fault
        (
            [stored(i, 99 * HOUR, "x") for i in range(5)],
            [NodeEvent(100 * HOUR, "n1", "resumed", "resumed by alice")],
        ),
    ],
)
def test_no_flaky_alert(past: list[StoredEvent], events: list[NodeEvent]) -> None:
    assert flaky_alert("n1", past, events, 100 * HOUR, SETTINGS) is None


def test_an_isolation_is_a_fault_that_can_make_a_node_flaky() -> None:
    now = 10 * HOUR
    _, events = set_admin(NodeHealth("n1", health=H), NodeState.ISOLATED, "job 2: ECC", "scheduler", now)
    alert = flaky_alert("n1", [stored(1, now - 2, "a"), stored(2, now - 1, "b")], events, now, SETTINGS)
    assert alert is not None and "isolated by scheduler: job 2: ECC" in alert.message


def test_the_alert_names_only_the_last_three_faults_each_cut_short() -> None:
    now = 10 * HOUR
    past = [stored(i, now - 100 + i, f"fault-{i} " + "x" * 300) for i in range(5)]
    alert = flaky_alert("n1", past, [into_unhealthy(now)], now, SETTINGS)
    assert alert is not None and alert.message.startswith("n1 is flaky: 6 faults within 1d")
    assert [f"fault-{i} " in alert.message for i in range(5)] == [False, False, False, True, True]
    assert "…" in alert.message and len(alert.message) < 700


# -- node JSON, the store, the config ---------------------------------------------------------------------------


def test_node_json_says_flaky_and_the_faults_in_the_window() -> None:
    view = NodeView(
        node=Node(name="n1", host="n1", port=None, user=None, pool="default"),
        health=NodeHealth("n1", health=H, reasons=()),
        probe=None,
        now=5.0,
        faults=7,
        faults_in_window=3,
        flaky=True,
        faults_window=24 * HOUR,
    )
    out = view.to_json()
    assert (out["faults"], out["faults_in_window"], out["flaky"], out["faults_window_s"]) == (7, 3, True, 86400.0)
    assert out["isolated_passes"] == 0


async def test_store_keeps_the_streak_and_the_hold_and_lists_recent_faults(store_at: StoreAt) -> None:
    async with await Store.open(store_at()) as store:
        h = NodeHealth("n1", health=H, reasons=(), admin=IS, admin_reason="x", isolated_passes=2, needs_operator=True)
        events = [
            NodeEvent(1.0, "n1", "state-changed", "old", {"to": "unreachable"}),
            NodeEvent(10.0, "n1", "state-changed", "h -> u", {"to": "unhealthy"}),
            NodeEvent(11.0, "n1", "state-changed", "u -> h", {"to": "healthy"}),
            NodeEvent(12.0, "n1", "isolated", "isolated by scheduler: x", {"reason": "x"}),
            NodeEvent(13.0, "n1", "rebooted", "node rebooted", {}),
        ]
        await store.save_nodes([(h, events), (NodeHealth("n2"), [])])
        assert await store.node_health("n1") == h
        assert (await store.node_health("n2")) == NodeHealth("n2")
        recent = await store.fault_events(since=5.0)
        assert list(recent) == ["n1"] and [e.message for e in recent["n1"]] == ["h -> u", "isolated by scheduler: x"]
        assert await store.node_faults() == {"n1": 3, "n2": 0}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({}, (None, 3, 86400.0)),
        ({"isolation_recover_after": 3, "flaky_faults": 5, "flaky_window": "6h"}, (3, 5, 21600.0)),
        ({"isolation_recover_after": None}, (None, 3, 86400.0)),
    ],
)
def test_config_keys(keys: dict[str, object], expected: tuple[object, ...]) -> None:
    p = ProbeSettings.model_validate(keys)
    assert (p.isolation_recover_after, p.flaky_faults, p.flaky_window) == expected


@pytest.mark.parametrize(
    "keys", [{"isolation_recover_after": 0}, {"flaky_faults": 0}, {"flaky_window": "0s"}, {"flaky_window": "soon"}]
)
def test_config_keys_refused(keys: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ProbeSettings.model_validate(keys)


# -- the console ------------------------------------------------------------------------------------------------


def test_the_node_table_marks_a_flaky_node_next_to_its_state() -> None:
    node = {"name": "n1", "state": "unreachable", "flaky": True, "faults": 4}
    cells = dict(zip([c.key for c in R.NODE_COLUMNS], R.node_cells(node, 0.0), strict=True))
    state = cells["state"]
    assert isinstance(state, Text) and state.plain == f"unreachable {R.FLAKY_MARK}"
    width = next(c.width for c in R.NODE_COLUMNS if c.key == "state")
    assert width is not None and len(state.plain) <= width  # the mark is never cut off
    calm = R.node_cells({"name": "n2", "state": "isolated", "flaky": False}, 0.0)[2]
    assert isinstance(calm, Text) and calm.plain == "isolated"
