"""Steps (`ftconsole run JOB -- CMD`, as Slurm's `srun` inside an allocation): which of a running job's nodes and
GPUs a step gets, and what each of its ranks runs. Pure: no I/O.

A step runs on nodes of the job's current attempt, in rank order, as the job's user, in each node's run folder of
the job with the run's env (env.json) and over it the step's own: the launch mode's variables for the step's nodes
and GPUs (`plan_launch`: MASTER_ADDR of its first node, a MASTER_PORT free there, WORLD_SIZE, RANK, SLOTS,
CUDA_VISIBLE_DEVICES), FT_STEP, and its hostfile (and DeepSpeed's env file) in the step's folder `steps/N` of the
run folder. FT_JOB_ID and FT_ATTEMPT stay the job's: what a step leaves running ends with the job's run.

GPUs: a step gets `gpus_per_node` of each node's GPUs (default: all the job gave the node), among those no other
running step holds, so that steps side by side never share a GPU; a step that finds too few waits until a step
ends, as srun's "step creation temporarily disabled" does. `overlap` (srun's `--overlap`): the step takes GPUs
whether other steps hold them or not, and holds none from the others.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.jobplan import array_env
from ftconsole.scheduler.decide.jobs import Job, Run
from ftconsole.scheduler.decide.launch_inputs import LaunchInput
from ftconsole.scheduler.decide.launcher import MODES, NodeAssignment, plan_launch
from ftconsole.scheduler.errors import UsageError

STEP_STATES = ("running", "succeeded", "failed", "cancelled", "lost")
STEPS_DIR = "steps"  # a step's folder in each run folder: steps/N
# the run's own, which its env.json gives the step as to the job (the step's would name a folder of the step's)
_THE_JOBS = frozenset({"FT_OUTPUT_DIR"})
_ROOT = "/@ftconsole-step@"  # where plan_launch is told the runs are, replaced by each step folder after


@dataclass(frozen=True)
class JobStep:
    """A step as the store keeps it: the GPUs of each of its nodes, in rank order, and how it ended."""

    job: int
    number: int
    attempt: int
    argv: tuple[str, ...]
    mode: str
    ranks: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPUs), rank order
    run_by: str
    started: float
    ended: float | None = None
    state: str = "running"
    exit_code: int | None = None
    message: str = ""
    overlap: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "attempt": self.attempt,
            "argv": list(self.argv),
            "mode": self.mode,
            "ranks": [{"node": node, "gpus": list(gpus)} for node, gpus in self.ranks],
            "run_by": self.run_by,
            "started": self.started,
            "ended": self.ended,
            "state": self.state,
            "exit_code": self.exit_code,
            "message": self.message,
            "overlap": self.overlap,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobStep:
        ranks = tuple((str(r["node"]), tuple(int(g) for g in r["gpus"])) for r in json.loads(row["ranks"]))
        return cls(
            job=int(row["job"]),
            number=int(row["number"]),
            attempt=int(row["attempt"]),
            argv=tuple(json.loads(row["argv"])),
            mode=str(row["mode"]),
            ranks=ranks,
            run_by=str(row["run_by"]),
            started=float(row["started"]),
            ended=row["ended"],
            state=str(row["state"]),
            exit_code=row["exit_code"],
            message=str(row["message"]),
            overlap=bool(row["overlap"]),
        )


@dataclass(frozen=True)
class StepAsk:
    """What `ftconsole run` asks for: the command, its launch mode, on how many of the job's nodes (None: all, or
    the first in mode single), with how many GPUs on each (None: all the job has there)."""

    argv: tuple[str, ...]
    mode: str = "single"
    nodes: int | None = None
    gpus_per_node: int | None = None
    overlap: bool = False

    def wanted(self, runs: Sequence[Run]) -> int:
        if self.nodes is not None:
            return self.nodes
        return 1 if self.mode == "single" else len(runs)

    def check(self, job: Job, runs: Sequence[Run]) -> None:
        """UsageError for what this job can never give (the command, the mode, more nodes or GPUs than it has)."""
        if not self.argv or not self.argv[0]:
            raise UsageError("a step needs a command: ftconsole run JOB -- COMMAND [ARGS...]")
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; one of: {', '.join(MODES)}")
        if job.spec.image is not None:
            raise UsageError(f"job {job.ref} runs in containers of {job.spec.image}: steps run on the nodes themselves "
                             "and are not run in a job with an image")  # fmt: skip
        wanted = self.wanted(runs)
        if wanted < 1 or wanted > len(runs):
            raise UsageError(f"job {job.ref} has {len(runs)} node(s): a step runs on 1 to {len(runs)}, not {wanted}")
        if self.mode == "single" and wanted != 1:
            raise UsageError(f"mode single runs on one node, and this step is for {wanted}: give --nodes 1 or a mode "
                             "that runs on several (pytorch, horovod, mpich...)")  # fmt: skip
        most = max(len(r.gpus) for r in runs)
        if self.gpus_per_node is not None and not 0 <= self.gpus_per_node <= most:
            raise UsageError(f"job {job.ref} has at most {most} GPU(s) on a node: a step takes 0 to {most} on each, "
                             f"not {self.gpus_per_node}")  # fmt: skip


def busy_gpus(steps: Iterable[JobStep]) -> dict[str, set[int]]:
    """node -> the GPUs the running steps hold there (an overlapping step holds none)."""
    busy: dict[str, set[int]] = {}
    for step in steps:
        if step.state == "running" and not step.overlap:
            for node, gpus in step.ranks:
                busy.setdefault(node, set()).update(gpus)
    return busy


def pick(ask: StepAsk, runs: Sequence[Run], busy: Mapping[str, set[int]]) -> list[tuple[Run, tuple[int, ...]]] | str:
    """The step's ranks: the first nodes (in rank order) where enough of the job's GPUs are free, with the lowest
    free ones; or why not now (a reason to wait: steps hold the GPUs)."""
    wanted = ask.wanted(runs)
    picked: list[tuple[Run, tuple[int, ...]]] = []
    for run in sorted(runs, key=lambda r: r.rank):
        count = len(run.gpus) if ask.gpus_per_node is None else ask.gpus_per_node
        free = sorted(run.gpus) if ask.overlap else sorted(set(run.gpus) - busy.get(run.node, set()))
        if count <= len(free):
            picked.append((run, tuple(free[:count])))
        if len(picked) == wanted:
            return picked
    how = "all their GPUs" if ask.gpus_per_node is None else f"{ask.gpus_per_node} GPU(s) each"
    return f"waiting for {wanted} node(s) with {how} free: running steps hold them"


@dataclass(frozen=True)
class StepRank:
    """What one rank of a step runs: in the job's run folder on `node` (its env.json loaded), `argv` with `env` over
    it, in `workdir`, after writing `files` into `step_dir`; `launch` False: nothing starts there (a launcher on the
    step's first node starts it)."""

    node: str
    rank: int
    run_dir: str
    step_dir: str
    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, str]
    launch: bool
    workdir: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"argv": list(self.argv)}


