"""Idle reclaim (scheduler/idling.py) on a running job's evidence: GPU samples, steps and the times its shells were
last typed at; and the cluster's idle rules for allocations (`Rules.allocation`, `Rules._idle_allowed`)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Job, JobStatus, Run, StopReason
from ftconsole.scheduler.decide.stepplan import JobStep
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.idling import IDLE_ALERT, IdleReclaim
from ftconsole.scheduler.rules import Rules
from ftconsole.scheduler.samples import GpuSamples
from ftconsole.scheduler.spec.config import SchedulerSettings
from ftconsole.scheduler.spec.jobspec import JobSpec

NOW = 10_000.0


def job(idle: Any = "60s") -> Job:
    spec = JobSpec.model_validate({"name": "alloc", "command": "sleep infinity", "idle_timeout": idle})
    return Job(id=5, name="alloc", owner="cy", uid=1000, spec=spec, status=JobStatus.RUNNING, priority="normal",
               project="default", access="none", submitted=0.0, started=NOW - 1000, attempt=1)  # fmt: skip


RUN = Run(5, 1, 0, "n1", (0,), "/runs/5/1/0", True, "running", started=NOW - 1000)


class Tx:
    def __init__(self, said: list[tuple[str, Any]]) -> None:
        self.said = said

    def __getattr__(self, name: str) -> Any:
        async def record(*args: Any, **kwargs: Any) -> None:
            self.said.append((name, (args, kwargs)))

        return record


class Fakes:
    """The store, the probes' samples and the nodes' shells idle reclaim reads, as given; what it wrote."""

    def __init__(self, util: list[tuple[float, float]], typed: list[float], steps: Sequence[JobStep] = ()) -> None:
        self.util, self.typed, self.step_list = util, typed, list(steps)
        self.blind = False
        self.said: list[tuple[str, Any]] = []
        self.warned: list[str | None] = []
        self.config = types.SimpleNamespace(scheduler=SchedulerSettings(idle_warning=20.0))
        self.nodes = {"n1": object()}

    @contextlib.asynccontextmanager
    async def jobs_tx(self, what: str) -> AsyncIterator[Tx]:
        yield Tx(self.said)

    async def gpu_samples(self) -> GpuSamples:
        samples = GpuSamples()  # the probes' samples, as the scheduler keeps them
        for when, util in self.util:
            samples.add("n1", when, {"gpus": [{"index": 0, "utilization": util}]})
        return samples

    async def running_steps(self) -> list[JobStep]:
        return [s for s in self.step_list if s.state == "running"]

    async def step_ends(self, jobs: list[int]) -> dict[int, float]:
        ends = [s.ended for s in self.step_list if s.job in jobs and s.ended is not None]
        return {5: max(ends)} if ends else {}

    async def shells_on(self, job: Job, node: str, *, warn: str | None = None) -> dict[str, float] | None:
        self.warned.append(warn)
        if self.blind:
            return None
        return {f"/dev/pts/{i}": t for i, t in enumerate(self.typed)}

    def kinds(self) -> list[str]:
        return [name for name, _ in self.said]


async def judged(fakes: Fakes, the_job: Job | None = None) -> Fakes:
    idle = IdleReclaim(fakes, fakes, fakes, lambda: NOW)  # type: ignore[arg-type]
    await idle.check([the_job or job()], [RUN])
    return fakes


async def test_a_gpu_at_work_lately_keeps_it_and_no_node_is_asked() -> None:
    fakes = await judged(Fakes(util=[(NOW - 100, 0.0), (NOW - 10, 55.0), (NOW - 5, 3.0)], typed=[]))
    assert fakes.said == [] and fakes.warned == []


async def test_idle_but_for_the_warning_window_it_is_warned_in_its_shells() -> None:
    fakes = await judged(Fakes(util=[(NOW - 45, 80.0), (NOW - 5, 0.0)], typed=[NOW - 500]))
    assert fakes.warned[0] is None and fakes.warned[1] is not None and "has been idle since" in fakes.warned[1]
    assert fakes.kinds() == ["event", "alert"]
    assert fakes.said[1][1][0][1] == IDLE_ALERT


async def test_a_node_that_cannot_tell_its_shells_keeps_it_and_says_so_once() -> None:
    fakes = Fakes(util=[(NOW - 500, 80.0)], typed=[])
    fakes.blind = True
    idle = IdleReclaim(fakes, fakes, fakes, lambda: NOW)  # type: ignore[arg-type]
    await idle.check([job()], [RUN])
    await idle.check([job()], [RUN])
    assert fakes.kinds() == ["event"] and "cannot see whether anyone types" in fakes.said[0][1][0][2]


async def test_typing_in_a_shell_keeps_it() -> None:
    fakes = await judged(Fakes(util=[(NOW - 500, 80.0)], typed=[NOW - 900, NOW - 3]))
    assert fakes.warned == [None] and fakes.said == []


async def test_idle_past_its_idle_timeout_it_is_stopped_as_idle() -> None:
    fakes = await judged(Fakes(util=[(NOW - 61, 50.0), (NOW - 30, 9.0)], typed=[]))
    (update,) = [call for name, call in fakes.said if name == "update_job"]
    assert update[1]["stop_reason"] is StopReason.IDLE and "idle for 61s" in update[1]["message"]


async def test_a_running_step_keeps_it_and_a_steps_end_counts_as_work() -> None:
    running = JobStep(5, 1, 1, ("x",), "single", (("n1", (0,)),), "cy", NOW - 900)
    fakes = await judged(Fakes(util=[], typed=[], steps=[running]))
    assert fakes.said == [] and fakes.warned == []
    ended = JobStep(5, 1, 1, ("x",), "single", (("n1", (0,)),), "cy", NOW - 900, ended=NOW - 30, state="succeeded")
    fakes = await judged(Fakes(util=[], typed=[], steps=[ended]))
    assert fakes.said == [] and fakes.warned == []


async def test_off_and_no_timeout_are_never_judged() -> None:
    for idle in ("off", None):
        fakes = await judged(Fakes(util=[], typed=[]), job(idle))
        assert fakes.said == [] and fakes.warned == []


def rules(**settings: Any) -> Rules:
    config = types.SimpleNamespace(scheduler=SchedulerSettings(**settings), admins=[])
    service = types.SimpleNamespace(store=None, config=config, all_nodes=[])
    return Rules(service, placer=None)  # type: ignore[arg-type]


def test_an_allocation_gets_the_clusters_idle_rules() -> None:
    spec = job(None).spec
    assert rules().allocation(spec).idle_timeout is None  # none set: never idle
    assert rules(idle_timeout="2h").allocation(spec).idle_timeout == 7200
    assert rules(max_idle_timeout="8h").allocation(spec).idle_timeout == 28800
    assert rules(idle_timeout="1h", max_idle_timeout="8h").allocation(job("30m").spec).idle_timeout == 1800
    with pytest.raises(UsageError, match="idle_timeout off, and this cluster ends idle allocations after at most 8h"):
        rules(max_idle_timeout="8h").allocation(job("off").spec)
    with pytest.raises(UsageError, match=r"idle_timeout 9h is over this cluster's scheduler.max_idle_timeout \(8h\)"):
        rules(max_idle_timeout="8h")._idle_allowed(job("9h").spec)
    rules()._idle_allowed(job("9h").spec)  # no bound
    with pytest.raises(ValueError, match=r"idle_timeout \(9h\) is over max_idle_timeout \(8h\)"):
        SchedulerSettings(idle_timeout="9h", max_idle_timeout="8h")
