"""What the probes read of each GPU over time: utilisation, temperature and memory, kept compact in memory.

The hang detector reads a job's GPUs' utilisation over its hang window; the console draws a node's GPUs and a
job's ranks as curves. Both read these samples, the last `KEPT` probes of each node (at the default probe interval,
60 s, 8.5 hours), which survive a restart through the probe results the store keeps.

Each node has one ring of fixed size: a time (8 bytes) per probe, and per GPU a byte of utilisation, a byte of
temperature and 4 bytes of memory. So 1,000 nodes of 8 GPUs hold about 28 MB (512 x (8 + 8 x 6) bytes a node),
where a tuple per sample took about 470 MB (tracemalloc).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

KEPT = 512  # probes kept per node
_NONE = 255  # no reading (utilisation, temperature as a byte)


class NodeSamples:
    """The last `capacity` probes of one node with `gpus` GPUs, oldest first."""

    __slots__ = ("capacity", "count", "gpus", "mem", "start", "temp", "times", "util")

    def __init__(self, gpus: int, capacity: int = KEPT) -> None:
        self.gpus, self.capacity = gpus, capacity
        self.start = self.count = 0
        self.times = array("d", bytes(8 * capacity))
        self.util = array("B", bytes(capacity * gpus))
        self.temp = array("B", bytes(capacity * gpus))
        self.mem = array("f", bytes(4 * capacity * gpus))

    def _append(self, when: float) -> int:
        """The slot of a new sample at `when`: the next one, over the oldest once the ring is full."""
        slot = (self.start + self.count) % self.capacity
        if self.count == self.capacity:
            self.start = (self.start + 1) % self.capacity
        else:
            self.count += 1
        self.times[slot] = when
        return slot

    def add(self, when: float, gpus: Sequence[Mapping[str, Any]]) -> None:
        base = self._append(when) * self.gpus
        for i in range(self.gpus):
            self.util[base + i] = self.temp[base + i] = _NONE
            self.mem[base + i] = math.nan
        for g in gpus:
            index = g.get("index")
            if not isinstance(index, int) or not 0 <= index < self.gpus:
                continue
            self.util[base + index] = _byte(g.get("utilization"), 100)
            self.temp[base + index] = _byte(g.get("temperature"), 254)
            mem = g.get("memory_used_mib")
            if isinstance(mem, int | float) and not isinstance(mem, bool):
                self.mem[base + index] = float(mem)

    def extend(self, other: NodeSamples) -> None:
        """`other`'s samples newer than this one's last, as they are (the same node, the same GPUs)."""
        for slot in other._slots():
            when = other.times[slot]
            last = self.last
            if last is not None and when <= last:
                continue
            a, b = self._append(when) * self.gpus, slot * other.gpus
            self.util[a : a + self.gpus] = other.util[b : b + other.gpus]
            self.temp[a : a + self.gpus] = other.temp[b : b + other.gpus]
            self.mem[a : a + self.gpus] = other.mem[b : b + other.gpus]

    @property
    def last(self) -> float | None:
        return self.times[(self.start + self.count - 1) % self.capacity] if self.count else None

    def _slots(self, since: float | None = None) -> Iterator[int]:
        for k in range(self.count):
            slot = (self.start + k) % self.capacity
            if since is None or self.times[slot] >= since:
                yield slot

    def util_of(self, index: int) -> list[tuple[float, float]]:
        """(time, %) of one GPU, oldest first; probes that did not read it left out."""
        out = []
        for slot in self._slots():
            u = self.util[slot * self.gpus + index]
            if u != _NONE:
                out.append((self.times[slot], float(u)))
        return out

    def last_at_least(self, index: int, threshold: float, since: float) -> float | None:
        """When one GPU last read `threshold` % or more, looking back to `since` at most (None: not since then):
        from the newest probe back, no list built (idle reclaim asks it of every watched GPU each tick)."""
        for k in range(self.count - 1, -1, -1):
            slot = (self.start + k) % self.capacity
            when = self.times[slot]
            if when < since:
                return None
            u = self.util[slot * self.gpus + index]
            if u != _NONE and u >= threshold:
                return when
        return None

    def recent_util(self, index: int, count: int) -> list[float | None]:
        """One GPU's utilisation at the node's last `count` probes (fewer where fewer are kept), oldest first."""
        out: list[float | None] = []
        for k in range(max(0, self.count - count), self.count):
            u = self.util[((self.start + k) % self.capacity) * self.gpus + index]
            out.append(None if u == _NONE else float(u))
        return out

    def series(self, index: int, since: float | None = None) -> dict[str, list[Any]]:
        """One GPU's samples from `since` as lists of the same length: time, utilisation %, temperature C,
        memory used MiB (None where a probe did not read it)."""
        out: dict[str, list[Any]] = {"time": [], "utilization": [], "temperature": [], "memory_used_mib": []}
        for slot in self._slots(since):
            at = slot * self.gpus + index
            u, t, m = self.util[at], self.temp[at], self.mem[at]
            out["time"].append(round(self.times[slot], 3))
            out["utilization"].append(None if u == _NONE else u)
            out["temperature"].append(None if t == _NONE else t)
            out["memory_used_mib"].append(None if math.isnan(m) else round(m))
        return out


def _byte(value: Any, top: int) -> int:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return _NONE
    return max(0, min(top, round(value)))


class GpuSamples(Mapping[str, Sequence[tuple[float, float]]]):
    """Every node's samples; as a mapping, each GPU's utilisation ("node:index" -> (time, %), oldest first), as
    the hang detector reads it."""

    def __init__(self, capacity: int = KEPT) -> None:
        self.capacity = capacity
        self.nodes: dict[str, NodeSamples] = {}
        self.generation = 0  # moves on with every sample kept: what was computed from them may be reused till then

    def add(self, node: str, when: float, report: Mapping[str, Any]) -> None:
        """A probe's report (`gpus`), kept unless older than the node's last sample (a late or seeded one)."""
        gpus = report.get("gpus") or []
        count = max((g["index"] + 1 for g in gpus if isinstance(g.get("index"), int) and g["index"] >= 0), default=0)
        kept = self.nodes.get(node)
        if kept is None or kept.gpus != count:  # a node whose GPUs changed starts again
            if count == 0:
                return
            kept = self.nodes[node] = NodeSamples(min(count, 64), self.capacity)
        last = kept.last
        if last is None or when > last:
            kept.add(when, gpus)
            self.generation += 1

    def merge(self, newer: GpuSamples) -> None:
        """`newer`'s samples after each node's last here (what this process read while the store's were loaded)."""
        for node, theirs in newer.nodes.items():
            mine = self.nodes.get(node)
            if mine is None or mine.gpus != theirs.gpus:
                self.nodes[node] = theirs
            else:
                mine.extend(theirs)
        self.generation += 1

    def __getitem__(self, key: str) -> list[tuple[float, float]]:
        node, _, index = key.rpartition(":")
        kept = self.nodes.get(node)
        if kept is None or not index.isdecimal() or int(index) >= kept.gpus:
            raise KeyError(key)
        return kept.util_of(int(index))

    def last_at_least(self, node: str, index: int, threshold: float, since: float) -> float | None:
        """`NodeSamples.last_at_least` of one GPU of a node (None: no samples of it)."""
        kept = self.nodes.get(node)
        if kept is None or not 0 <= index < kept.gpus:
            return None
        return kept.last_at_least(index, threshold, since)

    def __iter__(self) -> Iterator[str]:
        return (f"{node}:{i}" for node, kept in self.nodes.items() for i in range(kept.gpus))

    def __len__(self) -> int:
        return sum(kept.gpus for kept in self.nodes.values())

    def node_json(self, node: str, since: float, gpus: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """A node's GPUs (or those named) since `since`: `index` and its series (`NodeSamples.series`)."""
        kept = self.nodes.get(node)
        if kept is None:
            return []
        wanted = range(kept.gpus) if gpus is None else [g for g in gpus if 0 <= g < kept.gpus]
        return [{"index": i, **kept.series(i, since)} for i in wanted]

    def jobs_util(self, runs: Iterable[tuple[int, str, Sequence[int]]], count: int) -> dict[int, list[float | None]]:
        """Each job's GPU utilisation at its nodes' last `count` probes, the mean of its GPUs at each (a node's
        k-th latest probe with another node's k-th latest: they are a sweep apart at most), oldest first.
        `runs`: (job, node, GPUs) of each running rank."""
        sums: dict[int, list[float]] = {}
        counts: dict[int, list[int]] = {}
        for job, node, gpus in runs:
            kept = self.nodes.get(node)
            if kept is None:
                continue
            total, seen = sums.setdefault(job, [0.0] * count), counts.setdefault(job, [0] * count)
            for g in gpus:
                if 0 <= g < kept.gpus:
                    values = kept.recent_util(g, count)
                    shift = count - len(values)  # a node with fewer probes kept: its values at the end
                    for k, v in enumerate(values):
                        if v is not None:
                            total[shift + k] += v
                            seen[shift + k] += 1
        out: dict[int, list[float | None]] = {}
        for job, total in sums.items():
            seen = counts[job]
            if any(seen):
                out[job] = [round(t / n, 1) if n else None for t, n in zip(total, seen, strict=True)]
        return out

    def nbytes(self) -> int:
        """The memory the samples' arrays hold."""
        return sum(sum(a.itemsize * len(a) for a in (k.times, k.util, k.temp, k.mem)) for k in self.nodes.values())
