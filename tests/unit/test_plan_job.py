"""`scheduler.jobplan.plan_job`: what each rank runs, in order (command or batch tasks, hooks on rank 0)."""

from __future__ import annotations

from typing import Any

import pytest

from ftconsole.scheduler.decide.jobplan import JobLaunch, plan_attempt, plan_job
from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.decide.launcher import LaunchInput, NodeAssignment
from ftconsole.scheduler.decide.steps import Step, StepKind
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.spec.jobspec import JobSpec

TASKS = [
    {"name": "prep", "command": "python3 prep.py", "output": "prep"},
    {"name": "train", "command": "deepspeed train.py", "output": "out/train"},
]
HOOKS = {"before": 'mkdir -p /scratch/$FT_JOB_ID && echo "it\'s $(date)" > x', "after": "rm -rf /scratch/$FT_JOB_ID"}


def base(mode: str, count: int, output: str | None = None) -> LaunchInput:
    nodes = tuple(NodeAssignment(f"n{i}", f"10.0.0.{i}", (0, 1)) for i in range(count))
    return LaunchInput(
        job_id="7", attempt=1, mode=mode, argv=(), env={"MY": "1"}, workdir="~", nodes=nodes, master_port=29500,
        run_root="/r", output_dir=output,
    )  # fmt: skip


def spec(mode: str, count: int, **fields: Any) -> JobSpec:
    command = {} if "tasks" in fields else {"command": "python3 train.py"}
    return JobSpec.from_json({"name": "j", "mode": mode, "nodes": count, **command, **fields})


def summary(step: Step) -> str:
    """kind:name:FT_OUTPUT_DIR[:FT_TASK,FT_TASK_INDEX] of one step (/r/7/1/ left out)."""
    task = f":{step.env['FT_TASK']},{step.env['FT_TASK_INDEX']}" if "FT_TASK" in step.env else ""
    return f"{step.kind.value}:{step.name}:{step.env['FT_OUTPUT_DIR'].removeprefix('/r/7/1/')}{task}"


CASES = [
    ("command", "pytorch", 2, {}, None, {0: ["command:command:0/output"], 1: ["command:command:1/output"]}),
    (
        "command with hooks: rank 0 only",
        "pytorch",
        2,
        {"hooks": HOOKS},
        None,
        {
            0: ["before:before hook:0/output", "command:command:0/output", "after:after hook:0/output"],
            1: ["command:command:1/output"],
        },
    ),
    (
        "batch: every task, its own sub-folder",
        "single",
        1,
        {"type": "batch", "tasks": TASKS},
        None,
        {0: ["task:prep:0/output/prep:prep,0", "task:train:0/output/out/train:train,1"]},
    ),
    (
        "batch with an output folder and an after hook",
        "single",
        1,
        {"type": "batch", "tasks": TASKS, "hooks": {"after": "true"}},
        "/data/exp",
        {
            0: [
                "task:prep:/data/exp/prep:prep,0",
                "task:train:/data/exp/out/train:train,1",
                "after:after hook:/data/exp",
            ]
        },
    ),
    (
        "batch under mpirun: rank 0 launches alone, after the SSH check",
        "horovod",
        2,
        {"type": "batch", "tasks": TASKS},
        None,
        {0: ["before:ssh check:0/output", "task:prep:0/output/prep:prep,0", "task:train:0/output/out/train:train,1"]},
    ),
    (
        "batch under deepspeed: a rank runs only the tasks that launch on it",
        "pytorch-deepspeed",
        2,
        {"type": "batch", "tasks": TASKS},
        None,
        {
            0: ["before:ssh check:0/output", "task:prep:0/output/prep:prep,0", "task:train:0/output/out/train:train,1"],
            1: ["task:prep:1/output/prep:prep,0"],
        },
    ),
    (
        "mpirun with hooks: the SSH check comes first",
        "mpich",
        3,
        {"hooks": HOOKS},
        None,
        {
            0: [
                "before:ssh check:0/output",
                "before:before hook:0/output",
                "command:command:0/output",
                "after:after hook:0/output",
            ]
        },
    ),
    ("mpirun on one node: nothing to check", "horovod", 1, {}, None, {0: ["command:command:0/output"]}),
]


