"""The fabric test (issue 42): the bandwidth between a set of nodes, measured before a job that asks for it
(`preflight: {bandwidth: true}`) starts on them.

Every node of the set runs `scheduler/node/fabric.py` at once, over SSH: it listens on `node_tests.fabric.port`
at its own address (the one a launcher's MASTER_ADDR uses), sends a timed TCP stream to its neighbour in a ring
(and, from three nodes, to the one after, so that each node sends to two others and hears from two), and reports
each stream it received, measured from its first byte to its end. The streams carry a secret of this test: a
process of the node's users that connects to the port is not counted, so it can make no node look slow.

Which node is slow: a node whose every stream sent is slow (its way out), or whose every stream received is slow
while not all of their senders are slow on their way out (its way in). With two nodes, the two directions are
measured one after the other; with one slow direction the sender is blamed, with both the slower sender where it
is at most half as fast as the other, else both. A stream is slow below `min_gbps` when the operator sets it,
else below `below` times the baseline learnt from the pool's earlier tests (the median of this test's streams on
the first). A node that could not take part (its port taken, its SSH down) gets an `error`: a test that did not
measure is no evidence.

A node in service fails its own fabric test (burn-in's, which isolates it) only where at least two partners each saw
it slow (`for_node_in_service`): with one partner, the slow stream may be that partner's fault, or stray traffic on
its link, so the would-be fail is a `skip` and the node stays in service. A node out of service is kept out on one
partner's word: that only keeps it where it is. The same holds for a job's bandwidth check (`recovery`): a node in
service that only one partner saw slow is left out of that job, not isolated.
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ftconsole.scheduler.errors import SSHError
from ftconsole.scheduler.node.bundle import script
from ftconsole.scheduler.nodetests import TestResult
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.spec.nodetestspec import FABRIC_SSH_MARGIN_S, FabricTest
from ftconsole.scheduler.ssh import nodecache
from ftconsole.scheduler.ssh.transport import Transport

LEARNT = 20  # the last medians kept of a pool's passing tests: its learnt baseline is their median
# two nodes both slow on their way out: the slower is blamed alone when its rate is at most this share of the other's
AMBIGUOUS = 0.5
# partners that must each have seen a node in service slow before its fabric test may fail it (and so isolate it)
WITNESSES = 2


class Way(StrEnum):
    """The way a node was slow: the streams it sent (out) or those it received (in)."""

    IN = "in"
    OUT = "out"


@dataclass(frozen=True)
class Stream:
    """One timed stream, as its receiver measured it (gbps None: it never arrived whole; why says so)."""

    src: str
    dst: str
    gbps: float | None
    why: str | None = None


@dataclass(frozen=True)
class FabricResult(TestResult):
    """One node's fabric result, with what a fail rests on: the way it was slow, and the partners that saw it
    slow on that way (all its streams that way with them were slow). None and () where the judge did not fail it."""

    way: Way | None = None
    slow_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class FabricReport:
    nodes: tuple[str, ...]
    streams: tuple[Stream, ...]
    threshold: float | None  # Gbit/s under which a stream is slow (None: nothing measured to compare with)
    baseline: str  # where the threshold comes from, in words
    results: Mapping[str, FabricResult] = field(default_factory=dict)

    @property
    def median(self) -> float | None:
        measured = [s.gbps for s in self.streams if s.gbps is not None]
        return statistics.median(measured) if measured else None


def shifts(count: int) -> list[int]:
    """The ring distances each node sends to: one neighbour with two nodes, two from three nodes on."""
    return [1] if count == 2 else [1, 2]


def streams_of(names: Sequence[str], docs: Mapping[str, dict[str, Any] | str]) -> tuple[list[Stream], dict[str, str]]:
    """The streams the nodes' documents report (one per sender and shift, measured or not), and the nodes that
    could not take part with why. `docs`: node -> its document, or why there is none."""
    count = len(names)
    broken = {n: d for n, d in docs.items() if isinstance(d, str)}
    for name, given in docs.items():
        if isinstance(given, dict) and given.get("error"):
            broken[name] = str(given["error"])[:300]
    measured: dict[tuple[int, int], float] = {}
    for dst, name in enumerate(names):
        received = docs.get(name)
        if not isinstance(received, dict):
            continue
        for got in received.get("received") or []:
            src, took, size = got.get("from"), got.get("seconds"), got.get("bytes")
            if not isinstance(src, int) or not 0 <= src < count or src == dst:
                continue
            if isinstance(took, int | float) and isinstance(size, int) and took > 0 and size > 0:
                measured[(src, dst)] = size * 8 / took / 1e9
    out: list[Stream] = []
    for src, name in enumerate(names):
        doc = docs.get(name)
        sent = {s.get("shift"): s for s in doc.get("sent") or []} if isinstance(doc, dict) else {}
        for shift in shifts(count):
            dst = (src + shift) % count
            if (src, dst) in measured:
                out.append(Stream(name, names[dst], round(measured[(src, dst)], 3)))
                continue
            error = (sent.get(shift) or {}).get("error")
            why = broken.get(name) or broken.get(names[dst]) or error or f"{names[dst]} did not count it"
            out.append(Stream(name, names[dst], None, str(why)[:300]))
    return out, broken


def judge(names: Sequence[str], streams: Sequence[Stream], broken: Mapping[str, str], threshold: float | None,
          baseline: str, took: float) -> dict[str, FabricResult]:  # fmt: skip
    """Each node's result: fail for a slow way out or in (see the module's words), error for a node that could
    not take part, else pass."""
    out_of: dict[str, list[Stream]] = collections.defaultdict(list)
    into: dict[str, list[Stream]] = collections.defaultdict(list)
    for s in streams:
        if s.gbps is not None:
            out_of[s.src].append(s)
            into[s.dst].append(s)

    def slow(s: Stream) -> bool:
        return threshold is not None and s.gbps is not None and s.gbps < threshold

    way_out = {n for n in names if out_of[n] and all(slow(s) for s in out_of[n])}
    if len(names) == 2 and len(way_out) == 2:  # both ways slow: the slower sender, where it stands out
        (a, b) = sorted(names, key=lambda n: min(s.gbps or 0.0 for s in out_of[n]))
        if min(s.gbps or 0.0 for s in out_of[a]) <= AMBIGUOUS * min(s.gbps or 0.0 for s in out_of[b]):
            way_out = {a}
    way_in = {n for n in names if into[n] and all(slow(s) for s in into[n]) and not {s.src for s in into[n]} <= way_out}
    results: dict[str, FabricResult] = {}
    for name in names:
        mine = [s for s in streams if name in (s.src, s.dst)]
        sends = ", ".join(f"{s.dst} {_rate(s.gbps)}" for s in out_of[name]) or "nothing measured"
        hears = ", ".join(f"{s.src} {_rate(s.gbps)}" for s in into[name]) or "nothing measured"
        text = f"sends {sends}; receives {hears}; {baseline}"
        if name in broken:
            results[name] = _result("error", f"could not take part: {broken[name]}", took)
        elif name in way_out or name in way_in:
            way = Way.OUT if name in way_out else Way.IN
            partners = tuple(sorted({s.dst for s in out_of[name]} if way is Way.OUT else {s.src for s in into[name]}))
            results[name] = _result("fail", f"slow on its way {way}: {text}", took, way, partners)
        elif not out_of[name] and not into[name]:
            why = next((s.why for s in mine if s.why), "no stream measured")
            results[name] = _result("error", f"no stream measured: {why}", took)
        else:
            results[name] = _result("pass", text, took)
    return results


def _rate(gbps: float | None) -> str:
    return "-" if gbps is None else f"{gbps:.3g} Gbit/s"


def _result(result: str, summary: str, took: float, way: Way | None = None, slow_with: tuple[str, ...] = ()
            ) -> FabricResult:  # fmt: skip
    return FabricResult("fabric", result, summary[:300], tool="tcp", took_s=round(took, 2), way=way,
                        slow_with=slow_with)  # fmt: skip


def too_few_witnesses(result: FabricResult) -> str | None:
    """Why a fail may not take a node in service out of service (fewer than WITNESSES partners saw it slow: a
    single partner's own link, or stray traffic on it, may be what was slow), in words; None where it may, or
    where the result is no fail. The one place of the rule: burn-in and a job's bandwidth check both ask it."""
    if result.result != "fail" or len(result.slow_with) >= WITNESSES:
        return None
    return f"only {', '.join(result.slow_with)} saw it slow: one partner is not enough to take a node in service out"


def for_node_in_service(result: FabricResult) -> FabricResult:
    """A node in service's result: a fail that fewer than WITNESSES partners back is a skip, saying why; any other
    result as it is."""
    why = too_few_witnesses(result)
    if why is None:
        return result
    return replace(result, result="skip", summary=f"{why} ({result.summary})"[:300])


class Baselines:
    """The rate each pool's fabric showed in its passing tests (the median of their streams), kept in the store's
    meta as `fabric.<pool>` so that a restart keeps what was learnt."""

    def __init__(self, read: Callable[[str], Any], write: Callable[[str, str], Any]) -> None:
        self._read, self._write = read, write
        self._seen: dict[str, collections.deque[float]] = {}

    async def learnt(self, pool: str) -> float | None:
        seen = await self._load(pool)
        return statistics.median(seen) if seen else None

    async def learn(self, pool: str, report: FabricReport) -> None:
        """Keep the median of the streams of the nodes that passed."""
        passing = {n for n, r in report.results.items() if r.result == "pass"}
        rates = [s.gbps for s in report.streams if s.gbps is not None and {s.src, s.dst} <= passing]
        if not rates:
            return
        seen = await self._load(pool)
        seen.append(round(statistics.median(rates), 3))
        await self._write(f"fabric.{pool}", json.dumps(list(seen)))

    async def _load(self, pool: str) -> collections.deque[float]:
        if pool not in self._seen:
            text = await self._read(f"fabric.{pool}")
            try:
                values = [float(v) for v in json.loads(text)] if text else []
            except (ValueError, TypeError):
                values = []
            self._seen[pool] = collections.deque(values[-LEARNT:], maxlen=LEARNT)
        return self._seen[pool]


async def measure(transport: Transport, python: str, nodes: Sequence[Node], settings: FabricTest) -> FabricReport:
    """Run the streams between `nodes` (two or more) and read them; the report's results are not judged yet."""
    names = [n.name for n in nodes]
    token = secrets.token_hex(16)
    timeout = settings.node_timeout(len(nodes))
    hosts = [n.host for n in nodes]

    async def one(index: int, node: Node) -> dict[str, Any] | str:
        params = {"index": index, "hosts": hosts, "port": settings.port, "shifts": shifts(len(nodes)),
                  "seconds": settings.seconds, "timeout": timeout, "token": token,
                  "after": len(nodes) == 2 and index == 1}  # fmt: skip
        try:
            done = await nodecache.run(transport, node, [python, "-"], name="fabric", source=script("fabric"),
                                       params=params, timeout=timeout + FABRIC_SSH_MARGIN_S)  # fmt: skip
        except SSHError as exc:
            return f"cannot run on {node.name}: {exc}"
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    break
                if isinstance(doc, dict) and doc.get("fabric") == 1:
                    return doc
        return f"no result from {node.name}: {done.describe_failure() if not done.ok else 'no JSON line'}"

    docs = await asyncio.gather(*(one(i, n) for i, n in enumerate(nodes)))
    streams, broken = streams_of(names, dict(zip(names, docs, strict=True)))
    return FabricReport(
        tuple(names), tuple(streams), None, "", {n: _result("error", w, 0.0) for n, w in broken.items()}
    )


async def check(transport: Transport, python: str, nodes: Sequence[Node], settings: FabricTest, pool: str,
                baselines: Baselines) -> FabricReport:  # fmt: skip
    """Measure the fabric between `nodes` and judge each node against the pool's baseline; learn from a pass."""
    started = time.monotonic()
    measured = await measure(transport, python, nodes, settings)
    broken = {n: r.summary for n, r in measured.results.items()}
    threshold: float | None = settings.min_gbps
    words = f"baseline {_rate(threshold)} (min_gbps)"
    if threshold is None:
        learnt = await baselines.learnt(pool)
        base = learnt if learnt is not None else measured.median
        source = f"learnt in pool {pool}" if learnt is not None else "the median of this test"
        threshold = base * settings.below if base is not None else None
        words = f"baseline {_rate(base)} ({source}), slow under {settings.below:.0%}" if base is not None else ""
    results = judge(measured.nodes, measured.streams, broken, threshold, words, time.monotonic() - started)
    report = FabricReport(measured.nodes, measured.streams, threshold, words, results)
    await baselines.learn(pool, report)
    return report
