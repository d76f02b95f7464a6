"""What each rank of a job runs, in order: its command, or a batch job's tasks, between the hooks (pure).

`plan_attempt` plans one attempt of a stored job on its nodes; `plan_job` is the spec's part of it."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.jobs import Attempt, Job, Run
from ftconsole.scheduler.decide.launcher import (
    TORCH_HOOK,
    LaunchError,
    LaunchInput,
    LaunchPlan,
    NodeAssignment,
    RankLaunch,
    TaskRef,
    plan_launch,
)
from ftconsole.scheduler.decide.steps import Step, StepKind, user_root
from ftconsole.scheduler.node.bundle import python_stdin_script, script
from ftconsole.scheduler.spec import arrayspec
from ftconsole.scheduler.spec.config import DataPrepSettings, Node
from ftconsole.scheduler.spec.containers import ContainerSettings, RuntimeChoice, container_name, container_step
from ftconsole.scheduler.spec.dataprep import DATA_STEP, node_params
from ftconsole.scheduler.spec.jobspec import Hooks, JobSpec, Task

PULL_STEP = "pull image"
HYBRID_SCRIPT = "container.py"  # in the attempt's folder of every node: scheduler/node/container_exec.py, bundled
# runs HYBRID_SCRIPT, named relative to the home folder (or absolute), with the MPI process's program after it
HYBRID_LOADER = (
    "import os,runpy,sys;sys.argv=sys.argv[1:];sys.argv[0]=os.path.join(os.path.expanduser('~'),sys.argv[0]);"
    "runpy.run_path(sys.argv[0],run_name='__main__')"
)


@dataclass(frozen=True)
class Images:
    """How a job with `image` runs on its nodes: each node's runtime, the cluster's settings, the attempt's
    token (it names the containers)."""

    runtimes: dict[str, RuntimeChoice]
    settings: ContainerSettings
    token: str
    python: str = "python3"  # the nodes' interpreter (ssh.python): it runs HYBRID_SCRIPT under mpirun


@dataclass(frozen=True)
class JobLaunch:
    """A job's launch: the plan of its command (a batch job's first task) and, per launching rank, its steps."""

    plan: LaunchPlan
    steps: dict[int, tuple[Step, ...]]

    @property
    def launching(self) -> tuple[RankLaunch, ...]:
        return self.plan.launching


def plan_job(
    spec: JobSpec, base: LaunchInput, *, data_prep: DataPrepSettings | None = None, images: Images | None = None
) -> JobLaunch:
    """What each rank of a job runs, in order (pure; `base` is the attempt's launch input without a command).

    A regular job runs its command. A batch job runs its tasks one after another, each planned by
    `plan_launch` with its own argv (so each gets the mode's wrapping), with FT_OUTPUT_DIR the task's
    sub-folder of the job's output folder, FT_TASK (its name) and FT_TASK_INDEX (0-based); a task that fails
    ends the sequence. Each rank runs its own sequence: only a distributed launcher's rendezvous (torchrun,
    mpirun) lines tasks up across nodes. A rank launches when any task launches there (pytorch-deepspeed
    starts the other nodes itself only for `deepspeed` commands), and runs only the tasks that launch there.
    `hooks.before` and `hooks.after` run as `sh -c TEXT` on rank 0 only, around its command or tasks, with its
    env (FT_OUTPUT_DIR the job's output folder); the other ranks wait for nothing and start at once.
    With `data_prep`, every rank first copies the job's data sets to its node's local storage (step kind
    "data": `scheduler/node/datacopy.py` as ``python3 -c SOURCE PARAMS``, with the cluster's `data_prep` settings,
    which decide what is cleaned up; without them nothing is), before the SSH check and the hooks: a rank that
    launches nothing would get no copy, so such a plan is refused (the spec's checks refuse it at submit).
    With `image` and `images`, every rank first pulls the image (step kind "pull", PULL_STEP), and its command
    or tasks run in a container of it (`Step.container`, one container per task); the hooks and the data copy
    run on the node. Where the first node's launcher starts every rank itself (horovod, mpich on several
    nodes), the launcher runs on the host and starts each MPI process through HYBRID_SCRIPT (`_hybrid`: the
    MPI hybrid model). Without `images` (placement's look at which ranks launch) nothing is wrapped.
    """
    tasks = spec.tasks or []
    if tasks:
        plans = [_task_plan(base, task, i) for i, task in enumerate(tasks)]
    else:
        plans = [plan_launch(dataclasses.replace(base, argv=tuple(spec.argv())))]
    launching = {r.rank for p in plans for r in p.launching}
    if spec.image is not None and images is not None and len(launching) < len(plans[0].ranks):
        base, script = _hybrid(spec, base, plans[0], images)
        return _with_files(plan_job(spec, base, data_prep=data_prep, images=None), script, images, spec, base)
    check = next((p.ssh_check for p in plans if p.ssh_check is not None), None)
    steps: dict[int, tuple[Step, ...]] = {}
    if spec.data_prep and len(launching) < len(plans[0].ranks):
        raise LaunchError(f"job {spec.name}: data_prep needs every node to run its rank, and in mode {spec.mode} "
                          "the first node starts the others' itself")  # fmt: skip
    for rank in sorted(launching):
        main = [_main_step(tasks, i, r) for i, r in enumerate(p.ranks[rank] for p in plans) if r.launch]
        hooks = spec.hooks if rank == 0 else Hooks()
        first = (Step(StepKind.BEFORE, "ssh check", check, _first_env(base)),) if rank == 0 and check else ()
        before = _hook(base, StepKind.BEFORE, hooks.before)
        data = _data_step(spec, plans[0].ranks[rank].run_dir, data_prep)
        pull: tuple[Step, ...] = ()
        if spec.image is not None and images is not None:
            pull, main = _in_containers(spec, base, rank, main, plans[0].ranks[rank], images)
        steps[rank] = (*pull, *data, *first, *before, *main, *_hook(base, StepKind.AFTER, hooks.after))
    ranks = tuple(
        dataclasses.replace(
            r, launch=r.rank in launching, files={k: v for p in plans for k, v in p.ranks[r.rank].files.items()}
        )
        for r in plans[0].ranks
    )
    return JobLaunch(LaunchPlan(ranks, check), steps)


def _data_step(spec: JobSpec, run_dir: str, settings: DataPrepSettings | None) -> tuple[Step, ...]:
    """The rank's data preparation (none without `data_prep`); the supervisor runs it with its own interpreter."""
    if not spec.data_prep:
        return ()
    argv = ("python3", "-c", script("datacopy"), node_params(spec.data_prep, run_dir, settings))
    return (Step(StepKind.DATA, DATA_STEP, argv, {}),)


def _in_containers(
    spec: JobSpec, base: LaunchInput, rank: int, main: list[Step], launch: RankLaunch, images: Images
) -> tuple[tuple[Step, ...], list[Step]]:
    """The rank's pull step, and its command or tasks each in a container of the job's image."""
    assert spec.image is not None
    node = base.nodes[rank]
    choice = images.runtimes[node.name]
    shares = _shares(spec, base, launch.run_dir)

    def container(task: int | None) -> dict[str, Any]:
        return container_step(choice, image=spec.image or "", name=container_name(images.token, rank, task),
                              gpus=node.gpus, mounts=spec.mounts or (), shares=shares,
                              settings=images.settings)  # fmt: skip

    # FT_CONTAINER: how `ftconsole debug` finds the processes of the container, which are not the step's
    pull = Step(StepKind.PULL, PULL_STEP, (), {}, container=container(None))
    return (pull,), [
        dataclasses.replace(m, container=container(m.index),
                            env={**m.env, "FT_CONTAINER": container_name(images.token, rank, m.index)})
        for m in main
    ]  # fmt: skip


def _hybrid(spec: JobSpec, base: LaunchInput, plan: LaunchPlan, images: Images) -> tuple[LaunchInput, dict[str, bytes]]:
    """The MPI hybrid model (scheduler/node/container_exec.py): mpirun on the first node's host starts every MPI
    process through HYBRID_SCRIPT, which runs it in its node's container. The input with that wrapper, and the
    script every node gets in its attempt folder (one document for all nodes: each process finds its own)."""
    assert spec.image is not None
    nodes, first = [], 0
    for rank, node in zip(plan.ranks, base.nodes, strict=True):
        shares = _shares(spec, base, rank.run_dir)
        container = container_step(images.runtimes[node.name], image=spec.image, name="", gpus=node.gpus,
                                   mounts=spec.mounts or (), shares=shares, settings=images.settings)  # fmt: skip
        nodes.append({"rank": rank.rank, "first": first, "slots": node.slots, "container": container})
        first += node.slots
    doc: dict[str, object] = {"token": images.token, "image": spec.image, "nodes": nodes}
    attempt_dir = posixpath.dirname(plan.ranks[0].run_dir.rstrip("/"))
    program = posixpath.join(attempt_dir.removeprefix("~/") if attempt_dir.startswith("~/") else attempt_dir,
                             HYBRID_SCRIPT)  # fmt: skip
    wrapper = (images.python, "-c", HYBRID_LOADER, program)
    text = python_stdin_script(script("container_exec"), doc)  # every node's copy: each process finds its own
    return dataclasses.replace(base, rank_wrapper=wrapper), {f"../{HYBRID_SCRIPT}": text.encode()}


def _with_files(
    launch: JobLaunch, files: dict[str, bytes], images: Images, spec: JobSpec, base: LaunchInput
) -> JobLaunch:
    """A hybrid launch: every rank writes HYBRID_SCRIPT, and the first node pulls the image before mpirun starts
    (the other nodes pull in HYBRID_SCRIPT, where they lack it)."""
    ranks = tuple(dataclasses.replace(r, files={**r.files, **files}) for r in launch.plan.ranks)
    steps = {}
    for rank, rank_steps in launch.steps.items():
        choice = images.runtimes[base.nodes[rank].name]
        name, gpus = container_name(images.token, rank), base.nodes[rank].gpus
        container = container_step(choice, image=spec.image or "", name=name, gpus=gpus, mounts=(), shares=(),
                                   settings=images.settings)  # fmt: skip
        steps[rank] = (Step(StepKind.PULL, PULL_STEP, (), {}, container=container), *rank_steps)
    return JobLaunch(LaunchPlan(ranks, launch.plan.ssh_check), steps)


def _shares(spec: JobSpec, base: LaunchInput, run_dir: str) -> list[str]:
    """The node's folders a rank's container sees at their own paths: the workdir, the run folder, the output
    and checkpoint folders, data_prep's copies."""
    shares = [spec.workdir, run_dir, spec.output or "", base.checkpoint_dir or ""]
    if base.torch_trace:  # torch's trace hook, in the attempt's folder (launcher.TORCH_HOOK)
        shares.append(posixpath.dirname(posixpath.normpath(f"{run_dir}/{TORCH_HOOK}")))
    return shares + [d.to for d in spec.data_prep or ()]


def _main_step(tasks: Sequence[Task], index: int, rank: RankLaunch) -> Step:
    runner = bool(rank.argv) and posixpath.basename(rank.argv[0]) == "deepspeed"  # DeepSpeed's runner: Step.leader_kill
    if not tasks:
        return Step(StepKind.COMMAND, "command", rank.argv, rank.env, leader_kill=runner)
    return Step(StepKind.TASK, tasks[index].name, rank.argv, rank.env, index, len(tasks), leader_kill=runner)


def _task_plan(base: LaunchInput, task: Task, index: int) -> LaunchPlan:
    """One task planned with its argv: FT_TASK, FT_TASK_INDEX, FT_OUTPUT_DIR its sub-folder of the output."""
    return plan_launch(dataclasses.replace(base, argv=tuple(task.argv()), task=TaskRef(task.name, index, task.output)))


def _hook(base: LaunchInput, kind: StepKind, text: str | None) -> tuple[Step, ...]:
    """A hook for rank 0: the user's script line run by sh (never spliced into anything), with rank 0's env."""
    if text is None:
        return ()
    return (Step(kind, f"{kind.value} hook", ("sh", "-c", text), _first_env(base)),)


def _first_env(base: LaunchInput) -> dict[str, str]:
    """Rank 0's env outside its command (hooks, the SSH check): FT_OUTPUT_DIR the job's output folder."""
    return plan_launch(dataclasses.replace(base, argv=("sh",))).ranks[0].env


def plan_attempt(
    job: Job,
    attempt: Attempt,
    runs: Sequence[Run],
    *,
    nodes: dict[str, Node],
    run_root: str,
    data_prep: DataPrepSettings | None = None,
    images: Images | None = None,
) -> JobLaunch:
    """What each rank of an attempt runs (pure: `plan_job` with the attempt's nodes, port and run folders, under
    the run root of the job's owner; `data_prep`: the cluster's roots and retention, for a job's data step)."""
    ordered = sorted(runs, key=lambda r: r.rank)
    spec = job.spec
    base = LaunchInput(
        job_id=str(job.id),
        attempt=attempt.number,
        mode=spec.mode.value,
        argv=(),
        env=dict(spec.env) | array_env(job),
        workdir=spec.workdir,
        nodes=tuple(NodeAssignment(r.node, nodes[r.node].host, r.gpus) for r in ordered),
        master_port=attempt.master_port,
        run_root=user_root(run_root, job.owner),
        ps_count=spec.ps_count or 0,
        hydra_iface=spec.launcher.hydra_iface if spec.launcher else None,
        torchrun_max_restarts=spec.launcher.torchrun_max_restarts if spec.launcher else None,
        torchrun_monitor_interval=spec.launcher.torchrun_monitor_interval if spec.launcher else None,
        output_dir=output_dir(job),
        checkpoint_dir=checkpoint_dir(job, run_root),
        torch_trace=spec.torch_trace,
    )
    return plan_job(spec, base, data_prep=data_prep, images=images)


def array_env(job: Job) -> dict[str, str]:
    """A task of an array: FT_ARRAY_ID (its array, the id of its first task), FT_ARRAY_INDEX, FT_ARRAY_COUNT."""
    if job.array_id is None or job.array_index is None or job.spec.array is None:
        return {}
    count = len(arrayspec.parse(job.spec.array).indexes)
    return {"FT_ARRAY_ID": str(job.array_id), "FT_ARRAY_INDEX": str(job.array_index), "FT_ARRAY_COUNT": str(count)}


def output_dir(job: Job) -> str | None:
    """The job's `output` folder (FT_OUTPUT_DIR); a task of an array has its own sub-folder, named by its index."""
    if job.spec.output is None or job.array_index is None:
        return job.spec.output
    return posixpath.join(job.spec.output, str(job.array_index))


def checkpoint_dir(job: Job, run_root: str) -> str:
    """FT_CHECKPOINT_DIR: the same in every attempt of a job. `checkpoint_resume.dir`, else `<output>/checkpoints`
    (shared storage, where the job names one), else `~/.ftconsole/checkpoints/<cluster id>/<job>` in the home
    of the job's user on each node (run folders are per attempt and pruned; this folder is not). `run_root`
    ends with the cluster id (`Executor.run_root`)."""
    resume = job.spec.fault_tolerance.checkpoint_resume
    if resume is not None and resume.dir is not None:
        return resume.dir
    output = output_dir(job)
    if output is not None:
        return posixpath.join(output, "checkpoints")
    return f"~/.ftconsole/checkpoints/{posixpath.basename(run_root.rstrip('/'))}/{job.id}"
