"""The map's cells kept between updates (`mapcells.MapCells`) are always what working every cell out again
gives, over random changes: nodes probed, jobs starting and ending, jobs becoming known as preemptible a read
after their node showed them, reservations, nodes coming and going, groups changing."""

from __future__ import annotations

import random
from typing import Any

from ftconsole.tui import maps as M
from ftconsole.tui.mapcells import MapCells


def view(name: str, rng: random.Random, jobs: list[int]) -> dict[str, Any]:
    state = rng.choice(("healthy",) * 8 + ("degraded", "unhealthy", "drained", "isolated", "unreachable"))
    held = [{"gpu": g, "job": rng.choice(jobs)} for g in range(8) if rng.random() < 0.5]
    gpus = [{"index": g, "name": "H100", "utilization": float(rng.randint(0, 100))} for g in range(8)]
    return {"name": name, "state": state, "pool": "p", "reasons": ["gpu3 temperature 88C > 85C"] * (rng.random() < 0.3),
            "held": held, "held_for_debug": [{"gpu": 7, "job": 1}] * (rng.random() < 0.05), "gpus": gpus}  # fmt: skip


def test_kept_cells_equal_cells_worked_out_again() -> None:
    rng = random.Random(7)
    jobs = list(range(1, 40))
    names = [f"n{i:03d}" for i in range(60)]
    views = {n: view(n, rng, jobs) for n in names}
    preemptible: set[int] = set()
    reserved: set[str] = set()
    cells = MapCells()
    worked = []
    for step in range(400):
        for _ in range(rng.randint(0, 5)):  # probes, jobs starting and ending: a new object for the node
            name = rng.choice(list(views))
            views[name] = view(name, rng, jobs)
        if rng.random() < 0.3:
            preemptible ^= {rng.choice(jobs)}
        if rng.random() < 0.1:
            reserved ^= {rng.choice(list(views))}
        if rng.random() < 0.05:  # a node goes, or comes back
            name = rng.choice(names)
            if name in views and len(views) > 1:
                del views[name]
            else:
                views[name] = view(name, rng, jobs)
        size = 8 if step % 50 < 40 else 4  # now and then the groups change (a node's GPUs are counted anew)
        ordered = sorted(views)
        groups = [M.Group("p", "H100", size, "", tuple(ordered[: len(ordered) // 2])),
                  M.Group("p", "H100", 8, "s2", tuple(ordered[len(ordered) // 2 :]))]  # fmt: skip
        got = cells.update(views, groups, set(preemptible), set(reserved))
        worked.append(cells.worked)
        want = {n: M.gpu_cells(views[n], g.gpus, preemptible, reserved) for g in groups for n in g.nodes}
        assert got == want, step
        for group in groups:
            assert cells.tally(group) == M.counts(c for n in group.nodes for c in want[n]), step
    assert sum(worked) < 0.3 * len(worked) * len(names)  # most nodes' cells were kept, update after update


def test_a_job_known_as_preemptible_after_its_node_changes_the_nodes_it_holds() -> None:
    node = {"name": "a", "state": "healthy", "held": [{"gpu": 0, "job": 5}], "gpus": [{"index": 0, "utilization": 90}]}
    groups = [M.Group("p", "H100", 1, "", ("a",))]
    cells = MapCells()
    assert cells.update({"a": node}, groups, set(), set())["a"][0].kind == "busy"
    assert cells.update({"a": node}, groups, {5}, set())["a"][0].kind == "preempt" and cells.worked == 1
    assert cells.update({"a": node}, groups, {5}, set())["a"][0].kind == "preempt" and cells.worked == 0
