"""Node tests (issue 42): what a node passes under load before it takes work back.

A probe sees a node at rest; a GPU that passes at rest may fail the first job that loads it. The tests named in
`node_tests` (today: DCGM's diagnostics, `gpu`) run on the node over SSH as the SSH account, like the probe
agent: `scheduler/node/nodetest.py`, sent on standard input to `python3 -`, prints one JSON line. Each result is
a node event (`tested`) with its one line, which `ftconsole nodes NODE` and `events --node` show.

They run:
- before the scheduler resumes an isolated node (`node_tests.before_resume`, with
  `probes.isolation_recover_after`): once the node has passed its probes N times in a row, it is tested, and
  resumed only on a pass; a failure keeps it isolated with the failing line as its reason, and its streak starts
  again (it is tested again after N more passing probes);
- on an operator's `ftconsole resume --test NODES`: the nodes that pass are resumed, the others stay as they were.

A node stays out of service while it is tested (isolated or drained), so no job meets the test's load. A test
that could not run on the node (no DCGM there: `skip`) does not hold the node back: its probes' readings at rest
are then all there is, as before; one that broke (`error`: a timeout, DCGM's host engine down) does.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.probes.health import NodeEvent
from ftconsole.scheduler.decide.usertext import clean
from ftconsole.scheduler.errors import SSHError
from ftconsole.scheduler.node.bundle import script
from ftconsole.scheduler.spec.config import ClusterConfig, Node
from ftconsole.scheduler.spec.nodetestspec import PASSING, NodeTests
from ftconsole.scheduler.ssh import nodecache
from ftconsole.scheduler.ssh.transport import Transport

log = logging.getLogger("ftconsole.scheduler")

RESULTS = ("pass", "warn", "skip", "fail", "error")
MARGIN_S = 30.0  # the SSH command's deadline over the tests' own: Python's start, the answer's way back
MAX_LINES = 32  # failures and warnings kept of one result
MAX_TEXT = 300  # characters kept of one line


@dataclass(frozen=True)
class TestResult:
    """One test on one node, as the node reported it (or as the scheduler saw it fail to run)."""

    test: str
    result: str  # pass | warn | skip | fail | error
    summary: str
    level: int | None = None
    failures: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    tool: str | None = None  # dcgmi | simulated | None
    took_s: float | None = None

    @property
    def passed(self) -> bool:
        return self.result in PASSING

    @property
    def name(self) -> str:
        """The test as a person names it: `gpu (dcgmi diag -r 2)`."""
        if self.test == "gpu" and self.level is not None:
            return f"gpu (dcgmi diag -r {self.level})" if self.tool != "simulated" else f"gpu (level {self.level})"
        return self.test

    def line(self) -> str:
        return f"{self.name}: {self.result}: {self.summary}"

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test, "result": self.result, "summary": self.summary, "level": self.level,
            "failures": list(self.failures), "warnings": list(self.warnings), "tool": self.tool,
            "took_s": self.took_s,
        }  # fmt: skip


@dataclass(frozen=True)
class NodeTestReport:
    """The tests of one node, run once."""

    node: str
    results: tuple[TestResult, ...]
    time: float

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def line(self) -> str:
        return "; ".join(r.line() for r in self.results)

    def failing(self) -> str:
        """The lines of what did not pass (what a node kept out says)."""
        return "; ".join(r.line() for r in self.results if not r.passed)

    def events(self, by: str) -> list[NodeEvent]:
        """One `tested` event per test, each with its result for scripts (`events --json`)."""
        return [
            NodeEvent(self.time, self.node, "tested", f"{r.line()} (tested by {by})", {**r.to_json(), "by": by})
            for r in self.results
        ]

    def to_json(self) -> dict[str, Any]:
        results = [r.to_json() for r in self.results]
        return {"node": self.node, "passed": self.passed, "time": self.time, "results": results}


def node_params(tests: NodeTests) -> dict[str, Any]:
    """The node script's PARAMS: each test named, with its level and its own deadline."""
    params: dict[str, Any] = {}
    if tests.gpu is not None:
        params["gpu"] = {"level": tests.gpu.level, "timeout": tests.gpu.deadline}
    return {"tests": params}


