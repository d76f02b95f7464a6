"""`scheduler.launcher.plan_launch`: golden plans per mode, then tables for each rule.

Goldens live in tests/unit/golden/launcher/<case>.json (the input and the plan it gives); run with
``UPDATE_GOLDEN=1`` to rewrite them after an intended change, and review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftconsole.scheduler.decide.launcher import (
    MODES,
    LaunchError,
    LaunchInput,
    LaunchPlan,
    NodeAssignment,
    deepspeed_argv,
    deepspeed_env_file,
    is_mpi_launcher,
    plan_launch,
    tf_config,
    torch_wrap,
    wraps_in_torchrun,
)
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.node.bundle import script

GOLDEN = Path(__file__).parent / "golden" / "launcher"

SEED_PREFIX = [
    "mpirun",
    "--allow-run-as-root",
    "-np",
    "16",
    "-bind-to",
    "none",
    "-map-by",
    "slot",
    "-x",
    "NCCL_DEBUG=INFO",
    "-x",
    "LD_LIBRARY_PATH",
    "-x",
    "PATH",
    "-mca",
    "pml",
    "ob1",
    "-mca",
    "btl",
    "^openib",
]  # the seed's example: 4 nodes x 4 GPUs


def nodes(count: int, gpus: int = 4) -> tuple[NodeAssignment, ...]:
    return tuple(NodeAssignment(f"gpu{i + 1:02d}", f"10.1.0.{i + 1}", tuple(range(gpus))) for i in range(count))


def job(mode: str, argv: str | tuple[str, ...], count: int = 2, **overrides: Any) -> LaunchInput:
    fields: dict[str, Any] = {
        "job_id": "j-0042",
        "attempt": 1,
        "mode": mode,
        "argv": tuple(argv.split()) if isinstance(argv, str) else argv,
        "env": {},
        "workdir": "/data/me/llama",
        "nodes": nodes(count),
        "master_port": 29500,
        "run_root": "/home/me/.ftconsole/runs",
    }
    fields.update(overrides)
    return LaunchInput(**fields)


def as_json(inp: LaunchInput, plan: LaunchPlan) -> dict[str, Any]:
    check = plan.ssh_check
    return {
        "input": dataclasses.asdict(inp) | {"env": dict(inp.env)},
        "plan": [
            dataclasses.asdict(r) | {"files": {name: data.decode() for name, data in r.files.items()}}
            for r in plan.ranks
        ],
        "ssh_check": None if check is None else [*check[:2], "SSH_CHECK_SCRIPT", *check[3:]],
    }


# --- goldens, one per mode and variant ---------------------------------------------------------------------------

GOLDEN_CASES = {
    "single": job("single", "python train.py --lr 3e-4", 1, env={"NCCL_DEBUG": "INFO"}),
    "pytorch": job("pytorch", "python /workspace/algorithm/train.py"),
    "pytorch_restarts": job("pytorch", "python3 -u train.py", torchrun_max_restarts=3, torchrun_monitor_interval=5.0),
    "pytorch_torchrun": job(
        "pytorch", "torchrun --nnodes 2 --nproc_per_node 4 --node_rank 0 --master_addr a --master_port 1 t.py"
    ),
    "deepspeed_launcher": job(
        "pytorch-deepspeed", "deepspeed train.py --deepspeed --deepspeed_config ds_config.json", 2
    ),
    "deepspeed_python": job("pytorch-deepspeed", "python train.py --deepspeed"),
    "horovod_prefixed": job("horovod", "python /workspace/algorithm/train.py", 4, env={"NCCL_SOCKET_IFNAME": "eth0"}),
    "horovod_mpirun": job(
        "horovod",
        "mpirun -np 16 -bind-to none -map-by slot -x NCCL_DEBUG=INFO -x LD_LIBRARY_PATH -x PATH "
        "-x NCCL_SOCKET_IFNAME=^lo,docker0 -mca pml ob1 -mca btl ^openib -mca btl_tcp_if_exclude lo,docker0 "
        "python /workspace/algorithm/train.py",
        4,
    ),
    "mpich": job("mpich", "python train.py", 2, hydra_iface="eth0"),
    "tensorflow_ps_worker": job("tensorflow", "python tf_train.py", 3, ps_count=1),
    "tensorflow_allreduce": job("tensorflow", "python tf_train.py", 2),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(case: str) -> None:
    inp = GOLDEN_CASES[case]
    got = json.loads(json.dumps(as_json(inp, plan_launch(inp))))  # tuples as JSON lists
    path = GOLDEN / f"{case}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    assert path.exists(), f"no golden {path}; run with UPDATE_GOLDEN=1 to create it"
    assert got == json.loads(path.read_text(encoding="utf-8"))


def test_every_mode_has_a_golden() -> None:
    assert {inp.mode for inp in GOLDEN_CASES.values()} == set(MODES)
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(GOLDEN_CASES)


# --- environment every rank gets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_common_env(mode: str) -> None:
    count = 1 if mode == "single" else 2
    plan = plan_launch(job(mode, "python train.py", count))
    for r in plan.ranks:
        run_dir = f"/home/me/.ftconsole/runs/j-0042/1/{r.rank}"
        assert r.run_dir == run_dir
        assert r.workdir == "/data/me/llama"
        assert {k: r.env[k] for k in COMMON} == {
            "MASTER_ADDR": "10.1.0.1",
            "MASTER_PORT": "29500",
            "WORLD_SIZE": str(count),
            "RANK": str(r.rank),
            "SLOTS": "4",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "FT_JOB_ID": "j-0042",
            "FT_ATTEMPT": "1",
            "FT_HOSTFILE": f"{run_dir}/hostfile",
            "FT_OUTPUT_DIR": f"{run_dir}/output",
            "FT_RESTART_COUNT": "0",
            "FT_RESUME": "0",
        }
        assert set(r.files) == {"hostfile"}


COMMON = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "SLOTS",
    "CUDA_VISIBLE_DEVICES",
    "FT_JOB_ID",
    "FT_ATTEMPT",
    "FT_HOSTFILE",
    "FT_OUTPUT_DIR",
    "FT_RESTART_COUNT",
    "FT_RESUME",
)


def test_user_env_is_merged_under_ours() -> None:
    user = {"NCCL_DEBUG": "WARN", "RANK": "99", "MASTER_PORT": "1", "FT_HOSTFILE": "/etc/x", "TF_CONFIG": "{}"}
    plan = plan_launch(job("tensorflow", "python t.py", 2, env=user))
    for r in plan.ranks:
        assert r.env["NCCL_DEBUG"] == "WARN"
        assert r.env["RANK"] == str(r.rank)
        assert r.env["MASTER_PORT"] == "29500"
        assert r.env["FT_HOSTFILE"].endswith(f"/{r.rank}/hostfile")
        assert json.loads(r.env["TF_CONFIG"])["task"]["index"] == r.rank
    assert user["RANK"] == "99"  # the input is not touched


@pytest.mark.parametrize(
    ("gpus", "visible", "slots"),
    [
        ((0, 2, 5), "0,2,5", "3"),
        ((7, 1), "7,1", "2"),  # the order given is kept
        ((3,), "3", "1"),
        ((), "", "1"),  # no GPUs: CUDA sees none; one slot (seed 003: CPU specs have 1)
    ],
)
def test_cuda_visible_devices_per_node(gpus: tuple[int, ...], visible: str, slots: str) -> None:
    pair = (NodeAssignment("a", "10.0.0.1", (0, 1)), NodeAssignment("b", "10.0.0.2", gpus))
    plan = plan_launch(job("pytorch", "python t.py", nodes=pair))
    assert plan.ranks[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.ranks[1].env["CUDA_VISIBLE_DEVICES"] == visible
    assert plan.ranks[1].env["SLOTS"] == slots
    assert f"--nproc_per_node={slots}" in plan.ranks[1].argv
    assert plan.ranks[1].files["hostfile"] == f"10.0.0.1 slots=2\n10.0.0.2 slots={slots}\n".encode()


def test_paths_and_output_dir() -> None:
    plan = plan_launch(job("single", "bash run.sh", 1, run_root="~/.ftconsole/runs/", attempt=0, output_dir="/out/x"))
    (r,) = plan.ranks
    assert r.run_dir == "~/.ftconsole/runs/j-0042/0/0"
    assert r.env["FT_HOSTFILE"] == "~/.ftconsole/runs/j-0042/0/0/hostfile"
    assert r.env["FT_OUTPUT_DIR"] == "/out/x"


def test_plan_is_pure() -> None:
    inp = job("horovod", "python t.py", 3, env={"A": "1"})
    assert plan_launch(inp) == plan_launch(inp)
    assert inp.env == {"A": "1"}


# --- pytorch: what is wrapped ------------------------------------------------------------------------------------

TORCH_OPTS = (
    "--nproc_per_node=4",
    "--nnodes=2",
    "--node_rank=1",
    "--master_addr=10.1.0.1",
    "--master_port=29500",
)
RUN = ("-m", "torch.distributed.run", *TORCH_OPTS)

WRAP_CASES = [
    ("python train.py --lr 3e-4", ("python", *RUN, "train.py", "--lr", "3e-4")),
    ("python3 train.py", ("python3", *RUN, "train.py")),
    ("/usr/bin/python3.10 /w/train.py", ("/usr/bin/python3.10", *RUN, "/w/train.py")),
    ("/opt/conda/bin/python3.11 train.py", ("/opt/conda/bin/python3.11", *RUN, "train.py")),
    ("python -u train.py", ("python", "-u", *RUN, "train.py")),
    ("python -X dev -Wignore train.py", ("python", "-X", "dev", "-Wignore", *RUN, "train.py")),
    ("python -uW ignore train.py", ("python", "-uW", "ignore", *RUN, "train.py")),
    ("python -m pkg.train --x 1", ("python", *RUN, "-m", "pkg.train", "--x", "1")),
    ("python -um pkg.train", ("python", "-u", *RUN, "-m", "pkg.train")),
    ("python -mpkg.train a", ("python", *RUN, "-m", "pkg.train", "a")),
    ("python -- train.py -x", ("python", *RUN, "train.py", "-x")),
    ("python train.py -m torch.distributed.run", ("python", *RUN, "train.py", "-m", "torch.distributed.run")),
]

LEFT_ALONE = [
    "torchrun --nnodes 2 --nproc_per_node 4 train.py",
    "bash run.sh",
    "deepspeed train.py",
    "./train.py",
    "ipython train.py",
    "python-config --libs",
    "python -m torch.distributed.run --nproc_per_node=8 train.py",
    "python3 -u -m torch.distributed.launch --nproc_per_node=8 train.py",
    "python -mtorch.distributed.run train.py",
    "python -c print(1)",
    "python -uc print(1)",
    "python -",
    "python",
    "python -u",
    "python -m",
    "python --version",
]


@pytest.mark.parametrize(("command", "wrapped"), WRAP_CASES, ids=[c for c, _ in WRAP_CASES])
def test_pytorch_wraps_python(command: str, wrapped: tuple[str, ...]) -> None:
    plan = plan_launch(job("pytorch", command))
    assert plan.ranks[1].argv == wrapped
    assert plan.ranks[0].argv == tuple(a.replace("--node_rank=1", "--node_rank=0") for a in wrapped)
    assert all(r.launch for r in plan.ranks)


@pytest.mark.parametrize("command", LEFT_ALONE)
def test_pytorch_leaves_other_commands_alone(command: str) -> None:
    plan = plan_launch(job("pytorch", command))
    assert all(r.argv == tuple(command.split()) for r in plan.ranks)
    assert all(r.launch for r in plan.ranks)


@pytest.mark.parametrize(
    ("restarts", "interval", "extra"),
    [
        (3, 5.0, ("--max_restarts=3", "--monitor_interval=5")),
        (0, None, ("--max_restarts=0",)),
        (None, 0.5, ("--monitor_interval=0.5",)),
        (None, None, ()),
    ],
)
def test_pytorch_restart_options(restarts: int | None, interval: float | None, extra: tuple[str, ...]) -> None:
    argv = torch_wrap(
        ("python", "t.py"),
        nproc_per_node=8,
        nnodes=1,
        node_rank=0,
        master_addr="h",
        master_port=1,
        max_restarts=restarts,
        monitor_interval=interval,
    )
    assert argv is not None
    assert argv[argv.index("--master_port=1") + 1 : -1] == extra


@pytest.mark.parametrize(
    ("command", "wrapped"),
    [
        ("python t.py", True),
        ("python3 -u -m pkg.train --lr 1", True),
        ("/opt/conda/bin/python3.11 -X dev t.py", True),
        ("torchrun t.py", False),
        ("python -m torch.distributed.run t.py", False),
        ("python -m torch.distributed.launch t.py", False),
        ("python -c pass", False),
        ("./run.sh", False),
        ("deepspeed t.py", False),
    ],
)
def test_wraps_in_torchrun_is_the_wrapping_rule(command: str, wrapped: bool) -> None:
    """What the spec asks before it accepts torchrun's options: the pytorch plan wraps exactly these."""
    assert wraps_in_torchrun(command.split()) is wrapped
    plan = plan_launch(job("pytorch", command, torchrun_max_restarts=2))
    assert ("--max_restarts=2" in plan.ranks[0].argv) is wrapped


