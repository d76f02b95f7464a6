"""Queue order and placement, from tables: a small cluster and a queue in, the decisions out.

Outcomes are written compactly: a placed job as `node[gpus]` per node (`n1[0-3] n2[0-3]`, `#1` when its second
candidate spec was used); a waiting job as its cause, with `@T` when its earliest start is known
(`capacity@100`, `blocked`, `urgent-cap`, `too-few-nodes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftconsole.scheduler.decide.placement import (
    Allocation,
    Candidate,
    ClusterState,
    Decision,
    JobRequest,
    NodeSlot,
    Place,
    Priority,
    Wait,
    WaitCause,
    plan,
    predict,
    queue_order,
)

N, U, V = Priority.NORMAL, Priority.URGENT, Priority.VERY_URGENT


def node(
    name: str,
    gpus: int = 8,
    *,
    pool: str = "default",
    model: str = "H100",
    driver: str = "550",
    ok: bool = True,
    degraded: bool = False,
    labels: Sequence[str] = (),
) -> NodeSlot:
    return NodeSlot(name, pool, model, driver, gpus, ok, frozenset(labels), degraded)


def job(
    id: str,
    g: int = 8,
    n: int = 1,
    *,
    prio: Priority = N,
    t: float = 0.0,
    requeued: bool = False,
    project: str = "p",
    model: str | None = None,
    specs: Sequence[tuple[int, str | None]] | None = None,
    pool: str | None = None,
    names: Sequence[str] | None = None,
    driver: str | None = None,
    labels: Sequence[str] = (),
    runtime: float | None = None,
    least: int | None = None,
) -> JobRequest:
    shapes = specs if specs is not None else [(g, model)]
    return JobRequest(
        id=id,
        priority=prio,
        submitted_at=t,
        requeued=requeued,
        project=project,
        nodes=n,
        candidates=tuple(Candidate(f"spec{i}", gpus, m) for i, (gpus, m) in enumerate(shapes)),
        pool=pool,
        node_names=None if names is None else frozenset(names),
        driver_version=driver,
        labels=frozenset(labels),
        max_runtime=runtime,
        min_nodes=least,
    )


def alloc(
    job_id: str, node: str, gpus: Sequence[int], ends: float | None = None, project: str = "p", prio: Priority = N
) -> Allocation:
    return Allocation(job_id, node, tuple(gpus), ends, project, prio)


def span(gpus: Sequence[int]) -> str:
    """(0, 1, 2, 3) -> '0-3'; (0, 2) -> '0,2'."""
    runs: list[list[int]] = []
    for i in gpus:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def outcome(decision: Decision) -> str:
    if isinstance(decision, Place):
        text = " ".join(f"{name}[{span(gpus)}]" for name, gpus in decision.nodes)
        return text + (f" #{decision.candidate_index}" if decision.candidate_index else "")
    when = "" if decision.earliest_start is None else f"@{decision.earliest_start:g}"
    return f"{decision.cause.value}{when}"


def outcomes(decisions: Sequence[Decision]) -> dict[str, str]:
    return {d.job_id: outcome(d) for d in decisions}


CASES = [
    # --- queue order
    pytest.param(
        [node("n1")], [], [job("a"), job("b", prio=U, t=1)], {"b": "n1[0-7]", "a": "capacity"}, {}, id="urgent-first",
    ),
    pytest.param(
        [node("n1")], [], [job("a", prio=U), job("b", prio=V, t=1)], {"b": "n1[0-7]", "a": "capacity"}, {},
        id="very-urgent-first",
    ),
    pytest.param(
        [node("n1")], [], [job("a", t=2), job("b", t=1)], {"b": "n1[0-7]", "a": "capacity"}, {}, id="fifo-within-level",
    ),
    pytest.param([node("n1")], [], [job("b"), job("a")], {"a": "n1[0-7]", "b": "capacity"}, {}, id="id-breaks-ties"),
    pytest.param(
        [node("n1")], [], [job("a", t=0), job("b", t=5, requeued=True)], {"b": "n1[0-7]", "a": "capacity"}, {},
        id="requeued-first",
    ),
    pytest.param(
        [node("n1")], [], [job("a", prio=U, t=5), job("b", requeued=True)], {"a": "n1[0-7]", "b": "capacity"}, {},
        id="requeued-after-higher-level",
    ),
    # --- gang placement and GPU indexes
    pytest.param(
        [node("n1"), node("n2")], [alloc("x", "n2", [0])], [job("a", 8, 2)], {"a": "capacity"}, {},
        id="gang-all-or-nothing",
    ),
    pytest.param(
        [node("n1"), node("n2"), node("n3")], [], [job("a", 4, 2)], {"a": "n1[0-3] n2[0-3]"}, {},
        id="gang-distinct-nodes",
    ),
    pytest.param([node("n1")], [alloc("x", "n1", [0, 1])], [job("a", 2)], {"a": "n1[2-3]"}, {}, id="lowest-free-first"),
    pytest.param([node("n1")], [alloc("x", "n1", [1, 3])], [job("a", 3)], {"a": "n1[0,2,4]"}, {}, id="holes-filled"),
    pytest.param(
        [node("n1")], [], [job("a", 2, t=0), job("b", 4, t=1), job("c", 2, t=2)],
        {"a": "n1[0-1]", "b": "n1[2-5]", "c": "n1[6-7]"}, {}, id="shared-node-distinct-devices",
    ),
    # --- several candidate specs
    pytest.param(
        [node("n1"), node("n2", model="A100")], [], [job("a", specs=[(8, "H100"), (4, "A100")])],
        {"a": "n1[0-7]"}, {}, id="first-spec-wins",
    ),
    pytest.param(
        [node("n1"), node("n2", model="A100")], [alloc("x", "n1", [0])], [job("a", specs=[(8, "H100"), (4, "A100")])],
        {"a": "n2[0-3] #1"}, {}, id="second-spec-when-first-cannot",
    ),
    # --- constraints
    pytest.param(
        [node("n1"), node("n2", model="A100")], [], [job("a", 2, model="A100")], {"a": "n2[0-1]"}, {}, id="gpu-model",
    ),
    pytest.param(
        [node("n1"), node("n2", driver="535")], [], [job("a", 2, driver="535")], {"a": "n2[0-1]"}, {},
        id="driver-version",
    ),
    pytest.param([node("n1"), node("n2", pool="x")], [], [job("a", 2, pool="x")], {"a": "n2[0-1]"}, {}, id="pool"),
    pytest.param(
        [node("n1"), node("n2"), node("n3")], [], [job("a", 2, 2, names=["n3", "n1"])], {"a": "n1[0-1] n3[0-1]"}, {},
        id="node-names",
    ),
    pytest.param(
        [node("n1"), node("n2", labels=["ib"])], [], [job("a", 2, labels=["ib"])], {"a": "n2[0-1]"}, {}, id="labels",
    ),
    pytest.param([node("n1", ok=False), node("n2")], [], [job("a", 2)], {"a": "n2[0-1]"}, {}, id="unhealthy-excluded"),
    pytest.param(
        [node("n1", ok=False, degraded=True)], [], [job("a", 2)], {"a": "too-few-nodes"}, {}, id="degraded-excluded",
    ),
    pytest.param(
        [node("n1", ok=False, degraded=True)], [], [job("a", 2)], {"a": "n1[0-1]"}, {"allow_degraded": {"default"}},
        id="degraded-allowed-in-pool",
    ),
    pytest.param(
        [node("n1", 4)], [], [job("a", 8), job("b", 4, t=1)], {"a": "too-few-nodes", "b": "n1[0-3]"}, {},
        id="too-big-blocks-no-one",
    ),
    pytest.param(
        [node("n1"), node("n2", ok=False)], [], [job("a", 1, 2), job("b", 1, t=1)],
        {"a": "too-few-nodes", "b": "n1[0]"}, {}, id="gang-short-of-usable-nodes",
    ),
    # --- fragmentation: best fit
    pytest.param(
        [node("n1"), node("n2")], [alloc("x", "n2", range(6))], [job("a", 2, t=0), job("b", 8, t=1)],
        {"a": "n2[6-7]", "b": "n1[0-7]"}, {}, id="best-fit-keeps-whole-node",
    ),
    pytest.param(
        [node("n1"), node("n2"), node("n3")], [alloc("x", "n1", range(4)), alloc("y", "n3", range(5))], [job("a", 2)],
        {"a": "n3[5-6]"}, {}, id="best-fit-smallest-free-count",
    ),
    pytest.param([node("n2"), node("n1")], [], [job("a", 2)], {"a": "n1[0-1]"}, {}, id="best-fit-tie-by-name"),
    # --- backfill
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(6), ends=100)], [job("h", 8, t=0), job("s", 2, t=1, runtime=50)],
        {"h": "capacity@100", "s": "n1[6-7]"}, {}, id="backfill-ends-before-reservation",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(6), ends=100)], [job("h", 8, t=0), job("s", 2, t=1, runtime=100)],
        {"h": "capacity@100", "s": "n1[6-7]"}, {}, id="backfill-ends-at-reservation",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(6), ends=100)], [job("h", 8, t=0), job("s", 2, t=1, runtime=150)],
        {"h": "capacity@100", "s": "blocked"}, {}, id="backfill-refused-would-delay-head",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(6), ends=100)], [job("h", 8, t=0), job("s", 2, t=1)],
        {"h": "capacity@100", "s": "blocked"}, {}, id="no-backfill-without-max-runtime",
    ),
    pytest.param(
        [node("n1"), node("n2")], [alloc("x", "n1", range(8), ends=100), alloc("y", "n2", range(4), ends=500)],
        [job("h", 8, t=0), job("s", 4, t=1)],
        {"h": "capacity@100", "s": "n2[4-7]"}, {}, id="backfill-outside-reservation",
    ),
    pytest.param(
        [node("n1"), node("n2")], [alloc("x", "n1", range(8), ends=100), alloc("y", "n2", range(4), ends=300)],
        [job("h", 8, 2, t=0), job("s", 4, t=1, runtime=200)],
        {"h": "capacity@300", "s": "n2[4-7]"}, {}, id="head-waits-for-last-needed-release",
    ),
    pytest.param(
        [node("n1")], [], [job("a", 6, t=0, runtime=40), job("h", 8, t=1), job("s", 2, t=2, runtime=50)],
        {"a": "n1[0-5]", "h": "capacity@40", "s": "blocked"}, {}, id="reservation-counts-jobs-placed-this-pass",
    ),
    pytest.param(
        [node("n1"), node("n2"), node("n3", pool="b")],
        [alloc("x", "n1", range(8)), alloc("y", "n2", range(4))],
        [job("h", 8, t=0, pool="default"), job("s", 2, t=1, runtime=1, pool="default"), job("o", 2, t=2, runtime=1)],
        {"h": "capacity", "s": "blocked", "o": "n3[0-1]"}, {}, id="unknown-start-only-outside-head-nodes",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(6), ends=100)], [job("h", 8, t=0), job("s", 4, t=1, runtime=10)],
        {"h": "capacity@100", "s": "capacity"}, {}, id="after-head-too-big-for-free-gpus",
    ),
    # --- urgent cap
    pytest.param(
        [node("n1")], [alloc("x", "n1", [0], prio=U)], [job("a", 1, prio=U), job("b", 1, t=1)],
        {"a": "urgent-cap", "b": "n1[1]"}, {"urgent_cap": 1}, id="urgent-cap-counts-running",
    ),
    pytest.param(
        [node("n1")], [], [job("a", 1, prio=U, t=0), job("b", 1, prio=U, t=1), job("c", 1, prio=U, t=2)],
        {"a": "n1[0]", "b": "n1[1]", "c": "urgent-cap"}, {"urgent_cap": 2}, id="urgent-cap-counts-queued",
    ),
    pytest.param(
        [node("n1")], [], [job("a", 1, prio=U, project="q"), job("b", 1, prio=U, t=1, project="r")],
        {"a": "urgent-cap", "b": "n1[0]"}, {"urgent_cap": {"q": 0}}, id="urgent-cap-per-project",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", [0], prio=U)], [job("a", 1, prio=V)],
        {"a": "n1[1]"}, {"urgent_cap": 1}, id="very-urgent-not-capped",
    ),
    # --- elastic (min_nodes): as many nodes as it can have now, down to min_nodes
    pytest.param(
        [node("n1"), node("n2"), node("n3")], [alloc("x", "n3", [0])], [job("a", 8, 3, least=1)],
        {"a": "n1[0-7] n2[0-7]"}, {}, id="elastic-starts-small",
    ),
    pytest.param(
        [node("n1"), node("n2")], [alloc("x", "n1", [0]), alloc("y", "n2", [0])], [job("a", 8, 2, least=1)],
        {"a": "capacity"}, {}, id="elastic-waits-below-min",
    ),
    pytest.param(
        [node("n1"), node("n2")], [], [job("a", 8, 3, least=2)], {"a": "n1[0-7] n2[0-7]"}, {},
        id="elastic-fewer-usable-nodes-than-asked",
    ),
    pytest.param(
        [node("n1"), node("n2")], [], [job("a", 8, 3, least=3)], {"a": "too-few-nodes"}, {},
        id="elastic-min-above-usable-nodes",
    ),
    pytest.param(
        [node("n1"), node("n2"), node("n3")], [alloc("x", "n1", [0], ends=100)],
        [job("h", 8, 3), job("a", 8, 2, least=1, t=1)],
        {"h": "capacity@100", "a": "blocked"}, {}, id="elastic-never-takes-the-heads-reservation",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("nodes", "allocations", "queue", "expected", "options"), CASES)
def test_plan(
    nodes: list[NodeSlot],
    allocations: list[Allocation],
    queue: list[JobRequest],
    expected: dict[str, str],
    options: dict[str, Any],
) -> None:
    decisions = plan(ClusterState(tuple(nodes), tuple(allocations)), queue, 0.0, **options)
    assert outcomes(decisions) == expected
    assert [d.job_id for d in decisions] == [j.id for j in queue_order(queue)]


REASONS = [
    pytest.param(
        [node("n1", pool="x"), node("n2", pool="x")], [alloc("x", "n2", [0])], job("a", 8, 2, model="H100", pool="x"),
        "needs 2 nodes with 8 free H100 GPUs in pool x; 1 available", {}, id="capacity",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", [0])], job("a", specs=[(8, None), (4, "A100")]),
        "needs 1 node with 8 free GPUs; 0 available, or 1 node with 4 free A100 GPUs; 0 available", {},
        id="several-specs",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", [0, 1], prio=U), alloc("y", "n1", [3], prio=U), alloc("z", "n1", [4], prio=U)],
        job("a", 1, prio=U), "urgent cap of project p reached (3/3)", {"urgent_cap": 3}, id="urgent-cap",
    ),
    pytest.param(
        [node("n1")], [], job("a", 1, 3, driver="535"),
        "needs 3 nodes with 1 free GPU with driver 535; only 0 usable nodes can hold it", {}, id="too-few-nodes",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", [0])], job("a", 8, 3, least=1),
        "needs 3 nodes (at least 1) with 8 free GPUs; 0 available", {}, id="elastic",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("nodes", "allocations", "queued", "reason", "options"), REASONS)
def test_wait_reasons(
    nodes: list[NodeSlot], allocations: list[Allocation], queued: JobRequest, reason: str, options: dict[str, Any]
) -> None:
    [decision] = plan(ClusterState(tuple(nodes), tuple(allocations)), [queued], 0.0, **options)
    assert isinstance(decision, Wait)
    assert decision.reason == reason


def test_blocked_reason_names_the_head() -> None:
    state = ClusterState((node("n1"),), (alloc("x", "n1", range(6), ends=100),))
    decisions = plan(state, [job("h", 8), job("s", 2, t=1)], 0.0)
    assert decisions[1] == Wait("s", "blocked behind job h (head of queue)", 2, None, WaitCause.BLOCKED)


def test_positions_count_waiting_jobs_only() -> None:
    state = ClusterState((node("n1"),))
    decisions = plan(state, [job("a", 4, t=0), job("b", 8, 2, t=1), job("c", 4, t=2), job("d", 8, t=3)], 0.0)
    assert [(d.job_id, d.position) for d in decisions if isinstance(d, Wait)] == [("b", 1), ("d", 2)]
    assert outcomes(decisions) == {"a": "n1[0-3]", "b": "too-few-nodes", "c": "n1[4-7]", "d": "capacity"}


def test_time_is_a_parameter() -> None:
    state = ClusterState((node("n1"),), (alloc("x", "n1", range(6), ends=100),))
    queue = [job("h", 8), job("s", 2, t=1, runtime=50)]
    assert outcomes(plan(state, queue, 40.0)) == {"h": "capacity@100", "s": "n1[6-7]"}
    assert outcomes(plan(state, queue, 60.0)) == {"h": "capacity@100", "s": "blocked"}
    assert outcomes(plan(state, queue, 150.0)) == {"h": "capacity@150", "s": "blocked"}  # overdue: ends any time


# --- predict

PREDICTIONS = [
    pytest.param([node("n1")], [], [], job("new", 4), "n1[0-3]", (), id="starts-now"),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(8), ends=100)], [job("a", 8, t=0), job("b", 8, t=1)], job("new", 8, t=5),
        "capacity", ("a", "b"), id="queued-behind-two",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(8), ends=100)], [job("a", 8, t=0)], job("new", 8, prio=U, t=5),
        "capacity@100", (), id="urgent-goes-to-the-front",
    ),
    pytest.param(
        [node("n1")], [alloc("x", "n1", range(4), ends=100)], [job("a", 8, t=0)], job("new", 2, t=5, runtime=30),
        "n1[4-5]", (), id="backfills",
    ),
    pytest.param(
        [node("n1")], [], [job("new", 1, t=0)], job("new", 8, t=9), "n1[0-7]", (), id="replaces-same-id",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("nodes", "allocations", "queue", "new", "expected", "ahead"), PREDICTIONS)
def test_predict(
    nodes: list[NodeSlot],
    allocations: list[Allocation],
    queue: list[JobRequest],
    new: JobRequest,
    expected: str,
    ahead: tuple[str, ...],
) -> None:
    decision = predict(ClusterState(tuple(nodes), tuple(allocations)), queue, new, 0.0)
    assert decision.job_id == "new"
    assert outcome(decision) == expected
    if isinstance(decision, Wait):
        assert decision.ahead == ahead
        assert decision.position == len(ahead) + 1


def test_free_gpus() -> None:
    state = ClusterState((node("n1", 4), node("n2", 2)), (alloc("x", "n1", [1, 2]),))
    assert state.free_gpus() == {"n1": frozenset({0, 3}), "n2": frozenset({0, 1})}


def test_priority_labels() -> None:
    assert [p.label for p in Priority] == ["normal", "urgent", "very-urgent"]
    assert Priority.parse("very-urgent") is V
    with pytest.raises(ValueError, match="unknown priority"):
        Priority.parse("asap")


@pytest.mark.parametrize(
    "kwargs",
    [{"nodes": 0}, {"candidates": ()}, {"max_runtime": -1.0}, {"nodes": 2, "min_nodes": 3}, {"min_nodes": 0}],
    ids=["no-nodes", "no-candidates", "negative-runtime", "min-above-nodes", "min-zero"],
)
def test_job_request_validation(kwargs: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"id": "a", "submitted_at": 0.0, "candidates": (Candidate(None, 1),), **kwargs}
    with pytest.raises(ValueError, match="job a"):
        JobRequest(**fields)


# --- properties over random small clusters and queues

POOLS, MODELS, DRIVERS = ("a", "b"), ("H100", "A100"), ("1", "2")


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    count = draw(st.integers(1, 5))
    nodes, allocations = [], []
    for i in range(count):
        total = draw(st.sampled_from([1, 2, 4, 8]))
        nodes.append(
            NodeSlot(
                f"n{i}",
                draw(st.sampled_from(POOLS)),
                draw(st.sampled_from(MODELS)),
                draw(st.sampled_from(DRIVERS)),
                total,
                draw(st.booleans() | st.just(True)),
                frozenset(),
                draw(st.booleans()),
            )
        )
        used = draw(st.lists(st.integers(0, total - 1), unique=True, max_size=total))
        split = draw(st.integers(0, len(used)))
        for k, gpus in enumerate((used[:split], used[split:])):
            if gpus:
                ends = draw(st.none() | st.integers(1, 100).map(float))
                allocations.append(
                    Allocation(f"r{i}.{k}", f"n{i}", tuple(gpus), ends, "p", draw(st.sampled_from(Priority)))
                )
    return ClusterState(tuple(nodes), tuple(allocations))


@st.composite
def queues(draw: st.DrawFn) -> list[JobRequest]:
    jobs = []
    for i in range(draw(st.integers(0, 8))):
        shapes = draw(
            st.lists(
                st.tuples(st.sampled_from([1, 2, 4, 8]), st.none() | st.sampled_from(MODELS)), min_size=1, max_size=2
            )
        )
        names = draw(st.none() | st.frozensets(st.sampled_from([f"n{k}" for k in range(5)]), max_size=3))
        jobs.append(
            JobRequest(
                id=f"j{i}",
                priority=draw(st.sampled_from(Priority)),
                submitted_at=float(draw(st.integers(0, 5))),
                requeued=draw(st.booleans()),
                project=draw(st.sampled_from(["p", "q"])),
                nodes=draw(st.integers(1, 3)),
                candidates=tuple(Candidate(None, g, m) for g, m in shapes),
                pool=draw(st.none() | st.sampled_from(POOLS)),
                node_names=names,
                driver_version=draw(st.none() | st.sampled_from(DRIVERS)),
                max_runtime=draw(st.none() | st.integers(0, 120).map(float)),
            )
        )
    return jobs


def usable(n: NodeSlot, allow_degraded: frozenset[str]) -> bool:
    return n.state_ok or (n.degraded and n.pool in allow_degraded)


def check_place(
    place: Place, queued: JobRequest, nodes: Mapping[str, NodeSlot], allow_degraded: frozenset[str]
) -> None:
    cand = queued.candidates[place.candidate_index]
    names = [name for name, _ in place.nodes]
    assert len(names) == queued.nodes == len(set(names))
    for name, gpus in place.nodes:
        n = nodes[name]
        assert usable(n, allow_degraded)
        assert len(gpus) == cand.gpus_per_node == len(set(gpus))
        assert all(0 <= i < n.gpus_total for i in gpus)
        assert cand.gpu_model in (None, n.gpu_model)
        assert queued.pool in (None, n.pool)
        assert queued.driver_version in (None, n.driver_version)
        assert queued.node_names is None or name in queued.node_names


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), queues(), st.sampled_from([None, 1, {"p": 0}]), st.sampled_from([frozenset(), frozenset(POOLS)]))
def test_placement_properties(
    state: ClusterState, queue: list[JobRequest], cap: int | dict[str, int] | None, allow_degraded: frozenset[str]
) -> None:
    decisions = plan(state, queue, 0.0, urgent_cap=cap, allow_degraded=allow_degraded)
    by_id = {j.id: j for j in queue}
    nodes = {n.name: n for n in state.nodes}
    assert [d.job_id for d in decisions] == [j.id for j in queue_order(queue)]

    taken = {(a.node, i) for a in state.allocations for i in a.gpus}
    for d in decisions:
        if isinstance(d, Place):
            check_place(d, by_id[d.job_id], nodes, allow_degraded)
            gpus = {(name, i) for name, ids in d.nodes for i in ids}
            assert not gpus & taken, "a GPU was given twice"
            taken |= gpus
    waits = [d for d in decisions if isinstance(d, Wait)]
    assert [w.position for w in waits] == list(range(1, len(waits) + 1))
    check_urgent_cap(state, queue, decisions, cap)


def check_urgent_cap(
    state: ClusterState, queue: list[JobRequest], decisions: Sequence[Decision], cap: int | dict[str, int] | None
) -> None:
    """No project ends up with more urgent jobs started than its cap leaves after its running ones."""
    by_id = {j.id: j for j in queue}
    for project in ("p", "q"):
        limit = cap if not isinstance(cap, dict) else cap.get(project)
        if limit is None:
            continue
        running = {a.job_id for a in state.allocations if a.project == project and a.priority is U}
        started = [
            d
            for d in decisions
            if isinstance(d, Place) and by_id[d.job_id].project == project and by_id[d.job_id].priority is U
        ]
        assert len(started) <= max(0, limit - len(running))


def head_id(decisions: Sequence[Decision]) -> str | None:
    return next((d.job_id for d in decisions if isinstance(d, Wait) and d.cause is WaitCause.CAPACITY), None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), queues())
def test_backfill_never_delays_the_head(state: ClusterState, queue: list[JobRequest]) -> None:
    """With every placement of the pass running, the head's earliest start is the one the pass promised."""
    decisions = plan(state, queue, 0.0)
    head = head_id(decisions)
    if head is None:
        return
    promised = next(d for d in decisions if d.job_id == head)
    assert isinstance(promised, Wait)
    by_id = {j.id: j for j in queue}
    started = tuple(
        Allocation(d.job_id, name, gpus, None if by_id[d.job_id].max_runtime is None else by_id[d.job_id].max_runtime)
        for d in decisions
        if isinstance(d, Place)
        for name, gpus in d.nodes
    )
    [again] = plan(ClusterState(state.nodes, state.allocations + started), [by_id[head]], 0.0)
    assert isinstance(again, Wait)
    assert again.earliest_start == promised.earliest_start