def plan_step(
    job: Job,
    number: int,
    ask: StepAsk,
    picked: Sequence[tuple[Run, tuple[int, ...]]],
    *,
    hosts: Mapping[str, str],
    master_port: int,
) -> tuple[StepRank, ...]:
    """Each rank of step `number` of `job` on the `picked` runs and GPUs (`pick`), their nodes reached at `hosts`."""
    spec = job.spec
    attempt = picked[0][0].attempt
    inp = LaunchInput(
        job_id=str(job.id),
        attempt=attempt,
        mode=ask.mode,
        argv=ask.argv,
        env=dict(spec.env) | array_env(job),
        workdir=spec.workdir,
        nodes=tuple(NodeAssignment(run.node, hosts[run.node], gpus) for run, gpus in picked),
        master_port=master_port,
        run_root=_ROOT,
        ps_count=(spec.ps_count or 0) if ask.mode == "tensorflow" else 0,
        hydra_iface=spec.launcher.hydra_iface if spec.launcher and ask.mode == "mpich" else None,
    )
    out = []
    for planned, (run, _) in zip(plan_launch(inp).ranks, picked, strict=True):
        step_dir = f"{run.run_dir}/{STEPS_DIR}/{number}"

        def moved(text: str, planned_dir: str = planned.run_dir, step_dir: str = step_dir) -> str:
            return text.replace(planned_dir, step_dir)

        out.append(
            StepRank(
                node=run.node,
                rank=planned.rank,
                run_dir=run.run_dir,
                step_dir=step_dir,
                argv=tuple(moved(a) for a in planned.argv),
                env={k: moved(v) for k, v in planned.env.items() if k not in _THE_JOBS} | {"FT_STEP": str(number)},
                files={name: data.decode("utf-8", "replace") for name, data in planned.files.items()},
                launch=planned.launch,
                workdir=planned.workdir,
            )
        )
    return tuple(out)
