"""The cluster map's cells and tallies, kept from one update to the next (`maps.py` says what a cell shows).

At 1,000 nodes of 8 GPUs, working every cell out again took most of the Map view's update, while a second
changes a few nodes: those probed, those a job started or ended on. The feed keeps an unchanged node's view as
the same object, so a node's cells are worked out again only when its view is another object, its group's GPU
count changed, it came into or left an active reservation, or a job it holds became known as preemptible (or
stopped being: the job's data can come a read after the node's). Each group's tally moves by the difference.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ftconsole.tui import maps as M

_kind = operator.attrgetter("kind")


def _holders_of(view: Mapping[str, Any]) -> tuple[Any, Any]:
    return view.get("held"), view.get("held_for_debug")


class MapCells:
    def __init__(self) -> None:
        self.cells: dict[str, tuple[M.Gpu, ...]] = {}
        self._tallies: dict[M.Group, Counter[str]] = {}  # each group's GPUs by kind (`flat` apart from `busy`)
        self.worked = 0  # nodes whose cells the last update worked out (for tests and the bench)
        self._from: dict[str, tuple[Mapping[str, Any], int, bool]] = {}  # name -> what its cells were worked from
        self._jobs: dict[str, tuple[int, ...]] = {}  # name -> the jobs holding its GPUs, as last worked out
        self._holders: dict[int, set[str]] = {}  # job -> the nodes it holds GPUs of
        self._preemptible: frozenset[int] = frozenset()

    def update(
        self,
        views: Mapping[str, Mapping[str, Any]],
        groups: Sequence[M.Group],
        preemptible: Collection[int],
        reserved: Collection[str],
    ) -> dict[str, tuple[M.Gpu, ...]]:
        """Every node's cells now (a new dict; the cells of a node that did not change are the same tuple)."""
        flipped = self._preemptible.symmetric_difference(preemptible)
        self._preemptible = frozenset(preemptible)
        again = {name for job in flipped for name in self._holders.get(job, ())}
        regrouped = list(self._tallies) != list(groups)
        tallies = {group: Counter[str]() for group in groups} if regrouped else self._tallies
        cells: dict[str, tuple[M.Gpu, ...]] = {}
        self.worked = 0
        for group in groups:
            gained: list[M.Gpu] = []  # the group's cells come and gone, tallied once (Counter counts in C)
            lost: list[M.Gpu] = []
            for name in group.nodes:
                view, held = views[name], name in reserved
                old = self.cells.get(name)
                was = self._from.get(name)
                same = was is not None and was[0] is view and was[1:] == (group.gpus, held)  # `is`: no deep compare
                if old is not None and same and name not in again:
                    cells[name] = old  # the feed's same object: the same cells
                    if regrouped:
                        gained += old
                    continue
                new = cells[name] = M.gpu_cells(view, group.gpus, self._preemptible, reserved)
                self.worked += 1
                self._from[name] = (view, group.gpus, held)
                if was is None or _holders_of(was[0]) != _holders_of(view):
                    self._hold(name, tuple(M.node_jobs(view)))
                if not regrouped and old is not None:
                    lost += old
                gained += new
            tally = tallies[group]
            tally.update(map(_kind, gained))
            tally.subtract(Counter(map(_kind, lost)))  # (`subtract` of cells would count them one by one in Python)
        for name in self.cells.keys() - cells.keys():  # nodes gone
            self._from.pop(name, None)
            self._hold(name, ())
        for tally in tallies.values():
            for kind in [k for k, n in tally.items() if n <= 0]:
                del tally[kind]
        self.cells, self._tallies = cells, tallies
        return cells

    def tally(self, group: M.Group) -> Counter[str]:
        """The group's GPUs by kind, as `maps.counts` tallies them (busy and flat together as `busy`)."""
        out = Counter(self._tallies[group])
        if "flat" in out:
            out["busy"] += out.pop("flat")
        return out

    def _hold(self, name: str, jobs: tuple[int, ...]) -> None:
        for job in self._jobs.get(name, ()):
            holders = self._holders.get(job)
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self._holders[job]
        if jobs:
            self._jobs[name] = jobs
            for job in jobs:
                self._holders.setdefault(job, set()).add(name)
        else:
            self._jobs.pop(name, None)
