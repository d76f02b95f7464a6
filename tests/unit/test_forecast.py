"""Expected starts (decide/forecast.py), from tables: running allocations and a queue in, each queued job's
expected start, end and nodes out. The passes are placement's own, so these check the walk forward in time."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftconsole.scheduler.decide.forecast import forecast
from ftconsole.scheduler.decide.placement import Allocation, ClusterState, Priority, plan
from tests.unit.test_placement import job, node

NOW = 1000.0


def run(job_id: str, name: str, gpus: int, ends: float | None, first: int = 0) -> Allocation:
    return Allocation(job_id, name, tuple(range(first, first + gpus)), ends)


def starts(state: ClusterState, queue: list, **kw) -> dict[str, tuple[float | None, float | None, tuple[str, ...]]]:
    found = forecast(state, queue, NOW, resolution=0.0, **kw)
    return {e.job_id: (e.start, e.end, e.nodes) for e in found.jobs}


def test_a_job_that_fits_now_starts_now_and_ends_after_its_runtime():
    state = ClusterState((node("n1"),))
    assert starts(state, [job("a", 8, runtime=600)]) == {"a": (NOW, NOW + 600, ("n1",))}


def test_a_queued_job_starts_when_the_running_job_on_its_gpus_ends():
    state = ClusterState((node("n1"),), (run("r", "n1", 8, NOW + 300),))
    assert starts(state, [job("a", 8, runtime=600)]) == {"a": (NOW + 300, NOW + 900, ("n1",))}


def test_jobs_queue_behind_each_other_one_end_after_another():
    state = ClusterState((node("n1"),), (run("r", "n1", 8, NOW + 100),))
    queue = [job("a", 8, runtime=200, t=1), job("b", 8, runtime=50, t=2), job("c", 4, runtime=10, t=3)]
    found = starts(state, queue)
    assert found["a"][0] == NOW + 100
    assert found["b"][0] == NOW + 300
    assert found["c"][0] == NOW + 350


def test_backfill_is_foreseen_as_the_scheduler_does_it():
    """Two nodes; the head needs both and waits for n2's job (ends at +500). A short job fits n1 before that
    and starts now; a long one would delay the head and waits until after it."""
    state = ClusterState((node("n1"), node("n2")), (run("r", "n2", 8, NOW + 500),))
    queue = [job("head", 8, 2, runtime=100, t=1), job("short", 8, runtime=400, t=2), job("long", 8, runtime=900, t=3)]
    found = starts(state, queue)
    assert found["head"] == (NOW + 500, NOW + 600, ("n1", "n2"))
    assert found["short"][0] == NOW
    assert found["long"][0] == NOW + 600


def test_a_job_behind_one_without_a_time_limit_has_no_expected_start():
    state = ClusterState((node("n1"),), (run("r", "n1", 8, None),))
    queue = [job("a", 8, runtime=60), job("small", 8, runtime=60, t=1)]
    found = forecast(state, queue, NOW)
    assert [(e.job_id, e.start, e.end, e.nodes) for e in found.jobs] == [
        ("a", None, None, ()),
        ("small", None, None, ()),
    ]
    assert found.jobs[0].reason == "needs 1 node with 8 free GPUs; 0 available"  # why, in the last pass's words
    assert found.complete  # nothing left that ends: more passes would not tell more


def test_a_job_without_a_time_limit_starts_but_never_ends_and_holds_those_after_it():
    state = ClusterState((node("n1"),))
    found = starts(state, [job("forever", 8, t=1), job("next", 8, runtime=5, t=2)])
    assert found == {"forever": (NOW, None, ("n1",)), "next": (None, None, ())}


def test_a_job_that_can_never_fit_has_no_start_and_holds_no_one():
    state = ClusterState((node("n1", 4),))
    found = starts(state, [job("huge", 8, runtime=60, t=1), job("small", 4, runtime=60, t=2)])
    assert found == {"huge": (None, None, ()), "small": (NOW, NOW + 60, ("n1",))}


def test_the_urgent_cap_holds_a_job_in_the_forecast_as_in_a_pass():
    state = ClusterState((node("n1"), node("n2")))
    queue = [job("u1", 8, prio=Priority.URGENT, runtime=60, t=1), job("u2", 8, prio=Priority.URGENT, runtime=60, t=2)]
    found = starts(state, queue, urgent_cap=1)
    assert found["u1"][0] == NOW
    assert found["u2"][0] == NOW + 60  # u1's slot of the cap is free once it ends


def test_the_horizon_and_the_passes_bound_it_and_say_so():
    state = ClusterState((node("n1"),), (run("r", "n1", 8, NOW + 10 * 86400),))
    found = forecast(state, [job("a", 8, runtime=60)], NOW, horizon=86400.0)
    assert [(e.job_id, e.start) for e in found.jobs] == [("a", None)] and not found.complete
    chain = [job(f"j{i}", 8, runtime=10, t=i) for i in range(10)]
    few = forecast(ClusterState((node("n1"),)), chain, NOW, passes=3, resolution=0.0)
    assert [e.start for e in few.jobs] == [NOW, NOW + 10, NOW + 20] + [None] * 7 and not few.complete


def test_ends_within_the_resolution_are_one_pass_at_the_later_end():
    state = ClusterState((node("n1", 2),), (run("r1", "n1", 1, NOW + 10), run("r2", "n1", 1, NOW + 40, first=1)))
    found = forecast(state, [job("a", 2, runtime=60)], NOW, resolution=60.0)
    assert found.jobs[0].start == NOW + 40


def test_a_job_past_its_time_limit_ends_after_the_first_pass():
    """Its GPUs count in the first pass (the scheduler's own: the job is still being stopped); the next pass,
    at once, has them."""
    state = ClusterState((node("n1"),), (run("late", "n1", 8, NOW - 30),))
    assert plan(state, [job("a", 8, runtime=60)], NOW)[0].reason.startswith("needs")
    assert starts(state, [job("a", 8, runtime=60)]) == {"a": (NOW, NOW + 60, ("n1",))}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(1, 2), st.integers(1, 50)), min_size=1, max_size=8),
    st.lists(st.integers(1, 100), min_size=0, max_size=3),
)
def test_the_first_pass_is_the_scheduler_s_and_no_gpu_is_promised_twice(shapes, ends):
    """What starts `now` is what a pass would place now; at no time do the expected jobs and the running ones
    hold more GPUs of a node than it has."""
    nodes = (node("n1"), node("n2"))
    running = tuple(run(f"r{i}", "n1" if i % 2 else "n2", 4, NOW + e, first=0) for i, e in enumerate(ends[:2]))
    state = ClusterState(nodes, running)
    queue = [job(f"j{i}", g, n, runtime=r * 10, t=i) for i, (g, n, r) in enumerate(shapes)]
    found = forecast(state, queue, NOW, resolution=0.0)
    now_placed = {d.job_id for d in plan(state, queue, NOW) if not hasattr(d, "reason")}
    assert {e.job_id for e in found.jobs if e.start == NOW} == now_placed
    by_id = {j.id: j for j in queue}
    moments = {e.start for e in found.jobs if e.start is not None}
    for moment in moments:
        for name in ("n1", "n2"):
            used = sum(len(a.gpus) for a in running if a.node == name and (a.ends_at or 1e18) > moment)
            for e in found.jobs:
                if e.start is not None and e.start <= moment < (e.end or 1e18) and name in e.nodes:
                    used += max(c.gpus_per_node for c in by_id[e.job_id].candidates)
            assert used <= 8, (moment, name, found)


def test_a_job_waiting_for_its_begin_time_joins_the_forecast_then():
    free = ClusterState((node("n1"),))
    found = forecast(free, [job("later", 8, runtime=60)], NOW, arrivals={"later": NOW + 100}, resolution=0.0)
    assert [(e.job_id, e.start) for e in found.jobs] == [("later", NOW + 100)]
    busy = ClusterState((node("n1"),), (run("r", "n1", 8, NOW + 300),))
    queue = [job("later", 8, runtime=60, t=1), job("now", 4, runtime=600, t=2)]
    found = forecast(busy, queue, NOW, arrivals={"later": NOW + 100}, resolution=0.0)
    starts_at = {e.job_id: e.start for e in found.jobs}
    assert [e.job_id for e in found.jobs] == ["now", "later"]  # those queued now first, then those to come
    assert starts_at == {"later": NOW + 300, "now": NOW + 360}  # once both wait, in queue order (later's is first)
    assert found.complete
