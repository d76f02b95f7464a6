"""The MPI hybrid model of a job with `image` (issue 17): the spec's checks, the plan, and container.py itself.

container.py (scheduler/node/container_exec.py) is run here for real, as mpirun would run it: as a file written by
the plan, through the plan's own loader argv, in a process with a launcher's variables. The runtime it execs is
a stand-in script that records its argv (the real podman, with real mpirun across sshd nodes, is in
tests/peers/test_container_mpi.py).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftconsole.scheduler.decide.jobplan import HYBRID_LOADER, HYBRID_SCRIPT, PULL_STEP, Images, plan_job
from ftconsole.scheduler.decide.launcher import LaunchError, LaunchInput, NodeAssignment, plan_launch
from ftconsole.scheduler.decide.steps import StepKind
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.node import container_exec as hybrid
from ftconsole.scheduler.node import supervisor_container as node
from ftconsole.scheduler.node.bundle import modules, python_stdin_script, script
from ftconsole.scheduler.spec.containers import ContainerSettings, RuntimeChoice
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from tests.unit.test_agent import imported_modules

WAIT = 10.0


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_jobspec(text)
    return [f"{p.path}: {p.message}" for p in err.value.problems]


# -- the spec ----------------------------------------------------------------------------------------------------


def test_mpi_modes_on_several_nodes_take_an_image() -> None:
    for mode in ("horovod", "mpich"):
        assert parse_jobspec(f"name: j\ncommand: python t.py\nmode: {mode}\nnodes: 2\nimage: x\n").image == "x"


def test_a_command_with_its_own_mpirun_is_refused_with_an_image_naming_where() -> None:
    found = problems("name: j\ncommand: mpirun -np 4 python t.py\nmode: horovod\nnodes: 2\nimage: x\n")
    assert any(p.startswith("command: mpirun is ftconsole's to write") for p in found), found
    batch = ("name: b\ntype: batch\nmode: mpich\nnodes: 2\nimage: x\ntasks:\n"
             "- {name: a, command: 'python a.py', output: a}\n"
             "- {name: b, command: 'mpiexec.hydra -n 2 python b.py', output: b}\n")  # fmt: skip
    assert any(p.startswith("tasks[1].command: mpiexec.hydra is") for p in problems(batch)), problems(batch)
    assert parse_jobspec("name: j\ncommand: mpirun -np 2 python t.py\nmode: horovod\nimage: x\n").image == "x"


def test_deepspeeds_runner_with_an_image_is_refused_with_the_way_out() -> None:
    found = problems("name: j\ncommand: deepspeed t.py\nmode: pytorch-deepspeed\nnodes: 2\nimage: x\n")
    assert any("has no program of each rank to start in it" in p for p in found), found


# -- the plan ------------------------------------------------------------------------------------------------------


def base(mode: str, run_root: str = "~/.ftconsole/runs/c1") -> LaunchInput:
    return LaunchInput(
        job_id="7", attempt=2, mode=mode, argv=(), env={"SEED": "1"}, workdir="/work",
        nodes=(NodeAssignment("node01", "10.0.0.1", (0, 1)), NodeAssignment("node02", "10.0.0.2", (2, 3))),
        master_port=29500, run_root=run_root,
    )  # fmt: skip


def images(python: str = "/opt/py/bin/python3") -> Images:
    cdi = RuntimeChoice("podman", "/usr/bin/podman", "cdi")
    docker = RuntimeChoice("docker", "/usr/bin/docker", "gpus")
    return Images({"node01": cdi, "node02": docker}, ContainerSettings(), "c0ffee", python)


def hybrid_plan(mode: str, run_root: str = "~/.ftconsole/runs/c1"):
    spec = parse_jobspec(f"name: j\ncommand: python train.py --lr 1\nmode: {mode}\nnodes: 2\nimage: img:1\n"
                         "workdir: /work\nmounts: [{from: /data, to: /data, readonly: true}]\n")  # fmt: skip
    return plan_job(spec, base(mode, run_root), images=images())


def script_doc(text: bytes) -> dict:
    first = text.decode().splitlines()[1]  # PARAMS = json.loads('...')
    return json.loads(eval(first.split("json.loads(", 1)[1][:-1]))


@pytest.mark.parametrize("mode", ["horovod", "mpich"])
def test_mpirun_runs_on_the_host_and_starts_each_process_through_container_py(mode: str) -> None:
    plan = hybrid_plan(mode)
    assert [r.launch for r in plan.plan.ranks] == [True, False]
    steps = plan.steps[0]
    assert [(s.kind, s.name) for s in steps] == [
        (StepKind.PULL, PULL_STEP), (StepKind.BEFORE, "ssh check"), (StepKind.COMMAND, "command")
    ]  # fmt: skip
    assert steps[0].container["name"] == "ft-c0ffee-r0" and steps[-1].container is None  # mpirun is on the host
    argv = steps[-1].argv
    wrapper = argv.index("/opt/py/bin/python3")
    assert argv[0] == "mpirun" and argv[wrapper + 1] == "-c"
    assert argv[wrapper + 3] == f".ftconsole/runs/c1/7/2/{HYBRID_SCRIPT}"  # under each node's own home
    assert argv[wrapper + 4 :] == ("python", "train.py", "--lr", "1")  # the program, never in a shell
    if mode == "mpich":
        assert argv[1:3] == ("-pmi-port", "-envlist")
        assert set(argv[3].split(",")) >= {"SEED", "FT_JOB_ID", "PATH", "MASTER_ADDR"} and "HOME" not in argv[3]
    for rank in plan.plan.ranks:  # every node writes the same script into its attempt folder
        assert rank.files[f"../{HYBRID_SCRIPT}"] == plan.plan.ranks[0].files[f"../{HYBRID_SCRIPT}"]
    doc = script_doc(plan.plan.ranks[1].files[f"../{HYBRID_SCRIPT}"])
    assert doc["token"] == "c0ffee" and doc["image"] == "img:1"
    assert [(n["rank"], n["first"], n["slots"]) for n in doc["nodes"]] == [(0, 0, 2), (1, 2, 2)]
    second = doc["nodes"][1]["container"]
    assert (second["runtime"], second["gpus"], second["gpu_via"]) == ("docker", [2, 3], "gpus")  # each node's own
    assert second["mounts"] == [{"from": "/data", "to": "/data", "readonly": True}]
    assert "~/.ftconsole/runs/c1/7/2/1" in second["shares"] and "/work" in second["shares"]


def test_an_absolute_run_root_names_the_script_by_its_path() -> None:
    argv = hybrid_plan("horovod", "/scratch/ft/runs/c1").steps[0][-1].argv
    assert f"/scratch/ft/runs/c1/7/2/{HYBRID_SCRIPT}" in argv


def test_the_wrapper_goes_only_under_the_mpirun_line_ftconsole_writes() -> None:
    inp = base("horovod")
    with pytest.raises(LaunchError, match="not in mode pytorch"):
        plan_launch(
            LaunchInput(**{**inp.__dict__, "mode": "pytorch", "argv": ("python", "t.py"), "rank_wrapper": ("w",)})
        )
    with pytest.raises(LaunchError, match="for mpirun"):
        plan_launch(LaunchInput(**{**inp.__dict__, "argv": ("mpirun", "python"), "rank_wrapper": ("w",)}))


# -- container.py on a node ------------------------------------------------------------------------------------


DOC = {
    "token": "tok",
    "image": "img:1",
    "nodes": [
        {"rank": 0, "first": 0, "slots": 2, "container": {"runtime": "podman", "gpus": [0, 1], "gpu_via": "cdi"}},
        {"rank": 1, "first": 2, "slots": 1, "container": {"runtime": "podman", "gpus": [5], "gpu_via": "cdi"}},
    ],
}


def test_each_process_finds_its_node_by_its_mpi_rank_and_checks_the_launchers_local_rank() -> None:
    assert hybrid.mpi_rank({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}) == (2, 0)
    assert hybrid.mpi_rank({"PMI_ID": "1", "MPI_LOCALRANKID": "1"}) == (1, 1)  # hydra with -pmi-port
    assert hybrid.node_of(DOC, 1, 1)["rank"] == 0 and hybrid.node_of(DOC, 2, 0)["rank"] == 1
    with pytest.raises(hybrid.HybridError, match="did not place the processes by slot"):
        hybrid.node_of(DOC, 1, 0)  # -map-by node would put rank 1 on the second node
    with pytest.raises(hybrid.HybridError, match="beyond the 3 slots"):
        hybrid.node_of(DOC, 3, None)
    with pytest.raises(hybrid.HybridError, match="no MPI rank"):
        hybrid.mpi_rank({"RANK": "0"})


def test_a_process_container_shares_the_hosts_pids_and_the_launchers_session_folder(monkeypatch) -> None:
    env = {"PMIX_SERVER_TMPDIR": "/tmp/ompi.h.0/pid.9", "PATH": "/host/bin", "HOME": "/root", "SEED": "1"}
    container = hybrid.rank_container(DOC, DOC["nodes"][1], 2, env)
    assert container["name"] == "ft-tok-p2" and container["pid_host"] and "/tmp/ompi.h.0/pid.9" in container["shares"]
    assert hybrid.passed_env(env) == ["PMIX_SERVER_TMPDIR", "SEED"]  # the image keeps its own PATH and HOME
    monkeypatch.setattr(node.os.path, "isdir", lambda p: False)
    argv = node.container_argv(dict(container, path="/usr/bin/podman", image="img:1"), ["a"], ["SEED"], "/w", 0, 0)
    assert argv[:7] == ["/usr/bin/podman", "run", "--rm", "--pull", "never", "--name", "ft-tok-p2"]
    assert "--pid host" in " ".join(argv) and "--init" not in argv  # podman refuses an init in the host's pids


@pytest.fixture
def attempt(tmp_path: Path) -> Path:
    """An attempt folder of this "node" with the script written by the plan, and a stand-in podman that records
    its argv (``run``: then sleeps, as a running container's client does; ``rm``: records the removal)."""
    runtime = tmp_path / "podman"
    record = tmp_path / "calls"
    runtime.write_text(f"#!/bin/sh\necho \"$$ $*\" >> {record}\n[ \"$1\" = run ] && exec sleep 60\n"
                       f"[ \"$1\" = image ] && exit 0\nexit 0\n")  # fmt: skip
    runtime.chmod(0o755)
    spec = parse_jobspec("name: j\ncommand: python t.py\nmode: horovod\nnodes: 2\nimage: img:1\n")
    choice = RuntimeChoice("podman", str(runtime), None)
    plan = plan_job(spec, base("horovod", str(tmp_path / "runs")), images=Images(
        {"node01": choice, "node02": choice}, ContainerSettings(), "tok", sys.executable))  # fmt: skip
    folder = tmp_path / "runs" / "7" / "2"
    (folder / "1").mkdir(parents=True)  # only node rank 1's run folder is on this "node"
    (folder / HYBRID_SCRIPT).write_bytes(plan.plan.ranks[1].files[f"../{HYBRID_SCRIPT}"])
    return folder


def start(attempt: Path, argv: tuple[str, ...], **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", HYBRID_LOADER, str(attempt / HYBRID_SCRIPT), *argv],
        env={"PATH": os.environ["PATH"], "HOME": str(attempt), **env}, stderr=subprocess.PIPE,
    )  # fmt: skip


def calls(attempt: Path) -> list[str]:
    path = attempt.parents[2] / "calls"
    return path.read_text().splitlines() if path.exists() else []


def until(what: str, check) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT:g}s: {what}")