@pytest.mark.parametrize(
    ("mode", "count", "fields", "output", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_steps_per_rank(mode: str, count: int, fields: dict[str, Any], output: str | None, expected: Any) -> None:
    launch = plan_job(spec(mode, count, **fields), base(mode, count, output))
    assert {rank: [summary(s) for s in steps] for rank, steps in launch.steps.items()} == expected
    assert [r.rank for r in launch.launching] == sorted(expected)
    assert len(launch.plan.ranks) == count


def test_each_task_is_planned_for_the_mode_and_the_hooks_are_the_users_own_script() -> None:
    launch = plan_job(spec("pytorch", 2, type="batch", tasks=TASKS, hooks=HOOKS), base("pytorch", 2))
    before, prep, train, after = launch.steps[0]
    assert prep.argv[:3] == ("python3", "-m", "torch.distributed.run") and "--node_rank=0" in prep.argv
    assert train.argv == ("deepspeed", "train.py")  # pytorch mode leaves other launchers alone
    assert (prep.index, prep.count, train.index) == (0, 2, 1)
    assert before.argv == ("sh", "-c", HOOKS["before"]) and after.argv == ("sh", "-c", HOOKS["after"])
    assert before.env["RANK"] == "0" and before.env["MY"] == "1" and "FT_TASK" not in before.env
    assert "--node_rank=1" in launch.steps[1][0].argv and [s.name for s in launch.steps[1]] == ["prep", "train"]
    # the plan of the first task stands for the job (argv.json, env.json, files, which ranks launch)
    assert launch.plan.ranks[0].argv == prep.argv and launch.plan.ranks[0].env == prep.env


def test_mpirun_exports_the_task_variables() -> None:
    launch = plan_job(spec("horovod", 2, type="batch", tasks=TASKS), base("horovod", 2))
    argv = launch.steps[0][1].argv
    assert argv[0] == "mpirun" and argv[-2:] == ("python3", "prep.py")
    assert {"FT_TASK", "FT_TASK_INDEX", "MY"} <= {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert [r.launch for r in launch.plan.ranks] == [True, False]


def test_ssh_check_step_runs_on_rank_0_with_its_env_and_names_every_peer() -> None:
    launch = plan_job(spec("mpich", 3), base("mpich", 3))
    check = launch.steps[0][0]
    assert (check.kind, check.name) == (StepKind.BEFORE, "ssh check")
    assert check.argv[:2] == ("python3", "-c") and check.argv[3:] == (
        "n0", "5", "", "MPICH's mpirun (hydra)", "n1", "10.0.0.1", "n2", "10.0.0.2",
    )  # fmt: skip
    assert check.env["MY"] == "1" and check.env["RANK"] == "0"
    assert launch.plan.ssh_check == check.argv


@pytest.mark.parametrize("mode", ["pytorch", "tensorflow", "pytorch-deepspeed"])
def test_no_ssh_check_where_every_node_runs_its_own_rank(mode: str) -> None:
    launch = plan_job(spec(mode, 2), base(mode, 2))  # python3 train.py: deepspeed mode runs it on every node
    assert launch.plan.ssh_check is None
    assert all(s.name != "ssh check" for steps in launch.steps.values() for s in steps)


def test_deepspeed_batch_task_gets_its_own_env_file_with_its_variables() -> None:
    launch = plan_job(spec("pytorch-deepspeed", 2, type="batch", tasks=TASKS), base("pytorch-deepspeed", 2))
    _check, _prep, train = launch.steps[0]
    assert train.env["DS_ENV_FILE"] == "/r/7/1/0/deepspeed_env.1"
    for rank in launch.plan.ranks:  # every rank's folder holds the files of every task
        assert set(rank.files) == {"hostfile", "deepspeed_env.1"}
    lines = launch.plan.ranks[0].files["deepspeed_env.1"].decode().splitlines()
    assert {"FT_TASK=train", "FT_TASK_INDEX=1", "FT_OUTPUT_DIR=/r/7/1/0/output/out/train", "MY=1"} <= set(lines)


@pytest.mark.parametrize(
    ("step", "doc"),
    [
        (
            Step(StepKind.COMMAND, "command", ("a", "b"), {"K": "v"}),
            {"kind": "command", "name": "command", "argv": ["a", "b"], "env": {"K": "v"}},
        ),
        (
            Step(StepKind.TASK, "t", ("a",), {}, 1, 3),
            {"kind": "task", "name": "t", "argv": ["a"], "env": {}, "index": 1, "count": 3},
        ),
    ],
)
def test_step_json(step: Step, doc: dict[str, Any]) -> None:
    assert step.to_json() == doc


# -- the spec's launcher: options, through the attempt's plan (`executor.plan_attempt`) ---------------------------

TORCH_FLAGS = ("--max_restarts", "--monitor_interval")


def attempt_plan(spec: JobSpec) -> JobLaunch:
    """`plan_attempt` of a spec's first attempt on n0, n1, ... (two GPUs each), as the scheduler plans it."""
    job = Job(7, spec.name, "ann", 1000, spec, JobStatus.RUNNING, "normal", "default", "none", 0.0)
    attempt = Attempt(7, 1, None, 2, 29500, 0.0)
    runs = [Run(7, 1, rank, f"n{rank}", (0, 1), f"/r/7/1/{rank}", True) for rank in range(spec.nodes)]
    nodes = {f"n{i}": Node(f"n{i}", f"10.0.0.{i}", None, None, "default") for i in range(spec.nodes)}
    return plan_attempt(job, attempt, runs, nodes=nodes, run_root="/r")


def torch_flags(launch: JobLaunch) -> list[list[str]]:
    """torchrun's restart options in each rank's command."""
    return [[a for a in r.argv if a.startswith(TORCH_FLAGS)] for r in launch.plan.ranks]


@pytest.mark.parametrize(
    ("launcher", "flags"),
    [
        ({"torchrun_max_restarts": 3}, ["--max_restarts=3"]),
        ({"torchrun_max_restarts": 0}, ["--max_restarts=0"]),
        ({"torchrun_monitor_interval": "250ms"}, ["--monitor_interval=0.25"]),
        ({"torchrun_monitor_interval": "1m"}, ["--monitor_interval=60"]),
        (
            {"torchrun_max_restarts": 2, "torchrun_monitor_interval": 5},
            ["--max_restarts=2", "--monitor_interval=5"],
        ),
        ({}, []),
        (None, []),
    ],
)
def test_launcher_keys_become_torchrun_flags(launcher: dict[str, Any] | None, flags: list[str]) -> None:
    fields = {} if launcher is None else {"launcher": launcher}
    launch = attempt_plan(spec("pytorch", 2, **fields))
    assert torch_flags(launch) == [flags, flags]
    argv = launch.plan.ranks[1].argv
    assert argv[:3] == ("python3", "-m", "torch.distributed.run") and argv[-1] == "train.py"
    assert argv[argv.index("--master_port=29500") + 1 : -1] == tuple(flags)  # before the script, after ours


@pytest.mark.parametrize("ft", [{"max_restarts": 3}, {"max_restarts": 2, "restart_exit_codes": [1, 137]}])
def test_fault_tolerance_max_restarts_is_the_schedulers_own_never_torchruns(ft: dict[str, Any]) -> None:
    """The scheduler restarts the attempt (reconcile's exit-code policy); torchrun restarting its workers on the
    same count first would restart a failing job twice over."""
    assert torch_flags(attempt_plan(spec("pytorch", 2, fault_tolerance=ft))) == [[], []]
    both = spec("pytorch", 2, fault_tolerance=ft, launcher={"torchrun_max_restarts": 1})
    assert torch_flags(attempt_plan(both)) == [["--max_restarts=1"]] * 2


def test_batch_tasks_that_torchrun_wraps_get_the_flags_and_the_others_run_as_given() -> None:
    tasks = [
        {"name": "prep", "command": "sh prep.sh", "output": "prep"},
        {"name": "train", "command": "python3 train.py", "output": "train"},
    ]
    launcher = {"torchrun_max_restarts": 1, "torchrun_monitor_interval": "2s"}
    launch = attempt_plan(spec("pytorch", 2, type="batch", tasks=tasks, launcher=launcher))
    for steps in launch.steps.values():
        prep, train = steps
        assert prep.argv == ("sh", "prep.sh")
        assert [a for a in train.argv if a.startswith(TORCH_FLAGS)] == ["--max_restarts=1", "--monitor_interval=2"]


@pytest.mark.parametrize(("launcher", "iface"), [({"hydra_iface": "ib0"}, "ib0"), ({}, None), (None, None)])
def test_hydra_iface_becomes_hydra_iface_on_every_rank(launcher: dict[str, Any] | None, iface: str | None) -> None:
    fields = {} if launcher is None else {"launcher": launcher}
    launch = attempt_plan(spec("mpich", 2, **fields))
    assert [r.env.get("HYDRA_IFACE") for r in launch.plan.ranks] == [iface, iface]
    assert launch.steps[0][-1].env.get("HYDRA_IFACE") == iface  # the command step rank 0 runs
    assert launch.plan.ranks[0].argv == ("mpirun", "-np", "4", "python3", "train.py")


def test_hydra_iface_of_the_jobs_env_still_reaches_the_ranks() -> None:
    """Before `launcher.hydra_iface`, env: was the way to pick hydra's interface (docs/jobs.md); it still is."""
    launch = attempt_plan(spec("mpich", 2, env={"HYDRA_IFACE": "lo"}))
    assert [r.env["HYDRA_IFACE"] for r in launch.plan.ranks] == ["lo", "lo"]


def test_a_stored_spec_from_before_the_launcher_section_plans_as_before() -> None:
    stored = {"name": "j", "mode": "pytorch", "nodes": 2, "command": "python3 train.py", "gpus_per_node": 2}
    old = JobSpec.from_stored({**stored, "fault_tolerance": {"max_restarts": 2}})
    assert old.launcher is None and "launcher" not in old.to_json()
    assert torch_flags(attempt_plan(old)) == [[], []]
