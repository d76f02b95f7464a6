"""Jobs with `image` on real sshd nodes, in real podman containers (issue 17).

The nodes run podman under the lab's configuration (tests/podman_lab.py: runc, cgroupfs, a private store, a
CDI spec that makes `--device nvidia.com/gpu=N` work with simulated GPUs). The lab image holds only a marker
file: the job's program is this machine's Python, mounted read-only through the job's own `mounts`. What is
checked is what exists: files the ranks wrote from inside their containers, the containers podman lists, the
processes left on the nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.steps import Step, StepKind
from ftconsole.scheduler.errors import NotRunning
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from ftconsole.scheduler.spec.containers import ContainerSettings, Mount, RuntimeChoice, container_step
from ftconsole.scheduler.ssh.runs import RunStatus, node_runs, run_states, start_run, stop_runs
from ftconsole.scheduler.ssh.transport import SSHPool
from tests.integration.test_scheduler_sshd import finished, job, log_of, poll, running, until, write_config
from tests.podman_lab import PodmanLab, podman_lab_fixture  # noqa: F401  (the fixture)
from tests.sshd_cluster import HOME_LAYOUTS, SshdCluster

pytestmark = pytest.mark.sshd
WAIT = 60.0

# what each rank reports from inside its container
PROBE = r"""
import errno, json, os, sys
keys = ("FT_", "FTLAB_", "CUDA_", "NVIDIA_", "RANK", "WORLD")
out = {"env": {k: v for k, v in os.environ.items() if k.startswith(keys)}}
out["marker"] = open("/etc/ftlab-image").read()
out["data"] = open("/data/input.txt").read()
try:
    open("/data/written-from-the-container", "w").write("x")
    out["write"] = "written"
except OSError as exc:
    out["write"] = errno.errorcode.get(exc.errno, str(exc.errno))