def deadline(tests: NodeTests) -> float:
    """How long a node's tests may take: the GPU test's command with its margin, then the fabric test."""
    gpu = tests.gpu.deadline + MARGIN_S if tests.gpu is not None else 0.0
    return gpu + (tests.fabric.deadline if tests.fabric is not None else 0.0)


async def run_tests(
    transport: Transport, config: ClusterConfig, node: Node, clock: Callable[[], float]
) -> NodeTestReport:
    """Run the configured tests on `node` and read their results; a node that cannot run them gets an `error`
    result for each, naming why (never an exception)."""
    tests = config.node_tests_for(node.pool)
    wanted = list(node_params(tests)["tests"])
    if not wanted:  # the fabric alone: nothing to run on the node by itself
        return NodeTestReport(node.name, (), clock())
    try:
        done = await nodecache.run(
            transport, node, [config.ssh.python, "-"], name="nodetest", source=script("nodetest"),
            params=node_params(tests), timeout=tests.gpu.deadline + MARGIN_S if tests.gpu else MARGIN_S,
        )  # fmt: skip
    except SSHError as exc:
        return _broken(node.name, wanted, f"cannot run on {node.name}: {exc}", clock())
    try:
        results = parse_results(done.stdout)
    except ValueError as exc:
        why = done.describe_failure() if not done.ok else str(exc)
        return _broken(node.name, wanted, f"no result from {node.name}: {why}", clock())
    missing = [t for t in wanted if t not in {r.test for r in results}]
    extra = _broken(node.name, missing, "the node said nothing of it", clock()).results
    return NodeTestReport(node.name, (*results, *extra), clock())


def _broken(node: str, tests: Sequence[str], why: str, now: float) -> NodeTestReport:
    return NodeTestReport(node, tuple(TestResult(t, "error", _text(why)) for t in tests), now)


def parse_results(stdout: str) -> list[TestResult]:
    """The results of the node script's last JSON line; ValueError when there is none that reads."""
    for line in reversed(stdout.splitlines()):
        if not line.startswith("{"):
            continue
        doc = json.loads(line)
        if not isinstance(doc, dict) or doc.get("nodetest") != 1 or not isinstance(doc.get("results"), list):
            raise ValueError(f"not a node test result: {line[:200]}")
        return [_result(r) for r in doc["results"] if isinstance(r, dict)]
    raise ValueError("no JSON line in its output")


def _result(doc: dict[str, Any]) -> TestResult:
    result = doc.get("result")
    level, took = doc.get("level"), doc.get("took_s")
    return TestResult(
        test=_text(doc.get("test")) or "?",
        result=result if result in RESULTS else "error",
        summary=_text(doc.get("summary")) or ("" if result in RESULTS else f"unknown result {str(result)[:40]!r}"),
        level=level if isinstance(level, int) and not isinstance(level, bool) else None,
        failures=_lines(doc.get("failures")),
        warnings=_lines(doc.get("warnings")),
        tool=_text(doc.get("tool")) or None,
        took_s=round(float(took), 2) if isinstance(took, int | float) and math.isfinite(took) else None,
    )


def _text(value: Any) -> str:
    return clean(str(value)).replace("\n", " ").strip()[:MAX_TEXT] if value is not None else ""


def _lines(value: Any) -> tuple[str, ...]:
    return tuple(_text(v) for v in value[:MAX_LINES]) if isinstance(value, list) else ()


# a node's fabric test: the node with partners it chooses (nodegate.fabric_test), set by the node service
FabricHook = Callable[[Node, ClusterConfig], Awaitable[TestResult]]