def test_pytorch_master_addr_is_node_zero_host_not_name() -> None:
    pair = (NodeAssignment("gpu-b", "192.168.0.9", (0,)), NodeAssignment("gpu-a", "192.168.0.3", (0,)))
    plan = plan_launch(job("pytorch", "python t.py", nodes=pair))
    assert {r.env["MASTER_ADDR"] for r in plan.ranks} == {"192.168.0.9"}
    assert [r.node for r in plan.ranks] == ["gpu-b", "gpu-a"]
    assert all("--master_addr=192.168.0.9" in r.argv for r in plan.ranks)


# --- MPI modes: launcher present or absent -----------------------------------------------------------------------

LAUNCHERS = ["mpirun", "/usr/bin/mpirun", "mpiexec", "mpirun.openmpi", "mpiexec.hydra", "horovodrun"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("mode", ["horovod", "mpich"])
def test_mpi_command_with_launcher_is_left_alone(mode: str, launcher: str) -> None:
    argv = (launcher, "-np", "8", "python", "t.py")
    assert is_mpi_launcher(argv)
    plan = plan_launch(job(mode, argv, 3))
    assert [r.argv for r in plan.ranks] == [argv] * 3
    assert [r.launch for r in plan.ranks] == [True, False, False]


def test_horovod_without_mpirun_gets_the_seed_prefix() -> None:
    plan = plan_launch(job("horovod", "python /workspace/algorithm/train.py", 4))
    assert list(plan.ranks[0].argv) == [*SEED_PREFIX, *OURS_EXPORTED, "python", "/workspace/algorithm/train.py"]
    assert [r.launch for r in plan.ranks] == [True, False, False, False]
    assert [r.argv for r in plan.ranks[1:]] == [plan.ranks[0].argv] * 3  # shown, not run
    for r in plan.ranks:
        assert r.env["OMPI_MCA_orte_default_hostfile"] == r.env["FT_HOSTFILE"]
        assert "-hostfile" not in r.argv and "HYDRA_HOST_FILE" not in r.env
        assert r.files["hostfile"] == b"".join(f"10.1.0.{i} slots=4\n".encode() for i in range(1, 5))


OURS_EXPORTED = [
    a
    for k in (
        "FT_ATTEMPT",
        "FT_HOSTFILE",
        "FT_JOB_ID",
        "FT_OUTPUT_DIR",
        "FT_RESTART_COUNT",
        "FT_RESUME",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    for a in ("-x", k)
]  # what mpirun carries to the ranks it starts on other nodes, with rank 0's values


def test_horovod_exports_user_env_to_remote_ranks() -> None:
    env = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN", "PATH": "/x", "A_FLAG": "1"}
    argv = plan_launch(job("horovod", "python t.py", 4, env=env)).ranks[0].argv
    seed = [a if a != "NCCL_DEBUG=INFO" else "NCCL_DEBUG" for a in SEED_PREFIX]
    exported = [
        "A_FLAG", "FT_ATTEMPT", "FT_HOSTFILE", "FT_JOB_ID", "FT_OUTPUT_DIR", "FT_RESTART_COUNT", "FT_RESUME",
        "MASTER_ADDR", "MASTER_PORT",
    ]  # fmt: skip
    assert list(argv) == [*seed, *(a for k in [*exported, "NCCL_SOCKET_IFNAME"] for a in ("-x", k)), "python", "t.py"]


def test_mpi_total_slots_counts_every_node() -> None:
    mixed = (NodeAssignment("a", "h1", (0, 1, 2)), NodeAssignment("b", "h2", (4,)), NodeAssignment("c", "h3", ()))
    horovod = plan_launch(job("horovod", "python t.py", nodes=mixed)).ranks[0]
    assert horovod.argv[horovod.argv.index("-np") + 1] == "5"
    assert horovod.files["hostfile"] == b"h1 slots=3\nh2 slots=1\nh3 slots=1\n"
    mpich = plan_launch(job("mpich", "python t.py", nodes=mixed)).ranks[0]
    assert mpich.argv == ("mpirun", "-np", "5", "python", "t.py")
    assert mpich.files["hostfile"] == b"h1:3\nh2:1\nh3:1\n"


@pytest.mark.parametrize(("iface", "expected"), [("ib0", {"HYDRA_IFACE": "ib0"}), (None, {})])
def test_mpich_env(iface: str | None, expected: dict[str, str]) -> None:
    plan = plan_launch(job("mpich", "python t.py", 2, hydra_iface=iface))
    for r in plan.ranks:
        assert r.env["HYDRA_HOST_FILE"] == r.env["FT_HOSTFILE"]
        assert {k: v for k, v in r.env.items() if k == "HYDRA_IFACE"} == expected
        assert "OMPI_MCA_orte_default_hostfile" not in r.env
        assert r.files["hostfile"] == b"10.1.0.1:4\n10.1.0.2:4\n"
    assert [r.launch for r in plan.ranks] == [True, False]


# --- pytorch-deepspeed -------------------------------------------------------------------------------------------

HF = "/r/hostfile"
DS_NODES = (NodeAssignment("a", "h1", (0, 1)), NodeAssignment("b", "h2", (2, 5)))
DS_ALL = ("--hostfile", HF, "--master_addr", "h1", "--master_port", "29500", "--include", "h1:0,1@h2:2,5")

DEEPSPEED_CASES = [
    ("deepspeed train.py --deepspeed", ("deepspeed", *DS_ALL, "train.py", "--deepspeed")),
    (
        "deepspeed --hostfile=/mine t.py",
        ("deepspeed", *DS_ALL[2:], "--hostfile=/mine", "t.py"),
    ),
    ("deepspeed -H /mine t.py", ("deepspeed", *DS_ALL[2:], "-H", "/mine", "t.py")),
    (
        "deepspeed --master_port 7 --num_gpus 2 t.py",
        ("deepspeed", *DS_ALL[:4], "--master_port", "7", "--num_gpus", "2", "t.py"),
    ),
    ("deepspeed --include h1:0 t.py", ("deepspeed", *DS_ALL[:6], "--include", "h1:0", "t.py")),
    # options after the script are the script's own: ours are still given to deepspeed
    (
        "deepspeed t.py --hostfile x --master_port 1",
        ("deepspeed", *DS_ALL, "t.py", "--hostfile", "x", "--master_port", "1"),
    ),
    ("/opt/bin/deepspeed --no_python --module pkg", ("/opt/bin/deepspeed", *DS_ALL, "--no_python", "--module", "pkg")),
]


@pytest.mark.parametrize(("command", "expected"), DEEPSPEED_CASES, ids=[c for c, _ in DEEPSPEED_CASES])
def test_deepspeed_argv(command: str, expected: tuple[str, ...]) -> None:
    assert deepspeed_argv(tuple(command.split()), HF, DS_NODES, 29500) == expected


def test_deepspeed_include_left_out_without_gpus() -> None:
    cpu = (NodeAssignment("a", "h1"), NodeAssignment("b", "h2"))
    assert deepspeed_argv(("deepspeed", "t.py"), HF, cpu, 1) == ("deepspeed", *DS_ALL[:4], "--master_port", "1", "t.py")


def test_deepspeed_launches_on_the_first_node_only() -> None:
    plan = plan_launch(job("pytorch-deepspeed", "deepspeed t.py", 3))
    assert [r.launch for r in plan.ranks] == [True, False, False]
    assert plan.launching == plan.ranks[:1]
    assert plan.ranks[0].argv[1:3] == ("--hostfile", plan.ranks[0].env["FT_HOSTFILE"])
    for r in plan.ranks:
        assert r.files["hostfile"] == b"10.1.0.1 slots=4\n10.1.0.2 slots=4\n10.1.0.3 slots=4\n"
        assert r.env["SLOTS"] == "4" and r.env["WORLD_SIZE"] == "3"


@pytest.mark.parametrize("command", ["python train.py --deepspeed", "torchrun t.py", "bash ds.sh"])
def test_deepspeed_mode_other_commands_run_on_every_node_as_given(command: str) -> None:
    plan = plan_launch(job("pytorch-deepspeed", command, 2))
    assert [r.argv for r in plan.ranks] == [tuple(command.split())] * 2
    assert [r.launch for r in plan.ranks] == [True, True]


@pytest.mark.parametrize(
    ("gpus", "slots", "include"),
    [
        ((0, 1), "2", "h1:0,1"),
        ((2, 3), "4", "h1:2,3"),  # issue 15: slots=2 with --include h1:2,3 is refused ("No slot '2'")
        ((5,), "6", "h1:5"),
        ((6, 1), "7", "h1:6,1"),
        ((), "1", "h1"),  # no GPUs: the host alone, its one slot
    ],
)
def test_deepspeed_hostfile_holds_every_gpu_the_include_names(gpus: tuple[int, ...], slots: str, include: str) -> None:
    pair = (NodeAssignment("a", "h1", gpus), NodeAssignment("b", "h2", (0, 1)))
    rank0 = plan_launch(job("pytorch-deepspeed", "deepspeed t.py", nodes=pair)).ranks[0]
    assert rank0.files["hostfile"] == f"h1 slots={slots}\nh2 slots=2\n".encode()
    assert rank0.argv[rank0.argv.index("--include") + 1] == f"{include}@h2:0,1"
    assert rank0.env["SLOTS"] == str(len(gpus) or 1)  # SLOTS stays the job's GPU count on the node


def test_deepspeed_env_file_carries_the_job_env_and_ours_to_every_rank() -> None:
    plan = plan_launch(job("pytorch-deepspeed", "deepspeed t.py", 2, env={"DATA": "/d", "DS_ACCELERATOR": "cpu"}))
    rank0 = plan.ranks[0]
    assert rank0.env["DS_ENV_FILE"] == f"{rank0.run_dir}/deepspeed_env"
    assert rank0.files["deepspeed_env"].decode().splitlines() == [
        "DATA=/d",
        "DS_ACCELERATOR=cpu",
        "FT_ATTEMPT=1",
        f"FT_HOSTFILE={rank0.run_dir}/hostfile",
        "FT_JOB_ID=j-0042",
        f"FT_OUTPUT_DIR={rank0.run_dir}/output",
        "FT_RESTART_COUNT=0",
        "FT_RESUME=0",
        "MASTER_ADDR=10.1.0.1",
        "MASTER_PORT=29500",
    ]  # never RANK, WORLD_SIZE, SLOTS or CUDA_VISIBLE_DEVICES: deepspeed's launch sets its own per process
    assert plan.ranks[1].files["deepspeed_env"] == rank0.files["deepspeed_env"]


NASTY_VALUES = [
    "plain",
    "/a/b:c,d=e",
    "",
    "two words",
    'say "hi"',
    "$HOME and `id` and $(id)",
    "back\\slash",
    "it's",
    "a;b|c&d",
]


@pytest.mark.parametrize("value", NASTY_VALUES)
def test_deepspeed_env_file_values_survive_deepspeeds_quoting_and_the_shell(value: str) -> None:
    """What DeepSpeed 0.19's runner does with a line (split, strip, wrap in double quotes), then sh."""
    line = deepspeed_env_file({"K": value}).decode()
    key, val = line.split("=", maxsplit=1)
    val = val.strip()
    if re.search(r"[^\w@%+=:,./-]", val):  # MultiNodeRunner.add_export
        val = f'"{val}"'
    shell = subprocess.run(
        ["sh", "-c", f'export {key}={val}; printf %s "$K"'], capture_output=True, text=True, timeout=10, check=True
    )
    assert shell.stdout == value


@pytest.mark.parametrize("value", ["two\nlines", " leading", "trailing "])
def test_deepspeed_env_file_leaves_out_what_a_line_cannot_carry(value: str) -> None:
    assert deepspeed_env_file({"K": value, "OK": "1"}) == b"OK=1\n"


# --- the pre-launch SSH check ------------------------------------------------------------------------------------

OMPI, HYDRA, PDSH = "mpirun (OpenMPI)", "MPICH's mpirun (hydra)", "DeepSpeed's runner (pdsh)"
PAIRS_2 = ("gpu01", "10.1.0.1", "gpu02", "10.1.0.2")
CHECK_CASES = [  # command, mode, nodes, the check's SETTINGS and LAUNCHER, its peers
    ("deepspeed t.py", "pytorch-deepspeed", 2, "", PDSH, PAIRS_2),
    ("deepspeed --ssh_port 2222 t.py", "pytorch-deepspeed", 2, '{"pdsh":{"port":"2222"}}', PDSH, PAIRS_2),
    ("deepspeed --ssh_port=22 t.py", "pytorch-deepspeed", 2, '{"pdsh":{"port":"22"}}', PDSH, PAIRS_2),
    (("deepspeed", "--launcher_args", "-R exec -l bob -t3", "t.py"), "pytorch-deepspeed", 2,
     '{"pdsh":{"rcmd":"exec","timeout":"3","user":"bob"}}', PDSH, PAIRS_2),
    ("deepspeed --launcher openmpi t.py", "pytorch-deepspeed", 2,
     '{"skip":"DeepSpeed\'s runner starts the ranks with --launcher openmpi; the check follows pdsh only"}', PDSH,
     PAIRS_2),
    ("python t.py", "horovod", 3, "", OMPI, ("gpu02", "10.1.0.2", "gpu03", "10.1.0.3")),
    ("mpirun -np 8 python t.py", "horovod", 2, "", OMPI, ("gpu02", "10.1.0.2")),
    (("mpirun", "-np", "8", "--mca", "plm_rsh_args", "-p 2222 -i k", "-mca", "btl", "tcp", "-gmca", "plm_rsh_agent",
      "ssh", "python", "t.py", "--mca", "plm", "x"), "horovod", 2,
     '{"mca":{"plm_rsh_agent":"ssh","plm_rsh_args":"-p 2222 -i k"}}', OMPI, ("gpu02", "10.1.0.2")),
    ("/opt/ompi/bin/mpirun --allow-run-as-root python t.py --mca plm_rsh_args x", "horovod", 2,
     '{"program":"/opt/ompi/bin/mpirun"}', OMPI, ("gpu02", "10.1.0.2")),
    ("mpiexec.hydra -n 8 -launcher rsh python t.py", "horovod", 2,
     '{"hydra":{"launcher":"rsh"},"program":"mpiexec.hydra"}', HYDRA, ("gpu02", "10.1.0.2")),
    ("horovodrun -np 2 -p 2222 python t.py", "horovod", 2,
     '{"skip":"horovodrun checks SSH to every host itself (its --ssh-port, --ssh-identity-file) before it starts"}',
     OMPI, ("gpu02", "10.1.0.2")),
    ("python t.py", "mpich", 2, "", HYDRA, ("gpu02", "10.1.0.2")),
    ("mpiexec -genv A -launcher -launcher=ssh -launcher-exec /x/ssh -disable-x python t.py -launcher rsh", "mpich", 2,
     '{"hydra":{"launcher":"ssh","launcher-exec":"/x/ssh","x":""},"program":"mpiexec"}', HYDRA, ("gpu02", "10.1.0.2")),
    ("mpirun.openmpi --mca plm_rsh_args -p1 python t.py", "mpich", 2,
     '{"mca":{"plm_rsh_args":"-p1"},"program":"mpirun.openmpi"}', OMPI, ("gpu02", "10.1.0.2")),
]  # fmt: skip


@pytest.mark.parametrize(("command", "mode", "count", "settings", "launcher", "peers"), CHECK_CASES)
def test_ssh_check_where_a_launcher_starts_ranks_from_the_first_node(
    command: str | tuple[str, ...], mode: str, count: int, settings: str, launcher: str, peers: tuple[str, ...]
) -> None:
    """The check's arguments: what the launcher's command line says of its way to connect (SETTINGS), which
    launcher it imitates, and the peers it reaches (DeepSpeed's pdsh reaches the first node too)."""
    check = plan_launch(job(mode, command, count)).ssh_check
    assert check is not None
    assert check[:3] == ("python3", "-c", script("sshcheck"))
    assert check[3:7] == ("gpu01", "5", settings, launcher)
    assert check[7:] == peers


@pytest.mark.parametrize(
    ("mode", "command", "count"),
    [
        ("pytorch", "python t.py", 2),
        ("tensorflow", "python t.py", 2),
        ("pytorch-deepspeed", "python t.py", 2),
        ("horovod", "python t.py", 1),
        ("pytorch-deepspeed", "deepspeed t.py", 1),  # one host: DeepSpeed's runner launches locally, no pdsh
        ("mpich", "python t.py", 1),
        ("single", "python t.py", 1),
    ],
)
def test_no_ssh_check_where_no_launcher_reaches_other_nodes(mode: str, command: str, count: int) -> None:
    assert plan_launch(job(mode, command, count)).ssh_check is None


def test_ssh_check_skips_a_host_twice_and_the_first_nodes_own_for_mpirun() -> None:
    group = (NodeAssignment("a", "h1"), NodeAssignment("b", "h1"), NodeAssignment("c", "h2"), NodeAssignment("d", "h2"))
    assert plan_launch(job("horovod", "python t.py", nodes=group)).ssh_check[7:] == ("c", "h2")  # type: ignore[index]
    assert plan_launch(job("pytorch-deepspeed", "deepspeed t.py", nodes=group)).ssh_check[7:] == (  # type: ignore[index]
        "a", "h1", "c", "h2",
    )  # fmt: skip


def test_ssh_check_script_names_the_pair_and_the_fix(tmp_path: Path) -> None:
    """The script itself, with an `ssh` on PATH that refuses one host as a missing known_hosts entry would; it
    connects as mpirun does by default (``-x`` after ssh) with no Open MPI setting of this machine's."""
    fake = tmp_path / "ssh"
    fake.write_text(
        '#!/bin/sh\necho "$@" >> "$0.calls"\n'
        'case "$*" in *10.1.0.3*) echo "Host key verification failed." >&2; exit 255;; esac\nexit 0\n'
    )
    fake.chmod(0o755)
    check = plan_launch(job("horovod", "python t.py", 3)).ssh_check
    assert check is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PRTE_", "OPAL_"))}
    env |= {"PATH": f"{tmp_path}:{os.environ['PATH']}", "HOME": str(tmp_path), "OPAL_SYSCONFDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, *check[1:]], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert (
        "ftconsole: ssh check: gpu01 cannot reach gpu03 (10.1.0.3) by SSH without a prompt: "
        "Host key verification failed. (ssh exit 255)"
    ) in done.stderr
    assert "gpu02" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("ftconsole: ssh check: gpu01 cannot reach gpu03")  # last: quoted
    assert "mpirun (OpenMPI) starts this job's ranks from gpu01 over SSH" in done.stderr
    assert "'ssh -o BatchMode=yes -x -o ConnectTimeout=5 HOST true' must work for HOST in 10.1.0.3" in done.stderr
    assert "known_hosts" in done.stderr and "authorized_keys" in done.stderr
    calls = sorted((tmp_path / "ssh.calls").read_text().splitlines())  # first ssh -G: a ConnectTimeout configured?
    assert calls == [f"-G -o BatchMode=yes -x 10.1.0.{i}" for i in (2, 3)] + [
        f"-o BatchMode=yes -x -o ConnectTimeout=5 10.1.0.{i} true" for i in (2, 3)
    ]
    ok = plan_launch(job("horovod", "python t.py", 2)).ssh_check
    assert ok is not None
    done = subprocess.run([sys.executable, *ok[1:]], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (
        0,
        "ftconsole: ssh check: gpu01 reaches gpu02 by SSH as mpirun (OpenMPI) does: "
        "ssh -o BatchMode=yes -x -o ConnectTimeout=5 HOST true\n",
    )


# --- tensorflow --------------------------------------------------------------------------------------------------


def test_tf_config_ps_worker_one_ps_of_three() -> None:
    plan = plan_launch(job("tensorflow", "python t.py", 3, ps_count=1))
    cluster = {"ps": ["10.1.0.1:29500"], "worker": ["10.1.0.2:29501", "10.1.0.3:29502"]}
    tasks = [{"type": "ps", "index": 0}, {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert [json.loads(r.env["TF_CONFIG"]) for r in plan.ranks] == [
        {"cluster": cluster, "task": task, "environment": "cloud"} for task in tasks
    ]
    assert all(r.launch and r.argv == ("python", "t.py") for r in plan.ranks)


def test_tf_config_allreduce() -> None:
    plan = plan_launch(job("tensorflow", "python t.py", 2))
    assert [r.env["TF_CONFIG"] for r in plan.ranks] == [
        '{"cluster":{"worker":["10.1.0.1:29500","10.1.0.2:29501"]},"task":{"type":"worker","index":0},'
        '"environment":"cloud"}',
        '{"cluster":{"worker":["10.1.0.1:29500","10.1.0.2:29501"]},"task":{"type":"worker","index":1},'
        '"environment":"cloud"}',
    ]


def test_tf_config_ports_stay_distinct_on_a_shared_host_and_ipv6_is_bracketed() -> None:
    same = (NodeAssignment("a", "127.0.0.1"), NodeAssignment("b", "127.0.0.1"), NodeAssignment("c", "fd00::3"))
    config = json.loads(tf_config(same, 2, 4000, 2))
    assert config["cluster"] == {"ps": ["127.0.0.1:4000", "127.0.0.1:4001"], "worker": ["[fd00::3]:4002"]}
    assert config["task"] == {"type": "worker", "index": 0}


# --- errors ------------------------------------------------------------------------------------------------------

ERROR_CASES = [
    pytest.param(job("single", "python t.py", 2), "single mode runs on one node", id="single-with-2-nodes"),
    pytest.param(job("tensorflow", "python t.py", 3, ps_count=3), "fewer than the 3", id="ps-equals-nodes"),
    pytest.param(job("tensorflow", "python t.py", 3, ps_count=4), "fewer than the 3", id="ps-over-nodes"),
    pytest.param(job("tensorflow", "python t.py", 3, ps_count=-1), "0 or more", id="ps-negative"),
    pytest.param(job("pytorch", "python t.py", 3, ps_count=1), "tensorflow mode only", id="ps-outside-tf"),
    pytest.param(job("slurm", "python t.py"), "unknown mode 'slurm'", id="unknown-mode"),
    pytest.param(job("pytorch", ()), "empty command", id="empty-argv"),
    pytest.param(job("pytorch", "python t.py", 0), "no nodes", id="no-nodes"),
    pytest.param(
        job("pytorch", "python t.py", nodes=(NodeAssignment("a", "h"), NodeAssignment("a", "h2"))),
        "appears twice",
        id="duplicate-node",
    ),
    pytest.param(job("pytorch", "python t.py", nodes=(NodeAssignment("a", ""),)), "has no host", id="no-host"),
    pytest.param(
        job("pytorch", "python t.py", nodes=(NodeAssignment("a", "h", (1, 1)),)), "bad GPU", id="duplicate-gpu"
    ),
    pytest.param(job("pytorch", "python t.py", master_port=0), "out of range", id="port-zero"),
    pytest.param(job("tensorflow", "python t.py", 3, master_port=65534), "out of range", id="tf-ports-overflow"),
    pytest.param(job("pytorch", "python t.py", job_id="../x"), "run folder", id="job-id-slash"),
    pytest.param(job("pytorch", "python t.py", attempt=-1), "attempt", id="attempt-negative"),
    pytest.param(job("pytorch", "python t.py", torchrun_max_restarts=-1), "max restarts", id="restarts-negative"),
    pytest.param(job("pytorch", "python t.py", torchrun_monitor_interval=0.0), "monitor interval", id="interval-zero"),
    pytest.param(
        job("pytorch", "python t.py", torchrun_monitor_interval=float("nan")), "monitor interval", id="interval-nan"
    ),
    pytest.param(
        job("pytorch-deepspeed", "python t.py", torchrun_max_restarts=1), "pytorch mode only", id="restarts-ds"
    ),
    pytest.param(job("mpich", "python t.py", torchrun_monitor_interval=5.0), "pytorch mode only", id="interval-mpich"),
    pytest.param(job("horovod", "python t.py", hydra_iface="ib0"), "mpich mode only", id="iface-horovod"),
]


@pytest.mark.parametrize(("inp", "message"), ERROR_CASES)
def test_errors(inp: LaunchInput, message: str) -> None:
    with pytest.raises(LaunchError, match=message.replace("(", r"\(")) as info:
        plan_launch(inp)
    assert isinstance(info.value, FtError)
    assert info.value.title == "launch"


def test_tf_last_port_may_be_65535() -> None:
    plan = plan_launch(job("tensorflow", "python t.py", 3, master_port=65533))
    assert json.loads(plan.ranks[2].env["TF_CONFIG"])["cluster"]["worker"][-1] == "10.1.0.3:65535"


# --- invariants over generated inputs ----------------------------------------------------------------------------

node_sets = st.lists(
    st.tuples(st.sets(st.integers(0, 15), max_size=8), st.sampled_from(["10.0.0.1", "10.0.0.2", "node-x", "fd00::1"])),
    min_size=1,
    max_size=6,
).map(lambda xs: tuple(NodeAssignment(f"n{i}", host, tuple(sorted(gpus))) for i, (gpus, host) in enumerate(xs)))
commands = st.sampled_from(["python t.py", "python3 -m pkg", "torchrun t.py", "mpirun -np 2 a", "deepspeed t.py", "sh"])


@given(
    mode=st.sampled_from(MODES),
    group=node_sets,
    command=commands,
    env=st.dictionaries(st.sampled_from(["A", "RANK", "NCCL_DEBUG"]), st.text(max_size=3)),
)
def test_invariants(mode: str, group: tuple[NodeAssignment, ...], command: str, env: dict[str, str]) -> None:
    if mode == "single":
        group = group[:1]
    plan = plan_launch(job(mode, command, nodes=group, env=env))
    assert [r.rank for r in plan.ranks] == list(range(len(group)))
    assert [r.node for r in plan.ranks] == [n.name for n in group]
    assert plan.launching, "something must start"
    if mode in ("horovod", "mpich") or (mode == "pytorch-deepspeed" and command.startswith("deepspeed")):
        assert plan.launching == plan.ranks[:1]
    else:
        assert plan.launching == plan.ranks
    for r in plan.ranks:
        assert all(isinstance(a, str) for a in r.argv)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in r.env.items())
        assert r.env["RANK"] == str(r.rank) and r.env["WORLD_SIZE"] == str(len(group))
        assert r.env["SLOTS"] == str(len(group[r.rank].gpus) or 1)
        assert r.files["hostfile"].count(b"\n") == len(group)
