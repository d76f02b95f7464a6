"""The usable nodes of one placement pass, indexed (the catalog), and their free GPUs (see placement.py,
"Performance"): nodes grouped by (pool, GPU model, driver, labels, images) and, in each group, by free GPU count,
so that a job that cannot fit is refused without looking at nodes."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from ftconsole.scheduler.decide.placement_inputs import Allocation, Candidate, JobRequest, NodeGpus, NodeSlot
from ftconsole.scheduler.decide.topology import Fabric

# --------------------------------------------------------------------------------------------- the catalog

_GroupKey = tuple[str, str, str, frozenset[str], bool]  # pool, gpu model, driver, labels, images


_Query = tuple[str | None, str | None, str | None, frozenset[str], bool]  # a job's: the same, None: any


def _usable(node: NodeSlot, allow_degraded: Collection[str]) -> bool:
    return node.state_ok or (node.degraded and node.pool in allow_degraded)


class Catalog:
    """The usable nodes, grouped by (pool, model, driver, labels); fixed for a pass."""

    def __init__(
        self, nodes: Iterable[NodeSlot], allow_degraded: Collection[str], fabric: Fabric | None = None
    ) -> None:
        self.fabric = fabric
        usable = {n.name: n for n in nodes if _usable(n, allow_degraded) and n.gpus_total > 0}
        self.nodes: dict[str, NodeSlot] = dict(sorted(usable.items()))
        self.keys: list[_GroupKey] = sorted(
            {_group_key(n) for n in self.nodes.values()}, key=lambda k: (k[0], k[1], k[2], sorted(k[3]), k[4])
        )
        gid = {key: i for i, key in enumerate(self.keys)}
        self.group_of: dict[str, int] = {name: gid[_group_key(n)] for name, n in self.nodes.items()}
        self.max_gpus = max((n.gpus_total for n in self.nodes.values()), default=0)
        self.members: list[list[str]] = [[] for _ in self.keys]
        for name, group in self.group_of.items():
            self.members[group].append(name)
        # capacity[g][k]: nodes of group g with at least k GPUs in total
        self.capacity = [_at_least((self.nodes[m].gpus_total for m in ms), self.max_gpus) for ms in self.members]
        self._groups: dict[_Query, tuple[int, ...]] = {}

    def groups(self, job: JobRequest, cand: Candidate) -> tuple[int, ...]:
        """The groups whose nodes match the job's constraints and the candidate's model."""
        query = (job.pool, cand.gpu_model, job.driver_version, job.labels, job.image)
        found = self._groups.get(query)
        if found is None:
            found = tuple(i for i, key in enumerate(self.keys) if _key_matches(key, query))
            self._groups[query] = found
        return found

    def named(self, job: JobRequest, cand: Candidate) -> list[str]:
        """The usable nodes of `job.node_names` that match, in name order."""
        groups = set(self.groups(job, cand))
        names = job.node_names or frozenset()
        return sorted(n for n in names if n in self.nodes and self.group_of[n] in groups)

    def eligible(self, job: JobRequest, cand: Candidate) -> list[str]:
        """Every usable node that could ever hold the candidate (all of its GPUs free)."""
        g = cand.gpus_per_node
        if job.node_names is not None:
            names = self.named(job, cand)
        else:
            names = [name for group in self.groups(job, cand) for name in self.members[group]]
        return [name for name in names if self.nodes[name].gpus_total >= g]

    def can_ever_fit(self, job: JobRequest, cand: Candidate) -> int:
        """How many usable nodes could hold the candidate if they were empty."""
        g = cand.gpus_per_node
        if job.node_names is not None:
            return len(self.eligible(job, cand))
        if g > self.max_gpus:
            return 0
        return sum(self.capacity[group][g] for group in self.groups(job, cand))


def _group_key(node: NodeSlot) -> _GroupKey:
    return (node.pool, node.gpu_model, node.driver_version, node.labels, node.images)


def _key_matches(key: _GroupKey, query: _Query) -> bool:
    pool, model, driver, labels, image = query
    return (
        (pool is None or key[0] == pool)
        and (model is None or key[1] == model)
        and (driver is None or key[2] == driver)
        and labels <= key[3]
        and (key[4] or not image)
    )


def _at_least(counts: Iterable[int], top: int) -> list[int]:
    """[k] -> how many of `counts` are >= k, for k in 0..top+1."""
    histogram = [0] * (top + 2)
    for c in counts:
        histogram[c] += 1
    for k in range(top, -1, -1):
        histogram[k] += histogram[k + 1]
    return histogram


# --------------------------------------------------------------------------------------------- free GPUs


class FreeView:
    """Free GPUs per usable node, indexed by group and free count; mutated as the pass places jobs."""

    def __init__(self, catalog: Catalog, free: dict[str, list[int]]) -> None:
        self.catalog = catalog
        self.free = free
        top = catalog.max_gpus
        self.buckets: list[list[list[str]]] = [[[] for _ in range(top + 1)] for _ in catalog.keys]
        for name in catalog.nodes:  # name order, so every bucket is sorted
            self.buckets[catalog.group_of[name]][len(free[name])].append(name)
        # at_least[g][k]: nodes of group g with at least k free GPUs
        self.at_least = [_at_least((len(free[m]) for m in ms), top) for ms in catalog.members]

    @classmethod
    def current(cls, catalog: Catalog, allocations: Iterable[Allocation]) -> FreeView:
        used: dict[str, set[int]] = {}
        for alloc in allocations:
            if alloc.node in catalog.nodes:
                used.setdefault(alloc.node, set()).update(alloc.gpus)
        free = {}
        for name, node in catalog.nodes.items():
            busy = used.get(name, set())
            free[name] = [i for i in range(node.gpus_total) if i not in busy]
        return cls(catalog, free)

    def without(self, reserved: Mapping[str, frozenset[int]]) -> FreeView:
        """A copy that leaves out the reserved GPUs."""
        free = {
            name: [i for i in gpus if i not in reserved[name]] if name in reserved else list(gpus)
            for name, gpus in self.free.items()
        }
        return FreeView(self.catalog, free)

    def available(self, groups: Sequence[int], g: int) -> int:
        """How many nodes of these groups have at least g free GPUs."""
        if g > self.catalog.max_gpus:
            return 0
        return sum(self.at_least[group][g] for group in groups)

    def available_among(self, names: Iterable[str], g: int) -> int:
        return sum(1 for name in names if len(self.free[name]) >= g)

    def best_fit(
        self, groups: Sequence[int], n: int, g: int, max_leaves: int | None = None, segment: int | None = None
    ) -> list[str] | None:
        """n nodes with at least g free GPUs, fewest free first, then by name; None when fewer exist. With a fabric,
        several nodes go under the fewest switches (`Fabric.choose`), best fit within; with `segment`, in groups of
        that many, each inside one block (`Fabric.segments`; no fabric: none)."""
        if self.available(groups, g) < n:
            return None
        if self.catalog.fabric is not None and (n > 1 or segment is not None):
            fitting = [name for k in range(g, self.catalog.max_gpus + 1)
                       for name in heapq.merge(*(self.buckets[group][k] for group in groups))]  # fmt: skip
            return _chosen(self.catalog.fabric, fitting, n, max_leaves, segment)
        if segment is not None:
            return None
        picked: list[str] = []
        for k in range(g, self.catalog.max_gpus + 1):
            need = n - len(picked)
            if len(groups) == 1:
                picked.extend(self.buckets[groups[0]][k][:need])
            else:
                picked.extend(islice(heapq.merge(*(self.buckets[group][k] for group in groups)), need))
            if len(picked) == n:
                return picked
        raise AssertionError("unreachable: the counts said the nodes exist")

    def best_fit_among(
        self, names: Iterable[str], n: int, g: int, max_leaves: int | None = None, segment: int | None = None
    ) -> list[str] | None:
        fitting = [name for name in names if len(self.free[name]) >= g]
        if len(fitting) < n:
            return None
        fitting.sort(key=lambda name: (len(self.free[name]), name))
        if self.catalog.fabric is None:
            return None if segment is not None else fitting[:n]
        if n == 1 and segment is None:
            return fitting[:n]
        return _chosen(self.catalog.fabric, fitting, n, max_leaves, segment)

    def take(self, name: str, gpus: Collection[int]) -> None:
        """Mark these GPUs of the node used (those that are free in this view)."""
        old = self.free.get(name)
        if old is None:
            return
        self._set(name, old, [i for i in old if i not in gpus])

    def give(self, name: str, gpus: Collection[int]) -> None:
        """Mark these GPUs of the node free again (the inverse of `take`; preemption's what-if)."""
        old = self.free.get(name)
        if old is None:
            return
        total = self.catalog.nodes[name].gpus_total
        self._set(name, old, sorted({*old, *(i for i in gpus if 0 <= i < total)}))

    def _set(self, name: str, old: list[int], new: list[int]) -> None:
        """The node's free GPUs are `new` now (`old` before): its bucket and the group's counts follow."""
        if len(new) == len(old):
            return
        group = self.catalog.group_of[name]
        bucket = self.buckets[group][len(old)]
        del bucket[bisect.bisect_left(bucket, name)]
        bisect.insort(self.buckets[group][len(new)], name)
        counts = self.at_least[group]
        for k in range(min(len(old), len(new)) + 1, max(len(old), len(new)) + 1):
            counts[k] += 1 if len(new) > len(old) else -1
        self.free[name] = new


def _chosen(
    fabric: Fabric, fitting: Sequence[str], n: int, max_leaves: int | None, segment: int | None
) -> list[str] | None:
    if segment is None:
        return fabric.choose(fitting, n, max_leaves)
    return fabric.segments(fitting, n, segment)


def pick_nodes(job: JobRequest, cand: Candidate, catalog: Catalog, view: FreeView) -> list[str] | None:
    g, most, segment = cand.gpus_per_node, job.max_switches, job.segment
    if job.node_names is not None:
        names = view.best_fit_among(catalog.named(job, cand), job.nodes, g, most, segment)
    else:
        names = view.best_fit(catalog.groups(job, cand), job.nodes, g, most, segment)
    fabric = catalog.fabric  # the fewest switches it can have now, more than it waits for: not now
    if names is not None and job.max_switches is not None and fabric is not None:
        return None if len(fabric.leaves(names)) > job.max_switches else names
    return names


def fit_job(job: JobRequest, catalog: Catalog, view: FreeView) -> tuple[int, tuple[NodeGpus, ...]] | None:
    """The first candidate that fits the view, with its nodes and GPUs (lowest free indexes)."""
    for index, cand in enumerate(job.candidates):
        names = pick_nodes(job, cand, catalog, view)
        if names is not None:
            g = cand.gpus_per_node
            return index, tuple((name, tuple(view.free[name][:g])) for name in names)
    return None


def available(job: JobRequest, cand: Candidate, catalog: Catalog, view: FreeView) -> int:
    if job.node_names is not None:
        return view.available_among(catalog.named(job, cand), cand.gpus_per_node)
    return view.available(catalog.groups(job, cand), cand.gpus_per_node)