def test_container_py_becomes_the_runtime_client_and_its_reaper_removes_the_container_after_a_kill(attempt) -> None:
    proc = start(attempt, ("python", "t.py"), OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_LOCAL_RANK="1", SEED="x")
    try:
        until("the runtime's run", lambda: any(" run " in c for c in calls(attempt)))
        pid, run = next(c for c in calls(attempt) if " run " in c).split(" ", 1)
        assert pid == str(proc.pid)  # the same process, now the client (exec): the launcher's signals reach it
        assert "--name ft-tok-p3 --pid host" in run and run.endswith("img:1 python t.py"), run
        assert "--env SEED" in run and "--env PATH" not in run, run
        proc.kill()
        proc.communicate(timeout=WAIT)
        until("the reaper's removal", lambda: any(c.endswith(" rm --force --time 0 ft-tok-p3") for c in calls(attempt)))
    finally:
        proc.kill()
        proc.communicate(timeout=WAIT)


def test_container_py_refuses_a_process_whose_node_folder_is_not_here(attempt) -> None:
    proc = start(attempt, ("python", "t.py"), OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0")
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == -signal.SIGTERM  # hydra cleans up the other processes only after a signal
    assert b"MPI rank 0 belongs to node rank 0, whose run folder" in err and b"is not on this node" in err
    assert calls(attempt) == []  # nothing was started


def test_container_py_is_one_python38_script_of_stdlib_modules_each_name_defined_once() -> None:
    folder = Path(hybrid.__file__).parent
    assert modules(folder, "container_exec") == [
        "proc", "supervisor_files", "supervisor_container", "container_exec"
    ]  # fmt: skip
    program = python_stdin_script(script("container_exec"), DOC)
    ast.parse(program, feature_version=(3, 8))
    assert imported_modules(program) <= set(sys.stdlib_module_names)
    where: dict[str, str] = {}
    for name in modules(folder, "container_exec"):
        for stmt in ast.parse((folder / f"{name}.py").read_text()).body:
            if isinstance(stmt, ast.FunctionDef | ast.ClassDef | ast.Assign):
                if isinstance(stmt, ast.Assign):
                    names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
                else:
                    names = [stmt.name]
                for symbol in names:
                    assert symbol not in where, f"{symbol} in {where.get(symbol)} and {name}"
                    where[symbol] = name


def test_the_first_nodes_read_counts_the_io_of_the_mpi_processes_containers(tmp_path: Path) -> None:
    """container.py writes each container's id into its node's run folder (``ft-<token>-p<rank>.cid``): the
    status read of the first node's rank (mpirun's) adds the I/O of those containers' processes, found by the
    id in their cgroup, to that of mpirun's process group."""
    from ftconsole.scheduler.node.proc import start_time
    from ftconsole.scheduler.node.supervisor_scan import _io, _with_io

    leader = subprocess.Popen(["sleep", "30"], start_new_session=True)  # mpirun's group, doing no I/O
    try:
        settled: list[int | None] = [None]  # sleep reads its libraries as it starts: wait until it is done

        def still() -> bool:
            before, settled[0] = settled[0], _io([leader.pid])
            time.sleep(0.1)
            return before is not None and before == settled[0] == _io([leader.pid])

        until("sleep's I/O settles", still)
        status = {"state": "running", "pgid": leader.pid, "pid_start": start_time(leader.pid)}
        groups = {leader.pid: [leader.pid]}
        cid = "ab" * 32
        (tmp_path / "ft-tok-p1.cid").write_text(cid + "\n")
        cgroups = {os.getpid(): f"0::/machine/libpod-{cid}.scope\n"}  # this process stands for the container's
        alone = _with_io(status, groups, {}, None)["io"]
        with_containers = _with_io(status, groups, cgroups, str(tmp_path))["io"]
        assert with_containers > alone  # this test process has read and written far more than `sleep`
        (tmp_path / "ft-tok-p1.cid").unlink()
        assert _with_io(status, groups, cgroups, str(tmp_path))["io"] == alone
    finally:
        leader.kill()
        leader.wait(WAIT)