out["cwd"] = os.getcwd()
out["uid"] = os.getuid()
path = os.path.join(os.environ["FT_OUTPUT_DIR"], "rank%s.json" % os.environ["RANK"])
json.dump(out, open(path, "w"))
print("rank", os.environ["RANK"], "reported")
"""


def lab_config(
    cluster: SshdCluster, lab: Any, root: Path, sock_dir: Path, python: Path | None = None, runtime: str = "podman"
) -> LoadedConfig:
    """A config whose nodes run `runtime` under `lab` (the podman or docker lab): its python wrapper, its ulimits."""
    return write_config(
        cluster, root, sock_dir,
        ssh={"python": str(python or lab.python_wrapper(root))},
        containers={"runtime": runtime, "ulimits": lab.ulimits},
        probes={"interval": "30s"},
    )  # fmt: skip


def image_job(name: str, command: str, lab: Any, **fields: Any) -> dict[str, Any]:
    """A job in the lab's image (or `image`), with the host's programs mounted, and `mounts` after them."""
    mounts = [*lab.host_mounts, *fields.pop("mounts", [])]
    return job(name, command, image=fields.pop("image", lab.image), mounts=mounts, **fields)


async def ranks_report_from_the_image(
    sshd_cluster: Any, lab: Any, tmp_path: Path, sock_dir: Path, runtime: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """A 2-node job that runs PROBE in the image with a read-only data mount: checks what every runtime must
    give (the image, the env, the mount, the workdir, CUDA_VISIBLE_DEVICES 0, no container left); returns each
    rank's run and environment for the runtime's own GPU checks."""
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    data, out, work = tmp_path / "data", tmp_path / "out", tmp_path / "work"
    for folder in (data, out, work):
        folder.mkdir()
    (data / "input.txt").write_text("the data set\n")
    (work / "probe.py").write_text(PROBE)
    loaded = lab_config(cluster, lab, tmp_path, sock_dir, runtime=runtime)
    spec = image_job(
        "in-image", f"sh -c 'exec {sys.executable} probe.py'", lab, mode="pytorch", nodes=2, workdir=str(work),
        output=str(out), mounts=[{"from": str(data), "to": "/data", "readonly": True}],
    )  # fmt: skip
    async with running(loaded) as (_, client):
        job_id = (await client.call("submit", spec=spec))["id"]
        ended = await finished(client, job_id)
        logs = [await log_of(client, job_id, rank=rank) for rank in (0, 1)]
    assert ended["status"] == "succeeded", (ended, logs)
    assert all(f"image {lab.image} is on this node: not pulled" in log for log in logs), logs
    seen = []
    for rank, run in enumerate(ended["attempts"][0]["runs"]):
        report = json.loads((out / f"rank{rank}.json").read_text())
        assert report["marker"] == lab.marker  # the image's own file: the rank ran in the image
        assert report["data"] == "the data set\n" and report["write"] == "EROFS"  # the read-only mount
        assert report["cwd"] == str(work) and report["uid"] == 0  # --workdir; root (docker: --user 0:0)
        env = report["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["FT_JOB_ID"]) == (str(rank), "2", str(job_id))
        assert env["CUDA_VISIBLE_DEVICES"] == "0"  # its one GPU, numbered from 0 inside
        seen.append((run, env))
    assert not (data / "written-from-the-container").exists()
    assert lab.containers("ft-") == []  # each container was removed when its rank ended
    return seen


async def test_ranks_run_in_the_image_with_their_env_gpus_and_mounts(sshd_cluster, podman_lab, tmp_path, sock_dir):
    for run, env in await ranks_report_from_the_image(sshd_cluster, podman_lab, tmp_path, sock_dir, "podman"):
        gpu = run["gpus"][0]
        assert [k for k in env if k.startswith("FTLAB_CDI_GPU_")] == [f"FTLAB_CDI_GPU_{gpu}"]  # that GPU only


# -- a node that cannot run images, a pull that fails -----------------------------------------------------------


def broken_podman_on_node01(lab: PodmanLab, root: Path) -> Path:
    """The lab's python wrapper, but node01's PATH starts with a podman that fails (`podman info` too)."""
    fake = root / "broken-bin"
    fake.mkdir()
    (fake / "podman").write_text("#!/bin/sh\necho 'Error: this podman is broken on purpose' >&2\nexit 125\n")
    (fake / "podman").chmod(0o755)
    script = root / "python-node01-broken"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in lab.env.items())
    script.write_text(
        f"#!/bin/sh\n{exports}"
        f'if [ "$FTCONSOLE_LAB_NODE" = node01 ]; then PATH={fake}:$PATH; export PATH; fi\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    script.chmod(0o755)
    return script


async def test_image_jobs_avoid_a_node_without_a_runtime_and_a_failed_pull_fails_alone(
    sshd_cluster, podman_lab, tmp_path, sock_dir
) -> None:
    lab: PodmanLab = podman_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = lab_config(cluster, lab, tmp_path, sock_dir, python=broken_podman_on_node01(lab, tmp_path))
    async with running(loaded) as (_, client):
        nodes = await poll(lambda: client.call("nodes"), lambda ns: all(n.get("facts") for n in ns), "probes")
        podman = {n["name"]: [r for r in n["facts"]["runtimes"] if r["name"] == "podman"] for n in nodes}
        assert podman["node01"][0]["usable"] is False and podman["node02"][0]["gpus"] is True
        wide = (await client.call("submit", spec=image_job("wide", "true", lab, mode="pytorch", nodes=2)))["id"]
        ok = (await client.call("submit", spec=image_job("ok", "true", lab)))["id"]
        waiting = await until(client, wide, lambda j: "container runtime" in j["message"], "wide waiting")
        assert "whose container runtime can run its image with GPUs; only 1 usable node" in waiting["message"]
        done = await finished(client, ok)
        assert done["status"] == "succeeded" and [r["node"] for r in done["attempts"][0]["runs"]] == ["node02"]
        # no registry answers at localhost:1: the pull fails on the node, and says why
        missing = image_job("nopull", "true", lab)
        missing["image"] = "localhost:1/ftlab/missing:1"
        bad = (await client.call("submit", spec=missing))["id"]
        failed = await finished(client, bad)
        log = await log_of(client, bad)
        await client.call("stop", jobs=[wide])
        nodes = {n["name"]: n for n in await client.call("nodes")}
    assert failed["status"] in ("failed", "error"), failed
    assert "pull image exited with code" in failed["message"], failed["message"]
    assert "localhost:1" in failed["message"]  # podman's own words name the registry it could not reach
    assert "localhost:1/ftlab/missing:1" in log
    assert nodes["node02"]["state"] == "healthy"  # the node is fine: a bad image is the job's trouble
    assert lab.containers("ft-") == []


# -- stop, and a scheduler killed with -9 ----------------------------------------------------------------------


def serve(config: Path, root: Path) -> subprocess.Popen[bytes]:
    with open(root / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ftconsole.cli", "--config", str(config), "serve"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )  # fmt: skip


async def call(sock: Path, op: str, **args: Any) -> Any:
    """One API call, retried while no scheduler answers (it is starting)."""

    async def once() -> Any:
        try:
            async with await ApiClient.connect(sock) as client:
                return {"ok": await client.call(op, **args)}
        except (TimeoutError, NotRunning, OSError):
            return None

    return (await poll(once, lambda v: v is not None, f"the scheduler to answer {op}"))["ok"]


@pytest.mark.parametrize("layout", HOME_LAYOUTS)
async def test_a_killed_scheduler_readopts_the_containers_and_a_stop_removes_them(
    sshd_cluster, podman_lab, tmp_path, sock_dir, layout
) -> None:
    """With a shared home too: the new scheduler's sweep of each node meets the other node's run folder and
    leaves its container alone."""
    lab: PodmanLab = podman_lab
    cluster: SshdCluster = sshd_cluster(2, gpus=1, shared_home=layout == "shared-home")
    loaded = lab_config(cluster, lab, tmp_path, sock_dir)
    sock = loaded.socket_path
    first = serve(loaded.file, tmp_path)
    try:
        mark = f"sleeper-{os.getpid()}-{tmp_path.name}"
        spec = image_job("sleeper", "sleep 300", lab, mode="pytorch", nodes=2, env={"FTLAB_TEST_MARK": mark})
        job_id = (await call(sock, "submit", spec=spec))["id"]

        async def show() -> Any:
            return await call(sock, "show", job=job_id)

        shown = await poll(show, lambda j: j["status"] == "running" and len(lab.containers("ft-")) == 2, "2 containers")
        token_names = sorted(lab.containers("ft-"))
        assert [n.rsplit("-", 1)[1] for n in token_names] == ["r0", "r1"]  # ft-<attempt token>-r<rank>
        assert len({n.rsplit("-", 1)[0] for n in token_names}) == 1
        assert len(_marked(mark)) == 2  # a sleep per rank, inside its container
        first.send_signal(signal.SIGKILL)
        first.wait(WAIT)
        assert sorted(lab.containers("ft-")) == token_names  # the ranks live on without the scheduler
        second = serve(loaded.file, tmp_path)
        try:
            again = await show()
            assert again["status"] == "running" and again["attempt"] == shown["attempt"]  # re-adopted, not restarted
            await asyncio.sleep(1.0)  # a few ticks of the new scheduler: it reads the runs, starts nothing
            assert sorted(lab.containers("ft-")) == token_names
            await call(sock, "stop", jobs=[job_id])
            ended = await poll(show, lambda j: j["status"] not in ("queued", "running"), "the stop")
            assert ended["status"] == "stopped"
            left = await poll(lambda: _async_list(lab.containers("ft-")), lambda v: v == [], "containers removed")
            assert left == []
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(WAIT)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(WAIT)
    assert not _marked(mark), "a rank's process outlived its stopped container"


async def _async_list(value: list[str]) -> list[str]:
    return value


def _marked(mark: str) -> list[int]:
    """Processes of this machine whose environment holds FTLAB_TEST_MARK=mark (the job's ranks, in or out of
    their containers)."""
    out = []
    needle = f"FTLAB_TEST_MARK={mark}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ and cmd[:2] == [b"sleep", b"300"]:
            out.append(int(pid))
    return out


# -- the supervisor dies: the container is found by its name ---------------------------------------------------


def one_node(sshd_cluster: Any, lab: PodmanLab, tmp_path: Path, name: str) -> tuple[SSHPool, Any, str, dict]:
    """One sshd node whose supervisor runs podman under the lab, an SSH pool to it, its python, and the
    "container" of a step (podman, one GPU by CDI, the host's programs) named `name`."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    python = str(lab.python_wrapper(tmp_path))
    loaded = load_config(cluster.write_config(tmp_path / "cluster.yaml", ssh={"python": python}))
    container = container_step(
        RuntimeChoice("podman", "/usr/bin/podman", "cdi"), image=lab.image, name=name, gpus=[0],
        mounts=[Mount.model_validate(m) for m in lab.host_mounts], shares=[],
        settings=ContainerSettings(ulimits=lab.ulimits),
    )  # fmt: skip
    return SSHPool.from_config(loaded), loaded.cluster.node_list()[0], python, container


async def test_a_container_whose_supervisor_and_client_died_reads_orphaned_and_a_stop_removes_it(
    sshd_cluster, podman_lab, tmp_path
) -> None:
    lab: PodmanLab = podman_lab
    name = f"ft-orphan{os.getpid()}-r0"
    pool, node, python, container = one_node(sshd_cluster, lab, tmp_path, name)
    step = Step(StepKind.COMMAND, "command", ("sleep", "300"), {}, container=container)
    run_dir = "~/.ftconsole/runs/o1/1/0"
    try:
        await start_run(pool, node, run_dir=run_dir, argv=["sleep", "300"], env={}, workdir="/tmp", steps=[step],
                        token="tok1", python=python)  # fmt: skip

        async def state() -> RunStatus:
            return {r.job: r.status for r in await node_runs(pool, node, python=python)}["o1"]

        running = await poll(state, lambda s: s.state == "running" and lab.containers(name) == [name], "the container")
        os.kill(running.supervisor_pid, signal.SIGKILL)  # the supervisor, then the podman client (the step's group)
        os.killpg(running.pid, signal.SIGKILL)
        orphaned = await poll(state, lambda s: s.state == "orphaned", "the orphaned state")
        assert orphaned.error == "its supervisor died; its container still runs"
        assert lab.containers(name) == [name]
        (answer,) = await stop_runs(pool, node, [run_dir], tokens={run_dir: "tok1"}, python=python)
        assert answer["signalled"] and not answer["alive"]
        assert lab.containers(name) == []  # podman rm --force --time 0: removed by the time the stop answers
        lost = await poll(state, lambda s: s.finished, "the lost state")
        assert lost.state == "lost"
    finally:
        lab.podman("rm", "--force", "--time", "0", name, check=False)
        await pool.close()


async def test_the_hang_detectors_io_counts_the_containers_processes(sshd_cluster, podman_lab, tmp_path) -> None:
    """The step's process group holds only podman's client: the I/O of the program in the container is read
    from its own processes (found by the container id the runtime writes), so a silent rank that reads and
    writes is not taken for hung."""
    lab: PodmanLab = podman_lab
    name = f"ft-io{os.getpid()}-r0"
    pool, node, python, container = one_node(sshd_cluster, lab, tmp_path, name)
    busy = ("sh", "-c", "while :; do head -c 1000000 /dev/zero > /tmp/busy; sleep 0.1; done")  # silent, busy
    run_dir = "~/.ftconsole/runs/io1/1/0"
    try:
        step = Step(StepKind.COMMAND, "command", busy, {}, container=container)
        await start_run(pool, node, run_dir=run_dir, argv=list(busy), env={}, workdir="/tmp", steps=[step],
                        python=python)  # fmt: skip

        async def status() -> RunStatus:
            return (await run_states(pool, node, [run_dir], python=python))[run_dir]

        first = await poll(status, lambda s: s.state == "running" and s.io is not None, "the first I/O count")
        await asyncio.sleep(1.0)
        later = await status()
        assert later.io is not None and first.io is not None
        assert later.io - first.io > 2_000_000, (first.io, later.io)  # megabytes a second, none of them printed
    finally:
        lab.podman("rm", "--force", "--time", "0", name, check=False)
        await pool.close()