class Tester:
    """The node tests under way in this process: one at a time per node. `start` runs them in the background and
    hands the report over (the gate of the scheduler's resume); `test` awaits them (`resume --test`). A fabric
    test borrows idle nodes as partners (`borrow`): placement holds them too until it ends."""

    def __init__(self, transport: Transport, clock: Callable[[], float]) -> None:
        self.transport = transport
        self.clock = clock
        self._running: dict[str, asyncio.Task[NodeTestReport]] = {}
        self._handing: set[asyncio.Future[None]] = set()  # reports being handed over (kept from the collector)
        self._until: dict[str, float] = {}  # node -> when its test under way ends at the latest (placement)
        self.last: dict[str, float] | None = None  # node -> when it was last tested (None: not read yet)
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()  # (test, result, trigger)
        self.fabric: FabricHook | None = None  # None: none here (a Tester without the node service's nodes)
        self._lent: dict[str, float] = {}  # partner node -> when the fabric test that borrowed it ends at the latest

    def count(self, report: NodeTestReport, trigger: str) -> None:
        """Count a report's results (`ftconsole_node_tests_total`); trigger: resume, operator or burn-in."""
        self.counts.update((r.test, r.result, trigger) for r in report.results)

    @property
    def testing(self) -> frozenset[str]:
        """The nodes being tested now."""
        return frozenset(self._running)

    def holds(self) -> dict[str, float]:
        """The nodes being tested now, and the partners of their fabric tests, with when their tests end at the
        latest: placement counts their GPUs as held until then (a job placed there would meet the test's load)."""
        return {**self._lent, **{name: self._until[name] for name in self._running}}

    @property
    def lent(self) -> frozenset[str]:
        """The nodes a fabric test uses as partners now."""
        return frozenset(self._lent)

    def borrow(self, names: Sequence[str], until: float) -> None:
        self._lent.update(dict.fromkeys(names, until))

    def give_back(self, names: Sequence[str]) -> None:
        for name in names:
            self._lent.pop(name, None)

    def start(self, node: Node, config: ClusterConfig, done: Callable[[NodeTestReport], Awaitable[None]]) -> None:
        """Test `node` in the background unless it is being tested; its report goes to `done`."""
        if node.name in self._running:
            return
        self._task(node, config).add_done_callback(lambda t: self._hand_over(t, done))

    async def test(self, node: Node, config: ClusterConfig) -> NodeTestReport:
        """Test `node` now (or wait for its test under way) and return the report."""
        task = self._running.get(node.name) or self._task(node, config)
        return await asyncio.shield(task)

    async def _tests(self, node: Node, config: ClusterConfig) -> NodeTestReport:
        """The node's own tests, then its fabric test (with partners) where one is named."""
        report = await run_tests(self.transport, config, node, self.clock)
        if config.node_tests_for(node.pool).fabric is None:
            return report
        if self.fabric is None:
            result = TestResult("fabric", "skip", "no partner nodes to test the fabric with here")
        else:
            result = await self.fabric(node, config)
        return NodeTestReport(node.name, (*report.results, result), self.clock())

    def _task(self, node: Node, config: ClusterConfig) -> asyncio.Task[NodeTestReport]:
        task = asyncio.create_task(self._tests(node, config))
        self._running[node.name] = task
        self._until[node.name] = self.clock() + deadline(config.node_tests_for(node.pool))
        task.add_done_callback(lambda t: self._ended(node.name))
        return task

    def _ended(self, name: str) -> None:
        self._running.pop(name, None)
        self._until.pop(name, None)
        if self.last is not None:
            self.last[name] = self.clock()

    def _hand_over(self, task: asyncio.Task[NodeTestReport], done: Callable[[NodeTestReport], Awaitable[None]]) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("node test failed", exc_info=task.exception())
            return
        handing = asyncio.ensure_future(done(task.result()))
        self._handing.add(handing)
        handing.add_done_callback(self._handed)

    def _handed(self, task: asyncio.Future[None]) -> None:
        self._handing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("recording a node test failed", exc_info=task.exception())

    async def close(self) -> None:
        """Stop the tests under way (a node mid-test stays isolated: it is tested again later)."""
        tasks: list[asyncio.Future[Any]] = [*self._running.values(), *self._handing]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
