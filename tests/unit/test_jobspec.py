"""Job spec: command rules, every problem named by file, line and key path, the example job files."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ftconsole.scheduler.decide import launcher
from ftconsole.scheduler.decide.jobplan import plan_job
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.command import check_command
from ftconsole.scheduler.spec.jobspec import (
    LAUNCHER_MODES,
    GpuRequest,
    JobMode,
    JobSpec,
    JobType,
    Launcher,
    Priority,
    cross_problems,
    load_jobspec,
    parse_jobspec,
)

# -- commands ----------------------------------------------------------------------------------------------

ACCEPTED_COMMANDS = [
    "python3 train.py",
    "python train.py --lr 3e-4",
    "torchrun --nproc_per_node 8 train.py",
    "/opt/conda/bin/python -m trainer.main --config cfg.yaml",
    "./run.sh",
    'bash -c "a && b"',
    'bash -c "KEY=VALUE python3 train.py && python3 evaluate.py"',
    "python -c 'print(1|2)'",
    "python -c 'import sys; sys.exit(0)'",
    """python -c "print('a; b')" """,
    'echo "$(date)"',
    "echo '`uname`'",
    "echo 'a > b' \"c < d\"",
    r"echo \&\& \| \;",
    "echo a#b",
    "echo '#not-a-comment'",
    "python train.py --name=run1",
    "env KEY=VALUE python3 train.py",
    "python3 train.py --tag KEY=VALUE",
    "python3 train.py --data $DATA",
    "python3 train.py --glob 'data/*.bin'",
    "echo 'it''s'",
    "echo \"say 'hi' & leave\"",
    "  python3 train.py  \n",
    "mpirun -np 16 python3 train_hvd.py",
    "deepspeed --hostfile hostfile train.py",
]

REJECTED_COMMANDS = [
    ("", "empty"),
    ("   \n ", "empty"),
    ("KEY=VALUE python3 train.py", "set variables in env: instead"),
    ("A_1+=x python3 train.py", "set variables in env: instead"),
    ("python3 train.py && python3 evaluate.py", "found '&&' outside quotes"),
    ("a || b", "found '||' outside quotes"),
    ("a; b", "found ';' outside quotes"),
    ("a | tee log", "pipe '|'"),
    ("a |& tee log", "pipe '|&'"),
    ("python3 train.py &", "background"),
    ("python3 train.py > log", "redirection '>'"),
    ("python3 train.py >> log", "redirection '>>'"),
    ("python3 train.py < input", "redirection '<'"),
    ("python3 train.py 2> err", "redirection '2>'"),
    ("python3 train.py 2>&1", "redirection '2>&'"),
    ("python3 train.py &> log", "redirection '&>'"),
    ("echo `date`", "substitution '`'"),
    ("echo $(date)", "substitution '$('"),
    ("diff <(a) <(b)", "substitution '<('"),
    ("(cd x; python3 a.py)", "subshell"),
    ("python3 'train.py", "unclosed quote: the single quote"),
    ('python3 "train.py', "unclosed quote: the double quote"),
    ('bash -c "a && b\\"', "unclosed quote"),
    ("python3 train.py # run it", "comment"),
    ("python3 train.py\npython3 eval.py", "line break"),
    ("python3 train.py \\\n  --lr 3", "line continuation"),
    ("python3 train.py \\", "backslash"),
    ("cd /data && python3 a.py", "found '&&'"),
    ("cd /data", "set workdir: instead"),
    ("export A=1", "set variables in env: instead"),
    ("source env.sh", "shell builtin"),
    ("if true", "shell keyword"),
    ('"" python3', "empty word"),
]


@pytest.mark.parametrize("command", ACCEPTED_COMMANDS)
def test_accepted_commands(command: str) -> None:
    assert check_command(command) is None


@pytest.mark.parametrize(("command", "fragment"), REJECTED_COMMANDS)
def test_rejected_commands(command: str, fragment: str) -> None:
    problem = check_command(command)
    assert problem is not None
    assert fragment in problem


def test_rejected_command_suggests_bash_c() -> None:
    assert check_command("a && b") == "one statement only: found '&&' outside quotes; wrap it: bash -c \"a && b\""


@pytest.mark.parametrize("command", ["a && b", 'python -c "print(1)" | cat', "echo 'x' > \"y z\"", "a\\ b; c"])
def test_suggested_wrapping_splits_back_to_the_command(command: str) -> None:
    problem = check_command(command)
    assert problem is not None
    suggestion = problem.split("wrap it: ", 1)[1]
    assert shlex.split(suggestion) == ["bash", "-c", command]
    assert check_command(suggestion) is None


# -- valid specs -------------------------------------------------------------------------------------------


def test_minimal_spec_and_defaults() -> None:
    spec = parse_jobspec("name: j\ncommand: python3 train.py --lr 3e-4\n")
    assert spec.mode is JobMode.SINGLE
    assert spec.type is JobType.REGULAR
    assert spec.priority is Priority.NORMAL
    assert (spec.nodes, spec.gpus_per_node, spec.workdir, spec.project) == (1, 1, "~", "default")
    assert spec.access == "none"
    assert spec.max_runtime is None and spec.hang_detect is None
    assert spec.fault_tolerance.retries == 0
    assert spec.argv() == ["python3", "train.py", "--lr", "3e-4"]
    assert spec.gpu_request == [GpuRequest(None, 1)]


def test_design_example() -> None:
    spec = parse_jobspec(
        "name: llama-ft\nmode: pytorch\nnodes: 2\ngpus_per_node: 8\npriority: normal\n"
        "command: python train.py --lr 3e-4\nworkdir: /data/me/llama\nenv: {NCCL_DEBUG: INFO}\n"
        "max_runtime: 12h\nfault_tolerance: {retries: 2}\n"
    )
    assert (spec.mode, spec.nodes, spec.gpus_per_node) == (JobMode.PYTORCH, 2, 8)
    assert spec.max_runtime == 12 * 3600
    assert spec.env == {"NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ("gpus_per_node: 0", [GpuRequest(None, 0)]),
        ("spec: h100-8", [GpuRequest("h100-8", None)]),
        ("specs: [h100-8, a100-8]", [GpuRequest("h100-8", None), GpuRequest("a100-8", None)]),
    ],
)
def test_gpu_request(resources: str, expected: list[GpuRequest]) -> None:
    spec = parse_jobspec(f"name: j\ncommand: a\n{resources}\n")
    assert spec.gpu_request == expected


def test_env_numbers_become_text() -> None:
    spec = parse_jobspec("name: j\ncommand: a\nenv: {OMP_NUM_THREADS: 8, SCALE: 0.5}\n")
    assert spec.env == {"OMP_NUM_THREADS": "8", "SCALE": "0.5"}


def test_block_command_is_stripped() -> None:
    spec = parse_jobspec("name: j\ncommand: |\n  python3 train.py\n")
    assert spec.command == "python3 train.py"


def test_node_names() -> None:
    spec = parse_jobspec("name: j\nmode: pytorch\nnodes: 2\nnode_names: gpu[01-03]\ncommand: a\n")
    assert spec.node_list() == ["gpu01", "gpu02", "gpu03"]


def test_batch_tasks_argv() -> None:
    spec = parse_jobspec("name: j\ntype: batch\ntasks:\n  - {name: a, command: 'python3 a.py --x 1', output: out/a}\n")
    assert spec.tasks is not None and spec.tasks[0].argv() == ["python3", "a.py", "--x", "1"]
    with pytest.raises(ValueError, match="batch job"):
        spec.argv()


def test_json_round_trip() -> None:
    spec = load_jobspec(Path(__file__).resolve().parents[2] / "config" / "jobs" / "horovod.yaml")
    data = spec.to_json()
    assert data["fault_tolerance"]["checkpoint_resume"] == {
        "max_resumes": 3,
        "grace_period": 120.0,
        "signal": "SIGUSR1",
    }
    assert JobSpec.from_json(data) == spec


def test_model_enforces_cross_rules_too() -> None:
    with pytest.raises(ValidationError, match="mode single runs on one node"):
        JobSpec.model_validate({"name": "j", "command": "a", "nodes": 2})


def test_spec_is_frozen() -> None:
    spec = parse_jobspec("name: j\ncommand: a\n")
    with pytest.raises(ValidationError):
        spec.nodes = 3  # type: ignore[misc]


# -- invalid specs -----------------------------------------------------------------------------------------

BASE = "name: j\ncommand: python3 train.py\n"  # lines 1-2; cases add from line 3
PT = BASE + "mode: pytorch\nnodes: 2\n"  # lines 1-4; cases add from line 5
MPICH = BASE + "mode: mpich\nnodes: 2\n"

INVALID = [
    (BASE + "bogus: 1\n", 3, "bogus", "unknown key"),
    (BASE + "fault_tolerance:\n  retry: 1\n", 4, "fault_tolerance.retry", "unknown key"),
    (BASE + "mode: pytorc\n", 3, "mode", "must be one of: single, pytorch, pytorch-deepspeed"),
    (BASE + "nodes: 2\n", 3, "nodes", "mode single runs on one node"),
    (BASE + "nodes: 0\n", 3, "nodes", "must be at least 1, not 0"),
    (BASE + "mode: pytorch\nnodes: '2'\n", 4, "nodes", "must be a whole number, not text ('2')"),
    (BASE + "gpus_per_node: 8\nspecs: [a]\n", 4, "specs", "give only one of gpus_per_node, spec, specs"),
    (BASE + "spec: a\ngpus_per_node: 8\n", 4, "gpus_per_node", "spec is given already"),
    (BASE + "gpus_per_node: 65\n", 3, "gpus_per_node", "must be at most 64, not 65"),
    (BASE + "specs: []\n", 3, "specs", "must have at least 1 entry"),
    (BASE + "specs: [a, b, a]\n", 3, "specs", "unique: a given more than once"),
    (BASE + "spec: 'h100 x8'\n", 3, "spec", "invalid name"),
    (BASE + "node_names: gpu01\npool: fast\n", 3, "node_names", "cannot be combined with pool"),
    (BASE + "driver_version: '550.54'\nnode_names: gpu01\n", 4, "node_names", "cannot be combined with driver"),
    (BASE + "node_names: gpu[01-\n", 3, "node_names", "invalid node set"),
    (BASE + "mode: pytorch\nnodes: 2\nnode_names: gpu01\n", 5, "node_names", "names 1 node(s)"),
    (BASE + "driver_version: 550.50\n", 3, "driver_version", "in quotes"),
    (BASE + "mode: pytorch\nps_count: 1\n", 4, "ps_count", "only for mode tensorflow"),
    (BASE + "fault_tolerance:\n  retries: 4\n", 4, "fault_tolerance.retries", "must be at most 3, not 4"),
    (
        BASE + "fault_tolerance:\n  max_restarts: 2\n  checkpoint_resume:\n    max_resumes: 1\n",
        5,
        "fault_tolerance.checkpoint_resume",
        "mutually exclusive",
    ),
    (
        BASE + "fault_tolerance:\n  restart_exit_codes: [1]\n",
        4,
        "fault_tolerance.restart_exit_codes",
        "needs max_restarts",
    ),
    (
        BASE + "fault_tolerance:\n  max_restarts: 1\n  restart_exit_codes: [0]\n",
        5,
        "fault_tolerance.restart_exit_codes[0]",
        "must be at least 1, not 0",
    ),
    (
        BASE + "mode: pytorch\nnodes: 2\nfault_tolerance:\n  elastic: {min_nodes: 3}\n",
        6,
        "fault_tolerance.elastic.min_nodes",
        "must not exceed nodes (2)",
    ),
    (
        BASE + "mode: pytorch\nnodes: 4\nfault_tolerance:\n  elastic:\n    min_nodes: 2\n    max_nodes: 3\n",
        8,
        "fault_tolerance.elastic.max_nodes",
        "at least nodes (4)",
    ),
    (BASE + "fault_tolerance:\n  elastic: {min_nodes: 1}\n", 4, "fault_tolerance.elastic", "distributed mode"),
    (
        BASE + "fault_tolerance:\n  checkpoint_resume: {max_resumes: 1, grace_period: soon}\n",
        4,
        "fault_tolerance.checkpoint_resume.grace_period",
        "duration",
    ),
    (BASE + "env:\n  MASTER_ADDR: x\n", 4, "env.MASTER_ADDR", "set by the launcher"),
    (BASE + "env:\n  OK: a\n  FT_JOB: x\n", 5, "env.FT_JOB", "reserved for ftconsole"),
    (BASE + "env:\n  2FAST: x\n", 4, "env.2FAST", "invalid variable name"),
    (BASE + "env:\n  FLAG: yes\n", 4, "env.FLAG", "boolean"),
    (BASE + "type: batch\n", 2, "command", "batch job runs its tasks' commands"),
    ("name: j\ntype: batch\n", 2, "type", "needs tasks"),
    ("name: j\ntype: batch\ntasks: []\n", 3, "tasks", "must have at least 1 entry"),
    (BASE + "tasks:\n  - {name: a, command: b, output: a}\n", 3, "tasks", "tasks are for type: batch"),
    ("name: j\n", 1, "command", "command is required"),
    ("command: a\n", 1, "name", "missing: this key is required"),
    (
        "name: j\ntype: batch\ntasks:\n  - name: a\n    command: a\n    output: ../x\n",
        6,
        "tasks[0].output",
        "'..' is not allowed",
    ),
    (
        "name: j\ntype: batch\ntasks:\n  - {name: a, command: a, output: /abs}\n",
        4,
        "tasks[0].output",
        "must be a sub-folder",
    ),
    (
        "name: j\ntype: batch\ntasks:\n  - {name: a, command: a, output: a}\n  - {name: a, command: b, output: b}\n",
        5,
        "tasks[1].name",
        "duplicate task name 'a' (also tasks[0])",
    ),
    (
        "name: j\ntype: batch\ntasks:\n  - {name: a, command: a, output: x}\n  - {name: b, command: b, output: x/}\n",
        5,
        "tasks[1].output",
        "used by tasks[0]",
    ),
    (
        "name: j\ntype: batch\ntasks:\n  - name: a\n    command: a && b\n    output: a\n",
        5,
        "tasks[0].command",
        "found '&&'",
    ),
    (BASE.replace("python3 train.py", "KEY=VALUE python3 train.py"), 2, "command", "set variables in env"),
    (BASE + "max_runtime: 12 hours\n", 3, "max_runtime", "duration"),
    (BASE + "max_runtime: 0s\n", 3, "max_runtime", "greater than 0"),
    (BASE + "hang_detect: -5\n", 3, "hang_detect", "negative"),
    (BASE + "hang_detect: -5m\n", 3, "hang_detect", "duration"),
    ("name: 'my job'\ncommand: a\n", 1, "name", "invalid name"),
    ("name: " + "x" * 65 + "\ncommand: a\n", 1, "name", "invalid name"),
    ("name: -j\ncommand: a\n", 1, "name", "starting with a letter or digit"),
    (BASE + "priority: asap\n", 3, "priority", "must be one of: normal, urgent, very-urgent; not 'asap'"),
    (BASE + "access: everyone\n", 3, "access", "must be one of: read-write, read-only, none"),
    (BASE + "type: cron\n", 3, "type", "must be one of: regular, batch"),
    (BASE + "hooks:\n  during: x\n", 4, "hooks.during", "unknown key"),
    # launcher: each key for its mode only, never accepted and ignored
    (
        BASE + "launcher:\n  hydra_iface: eth0\n",
        4,
        "launcher.hydra_iface",
        "hydra_iface (HYDRA_IFACE, the network interface of MPICH's hydra) is only for mode mpich, not single",
    ),
    (PT + "launcher:\n  hydra_iface: ib0\n", 6, "launcher.hydra_iface", "is only for mode mpich, not pytorch"),
    (
        MPICH + "launcher:\n  torchrun_max_restarts: 2\n",
        6,
        "launcher.torchrun_max_restarts",
        "torchrun_max_restarts (torchrun's --max_restarts) is only for mode pytorch, not mpich",
    ),
    (
        BASE + "mode: pytorch-deepspeed\nlauncher:\n  torchrun_monitor_interval: 5s\n",
        5,
        "launcher.torchrun_monitor_interval",
        "torchrun_monitor_interval (torchrun's --monitor_interval) is only for mode pytorch, not pytorch-deepspeed",
    ),
    (PT + "launcher:\n  max_restarts: 3\n", 6, "launcher.max_restarts", "unknown key"),
    (PT + "launcher:\n  torchrun_max_restarts: -1\n", 6, "launcher.torchrun_max_restarts", "must be at least 0"),
    (PT + "launcher:\n  torchrun_max_restarts: '3'\n", 6, "launcher.torchrun_max_restarts", "must be a whole number"),
    (PT + "launcher:\n  torchrun_max_restarts: true\n", 6, "launcher.torchrun_max_restarts", "not a boolean (true)"),
    (PT + "launcher:\n  torchrun_monitor_interval: 0s\n", 6, "launcher.torchrun_monitor_interval", "greater than 0"),
    (PT + "launcher:\n  torchrun_monitor_interval: soon\n", 6, "launcher.torchrun_monitor_interval", "duration"),
    (
        MPICH + "launcher:\n  hydra_iface: 'eth0; rm -rf ~'\n",
        6,
        "launcher.hydra_iface",
        "invalid network interface name 'eth0; rm -rf ~': use 1 to 15 letters, digits, '_', '.', ':' or '-'",
    ),
    (MPICH + "launcher:\n  hydra_iface: " + "e" * 16 + "\n", 6, "launcher.hydra_iface", "invalid network interface"),
    (MPICH + "launcher:\n  hydra_iface: ''\n", 6, "launcher.hydra_iface", "invalid network interface"),
    (MPICH + "launcher:\n  hydra_iface: ..\n", 6, "launcher.hydra_iface", "invalid network interface"),
    (MPICH + "launcher:\n  hydra_iface: 'eth0\\n'\n", 6, "launcher.hydra_iface", "invalid network interface"),
    (MPICH + "launcher:\n  hydra_iface: eth/0\n", 6, "launcher.hydra_iface", "invalid network interface"),
    (
        MPICH + "env: {HYDRA_IFACE: eth0}\nlauncher: {hydra_iface: ib0}\n",
        5,
        "env.HYDRA_IFACE",
        "HYDRA_IFACE is set by launcher.hydra_iface: give the interface once",
    ),
    (BASE + "workdir: ''\n", 3, "workdir", "must not be empty"),
    (BASE + "workdir: ~\n", 3, "workdir", "YAML reads a bare ~ as null: write '~' in quotes"),
    (BASE + "name: k\n", 3, "name", "duplicate key"),
    ("- a\n- b\n", 1, "", "mapping"),
    ("name: [\n", 2, "", "YAML syntax"),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), INVALID)
def test_problems_name_file_line_and_key(tmp_path: Path, text: str, line: int, path: str, message: str) -> None:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_jobspec(p)
    problems = info.value.problems
    assert any(pr.line == line and pr.path == path and message in pr.message for pr in problems), problems
    assert all(pr.file == str(p) for pr in problems)


def test_all_problems_reported_at_once() -> None:
    text = (
        "name: j\n"  # 1
        "mode: pytorch\n"  # 2
        "nodes: 2\n"  # 3
        "gpus_per_node: 8\n"  # 4
        "specs: [a]\n"  # 5
        "ps_count: 1\n"  # 6
        "env: {RANK: '0'}\n"  # 7
        "command: a && b\n"  # 8
        "fault_tolerance:\n"  # 9
        "  retries: 4\n"  # 10
        "  max_restarts: 1\n"  # 11
        "  checkpoint_resume: {max_resumes: 1}\n"  # 12
        "max_runtime: forever\n"  # 13
    )
    with pytest.raises(ConfigError) as info:
        parse_jobspec(text, "job.yaml")
    found = [(p.line, p.path) for p in info.value.problems]
    assert found == [
        (5, "specs"),
        (6, "ps_count"),
        (7, "env.RANK"),
        (8, "command"),
        (10, "fault_tolerance.retries"),
        (12, "fault_tolerance.checkpoint_resume"),
        (13, "max_runtime"),
    ]
    assert all(p.file == "job.yaml" for p in info.value.problems)
    assert "job.yaml:8: command: one statement only" in str(info.value)


def test_a_key_faulted_by_the_model_is_not_faulted_again() -> None:
    with pytest.raises(ConfigError) as info:
        parse_jobspec("name: j\ncommand: a\nnodes: 0\n")
    assert [p.path for p in info.value.problems] == ["nodes"]


def test_cross_problems_skip_values_of_the_wrong_type() -> None:
    data = {"mode": ["x"], "type": ["batch"], "nodes": "2", "fault_tolerance": 3, "env": [1], "node_names": 5}
    assert cross_problems(data) == []
    data = {"type": "batch", "tasks": ["x", {"name": 1, "output": None}], "fault_tolerance": {"elastic": 1}}
    assert cross_problems(data) == [
        (("fault_tolerance", "elastic"), "elastic needs a distributed mode (mode single runs on one node)")
    ]
    assert cross_problems(["not", "a", "mapping"]) == []


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_jobspec("/nonexistent/job.yaml")


# -- what would fail only when the job is planned or started ----------------------------------------------------

TF = "name: j\ncommand: python3 train.py\nmode: tensorflow\n"  # lines 1-3; cases add from line 4
DS = "name: j\ncommand: deepspeed train.py\nmode: pytorch-deepspeed\n"

REFUSED_AT_SUBMIT = [
    # launcher: tensorflow needs a worker, so ps_count < nodes, and < min_nodes when the job is elastic
    (TF + "nodes: 2\nps_count: 2\n", 5, "ps_count", "ps_count (2) must be fewer than nodes (2)"),
    (TF + "ps_count: 1\n", 4, "ps_count", "ps_count (1) must be fewer than nodes (1): the first ps_count nodes"),
    (TF + "nodes: 3\nps_count: 5\n", 5, "ps_count", "at least one node must run a worker"),
    (
        TF + "nodes: 4\nps_count: 2\nfault_tolerance:\n  elastic: {min_nodes: 2}\n",
        5,
        "ps_count",
        "ps_count (2) must be fewer than fault_tolerance.elastic.min_nodes (2): the job may run on 2 node(s)",
    ),
    (
        TF + "nodes: 4\nps_count: 3\nfault_tolerance:\n  elastic: {min_nodes: 1, max_nodes: 8}\n",
        5,
        "ps_count",
        "fewer than fault_tolerance.elastic.min_nodes (1)",
    ),
    # supervisor: a workdir is absolute or under ~/ (the node's HOME); anything else depends on the login folder
    (BASE + "workdir: data/me\n", 3, "workdir", "must be an absolute path (as /data/me/project) or start with ~/"),
    (BASE + "workdir: ./run\n", 3, "workdir", "not './run': a relative path would depend on where SSH logs in"),
    (BASE + "workdir: ~bob/run\n", 3, "workdir", "not '~bob/run'"),
    (BASE + "workdir: ~run\n", 3, "workdir", "not '~run'"),
    (BASE + "workdir: ' /data'\n", 3, "workdir", "not ' /data'"),
    (BASE + "workdir: $HOME/run\n", 3, "workdir", "not '$HOME/run'"),
    # the supervisor cannot exec, chdir or export text with a NUL character in it
    (BASE + 'env: {X: "a\\0b"}\n', 3, "env.X", "contains a NUL character"),
    (BASE + 'workdir: "/data\\0"\n', 3, "workdir", "contains a NUL character"),
    ('name: j\ncommand: "python3 a\\0.py"\n', 2, "command", "contains a NUL character"),
    (BASE + 'hooks: {before: "echo \\0"}\n', 3, "hooks.before", "contains a NUL character"),
    (
        'name: j\ntype: batch\ntasks:\n  - {name: a, command: "b \\0", output: a}\n',
        4,
        "tasks[0].command",
        "contains a NUL character",
    ),
    # DS_ENV_FILE carries env: to every rank; DeepSpeed's env file holds one stripped KEY=VALUE line each
    (BASE + "env: {DS_ENV_FILE: /tmp/x}\n", 3, "env.DS_ENV_FILE", "DS_ENV_FILE is set by ftconsole"),
    (DS + 'env: {X: "a\\nb"}\n', 4, "env.X", "has a line break, which DeepSpeed's env file"),
    (DS + "env: {X: ' padded '}\n", 4, "env.X", "has blanks at its start or end"),
    # torchrun's options need a command that mode pytorch wraps in torchrun; one run as given would ignore them
    (
        "name: j\ncommand: torchrun --nproc_per_node 8 train.py\nmode: pytorch\nlauncher:\n"
        "  torchrun_max_restarts: 3\n",
        5,
        "launcher.torchrun_max_restarts",
        "torchrun_max_restarts sets an option of the torchrun that ftconsole wraps a python command in (python "
        "SCRIPT, or python -m MODULE other than torch.distributed.run), and 'torchrun --nproc_per_node 8 train.py' "
        "is run as given: pass --max_restarts to your own launcher, or remove the key",
    ),
    (
        "name: j\ncommand: python -m torch.distributed.run t.py\nmode: pytorch\nlauncher:\n"
        "  torchrun_monitor_interval: 5s\n",
        5,
        "launcher.torchrun_monitor_interval",
        "is run as given: pass --monitor_interval to your own launcher",
    ),
    (
        "name: j\ncommand: ./run.sh\nmode: pytorch\nlauncher: {torchrun_max_restarts: 0}\n",
        4,
        "launcher.torchrun_max_restarts",
        "'./run.sh' is",
    ),
    (
        "name: j\nmode: pytorch\ntype: batch\ntasks:\n  - {name: a, command: sh a.sh, output: a}\n"
        "  - {name: b, command: python -c pass, output: b}\nlauncher:\n  torchrun_max_restarts: 1\n",
        8,
        "launcher.torchrun_max_restarts",
        "and no task's command is wrapped: pass --max_restarts",
    ),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), REFUSED_AT_SUBMIT)
def test_what_would_fail_at_launch_is_refused_at_submit(text: str, line: int, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_jobspec(text, "job.yaml")
    problems = info.value.problems
    assert any(p.line == line and p.path == path and message in p.message for p in problems), problems
    with pytest.raises(ValidationError, match=re.escape(f"{path}: ")):  # the server's own check, from JSON
        JobSpec.from_json(_raw(text))


def _raw(text: str) -> dict[str, Any]:
    data, _ = yamlfile.parse(text, "job.yaml")
    assert isinstance(data, dict)
    return data


STILL_VALID = [
    TF + "nodes: 2\nps_count: 1\n",
    TF + "nodes: 1\nps_count: 0\n",
    TF + "nodes: 3\n",
    TF + "nodes: 4\nps_count: 1\nfault_tolerance:\n  elastic: {min_nodes: 2, max_nodes: 6}\n",
    TF + "nodes: 4\nps_count: 0\nfault_tolerance:\n  elastic: {min_nodes: 1}\n",
    BASE,
    BASE + "workdir: '~'\n",
    BASE + "workdir: ~/\n",
    BASE + "workdir: ~/runs/llama\n",
    BASE + "workdir: /\n",
    BASE + "workdir: /data/me/../shared/run\n",
    BASE + "workdir: '/data/with space'\n",
    BASE + "env: {X: 'a b', Y: '', Z: 3}\n",
    PT + "launcher:\n  torchrun_max_restarts: 0\n  torchrun_monitor_interval: 250ms\n",
    PT + "launcher: {torchrun_max_restarts: 2}\nfault_tolerance: {max_restarts: 1}\n",
    PT + "launcher: {}\n",
    MPICH + "launcher: {hydra_iface: enp65s0f0}\n",
    MPICH + "launcher: {hydra_iface: 'eth0:1'}\nenv: {NCCL_SOCKET_IFNAME: eth0}\n",
    MPICH + "env: {HYDRA_IFACE: lo}\n",
    "name: j\nmode: pytorch\ntype: batch\ntasks:\n  - {name: a, command: sh a.sh, output: a}\n"
    "  - {name: b, command: python3 -u b.py, output: b}\nlauncher: {torchrun_monitor_interval: 1s}\n",
]


@pytest.mark.parametrize("text", STILL_VALID)
def test_valid_specs_still_pass_and_plan(text: str) -> None:
    spec = parse_jobspec(text, "job.yaml")
    assert JobSpec.from_json(spec.to_json()) == spec
    sizes = {spec.nodes, *(spec.elastic_range or ())}
    for size in sizes:  # every size the job may run at plans without an error
        plan_job(spec, _launch_input(spec, size))


def _launch_input(spec: JobSpec, size: int) -> launcher.LaunchInput:
    return launcher.LaunchInput(
        job_id="1",
        attempt=0,
        mode=spec.mode.value,
        argv=(),
        env=dict(spec.env),
        workdir=spec.workdir,
        nodes=tuple(launcher.NodeAssignment(f"n{i}", f"10.0.0.{i}", (0,)) for i in range(size)),
        master_port=29500,
        run_root="~/.ftconsole/runs",
        ps_count=spec.ps_count or 0,
        hydra_iface=spec.launcher.hydra_iface if spec.launcher else None,
        torchrun_max_restarts=spec.launcher.torchrun_max_restarts if spec.launcher else None,
        torchrun_monitor_interval=spec.launcher.torchrun_monitor_interval if spec.launcher else None,
    )  # as `executor.plan_attempt` builds it


@pytest.mark.parametrize("text", [t for t, _, path, _ in REFUSED_AT_SUBMIT if path == "ps_count"])
def test_the_ps_count_check_is_the_launchers_rule(text: str) -> None:
    """A stored spec skips the submit checks (it still loads); the launcher refuses it at its smallest size."""
    spec = JobSpec.from_stored(_raw(text))
    size = min([spec.nodes, *(spec.elastic_range or ())])
    with pytest.raises(launcher.LaunchError, match="at least one worker is needed"):
        plan_job(spec, _launch_input(spec, size))


def test_a_stored_spec_accepted_before_the_submit_checks_still_loads() -> None:
    data = {"name": "j", "command": "a", "workdir": "data", "env": {"X": "a\0b"}}
    assert JobSpec.from_stored(data).workdir == "data"
    with pytest.raises(ValidationError, match="workdir"):
        JobSpec.from_json(data)
    with pytest.raises(ValidationError, match="mode single runs on one node"):  # the spec's own rules still hold
        JobSpec.from_stored({"name": "j", "command": "a", "nodes": 2})


@pytest.mark.parametrize("key", sorted(LAUNCHER_MODES))
@pytest.mark.parametrize("mode", list(JobMode))
def test_a_launcher_key_is_refused_in_every_other_mode(key: str, mode: JobMode) -> None:
    wanted, what = LAUNCHER_MODES[key]
    value = {"hydra_iface": "ib0", "torchrun_max_restarts": 1, "torchrun_monitor_interval": 5.0}[key]
    data = {"name": "j", "mode": mode.value, "command": "python3 t.py", "launcher": {key: value}}
    problems = [p for p in cross_problems(data) if p[0][0] == "launcher"]
    if mode is wanted:
        assert problems == []
        assert getattr(JobSpec.from_json(data).launcher, key) == value
    else:
        assert problems == [(("launcher", key), f"{key} ({what}) is only for mode {wanted}, not {mode}")]
        with pytest.raises(ValidationError, match=re.escape(f"launcher.{key}: {key} ({what}) is only for mode")):
            JobSpec.from_json(data)


def test_every_launcher_key_has_its_mode_and_its_launch_input_field() -> None:
    assert set(LAUNCHER_MODES) == set(Launcher.model_fields)
    assert set(LAUNCHER_MODES) <= {f.name for f in dataclasses.fields(launcher.LaunchInput)}


def test_the_launcher_section_round_trips_and_an_old_stored_spec_has_none() -> None:
    spec = parse_jobspec(PT + "launcher:\n  torchrun_max_restarts: 2\n  torchrun_monitor_interval: 1m\n")
    assert spec.to_json()["launcher"] == {"torchrun_max_restarts": 2, "torchrun_monitor_interval": 60.0}
    assert JobSpec.from_json(spec.to_json()) == spec == JobSpec.from_stored(spec.to_json())
    old = JobSpec.from_stored({"name": "j", "command": "a", "fault_tolerance": {"max_restarts": 3}})
    assert old.launcher is None and "launcher" not in old.to_json()


def test_a_stored_spec_skips_the_torchrun_wrapping_check_and_plans_its_command_as_given() -> None:
    data = {"name": "j", "mode": "pytorch", "command": "torchrun t.py", "launcher": {"torchrun_max_restarts": 3}}
    spec = JobSpec.from_stored(data)
    with pytest.raises(ValidationError, match="is run as given"):
        JobSpec.from_json(data)
    assert plan_job(spec, _launch_input(spec, 1)).plan.ranks[0].argv == ("torchrun", "t.py")


def test_every_job_mode_has_a_launch_planner() -> None:
    assert {m.value for m in JobMode} == set(launcher.MODES)


# -- example job files -------------------------------------------------------------------------------------

JOB_FILES = sorted((Path(__file__).resolve().parents[2] / "config" / "jobs").glob("*.yaml"))


def test_example_job_files_exist() -> None:
    names = {p.name for p in JOB_FILES}
    assert {"pytorch.yaml", "single.yaml", "batch.yaml", "horovod.yaml", "tensorflow-ps.yaml"} <= names


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_example_job_file_loads(path: Path) -> None:
    spec = load_jobspec(path)
    assert JobSpec.from_json(spec.to_json()) == spec


def test_pytorch_example_is_two_nodes_of_eight() -> None:
    spec = load_jobspec(Path(__file__).resolve().parents[2] / "config" / "jobs" / "pytorch.yaml")
    assert (spec.mode, spec.nodes, spec.gpu_request) == (JobMode.PYTORCH, 2, [GpuRequest(None, 8)])
