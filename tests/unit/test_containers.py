"""Container images (issue 17) from tables: the spec's keys, the config, which runtime a node runs images with,
what each rank's steps carry, and the runtime's command the node builds from them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ftconsole.scheduler.decide.jobplan import PULL_STEP, Images, plan_job
from ftconsole.scheduler.decide.launcher import LaunchInput, NodeAssignment
from ftconsole.scheduler.decide.placement import Candidate, ClusterState, JobRequest, NodeSlot, Place, Wait, plan
from ftconsole.scheduler.decide.steps import StepKind
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.node import supervisor_container as node
from ftconsole.scheduler.spec.config import ClusterConfig
from ftconsole.scheduler.spec.containers import (
    ContainerSettings,
    Mount,
    RuntimeChoice,
    container_step,
    pick_runtime,
    run_root_problem,
    why_not,
)
from ftconsole.scheduler.spec.jobspec import parse_jobspec

PODMAN_CDI = {"name": "podman", "path": "/usr/bin/podman", "usable": True, "gpus": True, "gpus_via": ["CDI"]}
DOCKER_DOWN = {"name": "docker", "path": "/usr/bin/docker", "usable": False, "problem": "daemon not reachable",
               "gpus": False, "gpus_via": ["--gpus (toolkit)"]}  # fmt: skip
DOCKER = {"name": "docker", "path": "/usr/bin/docker", "usable": True, "gpus": True,
          "gpus_via": ["nvidia runtime", "--gpus (toolkit)"]}  # fmt: skip
SINGULARITY = {
    "name": "singularity",
    "path": "/opt/bin/singularity",
    "usable": True,
    "gpus": True,
    "gpus_via": ["--nv"],
}
PODMAN_NO_GPUS = {"name": "podman", "path": "/usr/bin/podman", "usable": True, "gpus": False, "gpus_via": []}


def spec(text: str):
    return parse_jobspec("name: j\ncommand: python train.py\n" + text)


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        spec(text)
    return [p.message for p in err.value.problems]


# -- the spec ----------------------------------------------------------------------------------------------------


def test_image_and_mounts_round_trip() -> None:
    s = spec("image: nvcr.io/nvidia/pytorch:24.05-py3\nmounts:\n- {from: /data/imagenet, to: /data, readonly: true}\n")
    assert s.image == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert s.mounts == [Mount.model_validate({"from": "/data/imagenet", "to": "/data", "readonly": True})]
    assert type(s).from_json(s.to_json()) == s
    assert spec("").image is None and "image" not in spec("").to_json()  # without image nothing changes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mounts: [{from: /a, to: /a}]\n", "give `image` too"),
        ("image: x\nmounts: [{from: data, to: /data}]\n", "must be an absolute path or start with ~/"),
        ("image: x\nmounts: [{from: /data, to: ~/data}]\n", "must be an absolute path (a path inside the container)"),
        ("image: x\nmounts: [{from: /a/../b, to: /data}]\n", "without '..'"),
        ("image: x\nmounts: [{from: '/a:b', to: /data}]\n", "cannot be given to the runtimes' mount options"),
        ("image: x\nmounts: [{from: /a, to: /}]\n", "/ is the image's own root"),
        ("image: x\nmounts: [{from: /a, to: /data}, {from: /b, to: /data/}]\n", "/data is also mounts[0].to"),
        ("image: '-v /:/host'\n", "is not an image"),
        ("image: 'a b'\n", "is not an image"),
        ("image: x\nmounts: [{from: /a, to: /b, rw: true}]\n", "unknown key"),
    ],
)
def test_bad_image_or_mounts_are_refused_with_the_reason(text: str, expected: str) -> None:
    assert any(expected in p for p in problems(text)), problems(text)


def test_a_one_node_mpi_job_may_have_an_image() -> None:
    assert spec("image: x\nmode: horovod\n").image == "x"  # mpirun starts its local ranks inside the container


def test_a_mount_over_the_run_folders_is_refused_where_the_run_root_is_absolute() -> None:
    mounts = [Mount.model_validate({"from": "/scratch", "to": "/var/lib/ft"})]
    assert "would be over this cluster's run folders" in (run_root_problem(mounts, "/var/lib/ft/runs/{user}") or "")
    assert run_root_problem(mounts, "~/.ftconsole/runs") is None  # checked on the node, where ~ is known
    assert run_root_problem([Mount.model_validate({"from": "/a", "to": "/data"})], "/var/lib/ft/runs") is None


# -- the config --------------------------------------------------------------------------------------------------


def test_config_runtime_per_pool_and_ulimits() -> None:
    config = ClusterConfig.model_validate(
        {"containers": {"runtime": "singularity", "ulimits": {"memlock": "unlimited", "stack": 67108864}},
         "pools": {"a100": {"containers": {"runtime": "docker"}}}}
    )  # fmt: skip
    assert config.runtime_for("a100") == "docker"
    assert config.runtime_for("other") == "apptainer"  # singularity: apptainer's older name, the same command line
    assert config.containers.ulimits == {"memlock": "-1:-1", "stack": "67108864:67108864"}
    assert ClusterConfig().containers == ContainerSettings(runtime="auto", ulimits={"memlock": "-1:-1"})


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"runtime": "enroot"}, "enroot is not supported: enroot (with pyxis) needs an import"),
        ({"runtime": "lxc"}, "Input should be 'auto', 'podman', 'docker' or 'apptainer'"),
        ({"ulimits": {"stacks": 1}}, "'stacks' is not a ulimit the runtimes know"),
        ({"ulimits": {"nofile": "lots"}}, "nofile: 'lots' is not a limit"),
        ({"image": "x"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_containers_config_is_refused(section: dict, expected: str) -> None:
    with pytest.raises(ValueError, match="containers") as err:
        ClusterConfig.model_validate({"containers": section})
    assert expected in str(err.value)


# -- a node's runtime --------------------------------------------------------------------------------------------


def test_auto_takes_the_first_usable_runtime_that_gives_gpus() -> None:
    assert pick_runtime([DOCKER_DOWN, PODMAN_CDI], "auto") == RuntimeChoice("podman", "/usr/bin/podman", "cdi")
    assert pick_runtime([PODMAN_NO_GPUS, SINGULARITY], "auto") == RuntimeChoice(
        "apptainer", "/opt/bin/singularity", "nv"
    )
    assert pick_runtime([DOCKER], "auto") == RuntimeChoice("docker", "/usr/bin/docker", "gpus")  # --gpus first
    assert pick_runtime([PODMAN_NO_GPUS], "auto") is None
    assert pick_runtime([PODMAN_NO_GPUS], "auto", gpus=False) == RuntimeChoice("podman", "/usr/bin/podman", None)
    assert pick_runtime([PODMAN_CDI], "docker") is None
    assert pick_runtime([{"name": "enroot", "path": "/usr/bin/enroot", "usable": True, "gpus_via": ["nvidia hook"]}],
                        "auto") is None  # fmt: skip


def test_why_a_node_cannot_run_images() -> None:
    assert why_not([], "auto") == "no container runtime was found on its PATH"
    assert why_not([PODMAN_CDI], "docker") == "it has no docker (found: podman)"
    assert why_not([DOCKER_DOWN], "auto") == "docker is not usable: daemon not reachable"
    assert "podman cannot give GPUs" in why_not([PODMAN_NO_GPUS], "podman")


def test_placement_sends_an_image_job_only_where_a_runtime_can_run_it() -> None:
    nodes = (
        NodeSlot("n1", "default", "H100", "550", 8),
        NodeSlot("n2", "default", "H100", "550", 8, images=True),
    )
    job = JobRequest(id="1", submitted_at=0.0, candidates=(Candidate(None, 8, None),), image=True)
    decisions = plan(ClusterState(nodes=nodes, allocations=()), [job], now=0.0)
    assert isinstance(decisions[0], Place) and [n for n, _ in decisions[0].nodes] == ["n2"]
    two = JobRequest(id="2", submitted_at=0.0, nodes=2, candidates=(Candidate(None, 8, None),), image=True)
    waiting = plan(ClusterState(nodes=nodes, allocations=()), [two], now=0.0)[0]
    assert isinstance(waiting, Wait)
    assert "whose container runtime can run its image with GPUs" in waiting.reason


# -- each rank's steps ---------------------------------------------------------------------------------------------


def base(nodes=(("node01", (0, 1)), ("node02", (2, 3)))) -> LaunchInput:
    return LaunchInput(
        job_id="7", attempt=2, mode="pytorch", argv=(), env={"SEED": "1"}, workdir="/work",
        nodes=tuple(NodeAssignment(n, f"10.0.0.{i}", g) for i, (n, g) in enumerate(nodes, 1)),
        master_port=29500, run_root="/runs/c1", output_dir="/shared/out", checkpoint_dir="/shared/out/checkpoints",
    )  # fmt: skip


def test_each_rank_pulls_then_runs_its_command_in_a_container_named_by_the_token() -> None:
    s = spec("mode: pytorch\nnodes: 2\nimage: localhost/train:1\nworkdir: /work\noutput: /shared/out\n"
             "mounts: [{from: /data/imagenet, to: /data, readonly: true}]\nhooks: {before: echo hi}\n")  # fmt: skip
    choice = RuntimeChoice("podman", "/usr/bin/podman", "cdi")
    images = Images({"node01": choice, "node02": choice}, ContainerSettings(), "c0ffee")
    plan = plan_job(s, base(), images=images)
    kinds = {rank: [(st.kind, st.name) for st in steps] for rank, steps in plan.steps.items()}
    assert kinds[0] == [(StepKind.PULL, PULL_STEP), (StepKind.BEFORE, "before hook"), (StepKind.COMMAND, "command")]
    assert kinds[1] == [(StepKind.PULL, PULL_STEP), (StepKind.COMMAND, "command")]
    command = plan.steps[1][-1]
    assert command.container == {
        "runtime": "podman", "path": "/usr/bin/podman", "image": "localhost/train:1", "name": "ft-c0ffee-r1",
        "gpus": [2, 3], "gpu_via": "cdi", "mounts": [{"from": "/data/imagenet", "to": "/data", "readonly": True}],
        "shares": ["/runs/c1/7/2/1", "/shared/out", "/shared/out/checkpoints", "/work"],
        "ulimits": {"memlock": "-1:-1"},
    }  # fmt: skip
    assert plan.steps[0][1].container is None  # the hook runs on the node
    assert plan.steps[1][0].to_json()["container"]["name"] == "ft-c0ffee-r1"
    assert "container" not in plan_job(s, base()).steps[0][-1].to_json()  # placement's look: nothing wrapped


def test_a_containers_step_names_it_and_torchs_trace_hook_is_shared_with_it() -> None:
    """FT_CONTAINER lets `ftconsole debug` find the container's processes (not the step's: the runtime's monitor
    started them); with torch's trace on, the attempt's torch-hook folder is shared at its own path."""
    s = spec("mode: pytorch\nnodes: 2\nimage: localhost/train:1\nworkdir: /work\noutput: /shared/out\n")
    choice = RuntimeChoice("podman", "/usr/bin/podman", "cdi")
    images = Images({"node01": choice, "node02": choice}, ContainerSettings(), "c0ffee")
    plan = plan_job(s, dataclasses.replace(base(), torch_trace=True), images=images)
    command = plan.steps[1][-1]
    assert command.env["FT_CONTAINER"] == "ft-c0ffee-r1" and "FT_CONTAINER" not in plan.steps[1][0].env  # not pull
    assert command.container is not None and "/runs/c1/7/2/torch-hook" in command.container["shares"]
    assert command.env["PYTHONPATH"].split(":")[0] == "/runs/c1/7/2/torch-hook"


def test_batch_tasks_get_one_container_each() -> None:
    s = parse_jobspec(
        "name: b\ntype: batch\nimage: x\ntasks:\n- {name: a, command: 'true', output: a}\n"
        "- {name: b, command: 'true', output: b}\n"
    )
    images = Images({"node01": RuntimeChoice("docker", "/usr/bin/docker", "gpus")}, ContainerSettings(), "t0k")
    plan = plan_job(s, base((("node01", (0,)),)), images=images)
    assert [st.container["name"] for st in plan.steps[0] if st.container] == [
        "ft-t0k-r0",
        "ft-t0k-r0-t0",
        "ft-t0k-r0-t1",
    ]


# -- the node's command ----------------------------------------------------------------------------------------


def doc(runtime: str = "podman", via: str | None = "cdi", **extra) -> dict:
    choice = RuntimeChoice(runtime, f"/usr/bin/{runtime}", via)
    mounts = [Mount.model_validate(m) for m in extra.pop("mounts", [])]
    return container_step(choice, image="img:1", name="ft-tok-r0", gpus=extra.pop("gpus", [2, 3]), mounts=mounts,
                          shares=extra.pop("shares", []), settings=ContainerSettings())  # fmt: skip


def test_podman_as_root_with_cdi(monkeypatch) -> None:
    monkeypatch.setattr(node.os.path, "isdir", lambda p: False)
    argv = node.container_argv(doc(), ["python", "train.py"], {"SEED": "1", "RANK": "0"}, "/work", 0, 0)
    assert argv == [
        "/usr/bin/podman", "run", "--rm", "--init", "--pull", "never", "--name", "ft-tok-r0", "--network", "host",
        "--ipc", "host", "--workdir", "/work", "--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3",
        "--ulimit", "memlock=-1:-1", "--env", "CUDA_VISIBLE_DEVICES", "--env", "RANK", "--env", "SEED",
        "img:1", "python", "train.py",
    ]  # fmt: skip
    assert node.container_gpu_env(doc()) == "0,1"  # the container sees its two GPUs only, numbered from 0


def test_rootless_podman_keeps_the_users_id_and_docker_runs_as_the_user(monkeypatch) -> None:
    monkeypatch.setattr(node.os.path, "isdir", lambda p: False)
    assert "--userns keep-id" in " ".join(node.container_argv(doc(), ["x"], {}, "/w", 1000, 1000))
    docker = node.container_argv(doc("docker", "gpus"), ["x"], {}, "/w", 1000, 100)
    assert docker[docker.index("--user") + 1] == "1000:100"
    assert docker[docker.index("--gpus") + 1] == '"device=2,3"'
    nvidia = " ".join(node.container_argv(doc("docker", "nvidia-runtime"), ["x"], {}, "/w", 0, 0))
    assert "--runtime nvidia --env NVIDIA_VISIBLE_DEVICES=2,3" in nvidia
    hidden = " ".join(node.container_argv(doc("podman", "hook", gpus=[]), ["x"], {}, "/w", 0, 0))
    assert "NVIDIA_VISIBLE_DEVICES=void" in hidden


def test_infiniband_devices_go_in_where_the_node_has_them(monkeypatch) -> None:
    monkeypatch.setattr(node.os.path, "isdir", lambda p: p == node.IB_DEVICES)
    argv = " ".join(node.container_argv(doc(), ["x"], {}, "/w", 0, 0))
    assert "--device /dev/infiniband --cap-add IPC_LOCK" in argv


def test_mounts_then_shared_folders_not_under_a_mount(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "data" / "sub").mkdir(parents=True)
    shares = [str(tmp_path / "work"), str(tmp_path / "data" / "sub"), str(tmp_path / "missing")]
    d = doc(mounts=[{"from": "/srv/ds", "to": str(tmp_path / "data"), "readonly": True}], shares=shares)
    assert node.container_binds(d) == [
        ("/srv/ds", str(tmp_path / "data"), True),  # data/sub is under the job's own mount: not shared again
        (str(tmp_path / "work"), str(tmp_path / "work"), False),
    ]
    argv = node.container_argv(d, ["x"], {}, "/w", 0, 0)
    assert f"/srv/ds:{tmp_path}/data:ro" in argv


def test_a_mount_over_the_run_folder_is_refused_on_the_node() -> None:
    d = doc(mounts=[{"from": "/scratch", "to": "/root/.ftconsole"}])
    assert "would hide this rank's run folder" in (
        node.container_mount_problem(d, "/root/.ftconsole/runs/c/1/1/0") or ""
    )
    assert node.container_mount_problem(d, "/home/u/.ftconsole/runs/c/1/1/0") is None


def test_apptainer_exec_with_nv_and_binds(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    d = doc("apptainer", "nv", mounts=[{"from": "/srv/ds", "to": "/data", "readonly": True}])
    d["image"] = "docker://nvcr.io/nvidia/pytorch:24.05-py3"
    argv = node.container_argv(d, ["python", "t.py"], {"SEED": "1"}, "/work", 1000, 1000)
    sif = node.apptainer_image(d)
    assert sif.startswith(str(tmp_path / ".ftconsole" / "images")) and sif.endswith(".sif")
    assert argv == ["/usr/bin/apptainer", "exec", "--pwd", "/work", "--nv", "--bind", "/srv/ds:/data:ro", sif,
                    "python", "t.py"]  # fmt: skip
    assert node.container_gpu_env(d) == "2,3"  # --nv shows every GPU: the host's indexes pick them
    assert node.image_pull_argv(d) == ["/usr/bin/apptainer", "pull", node.partial_sif(d), d["image"]]
    assert not node.image_present(d)
    local = dict(d, image="~/images/train.sif")
    assert node.apptainer_image(local) == os.path.expanduser("~/images/train.sif")
    assert node.image_pull_argv(local) is None  # a path: nothing to pull (and the step says so when it is missing)
