"""Run folders on the nodes are private and do not live forever (issue 11), on real sshd nodes."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftconsole.scheduler.decide.steps import Step, StepKind
from ftconsole.scheduler.ssh.runs import Prune, node_runs, prepare_run, run_states, start_run
from ftconsole.scheduler.ssh.transport import SSHPool
from ftconsole.scheduler.store.db import STORE_FILE, Store
from tests.integration.test_scheduler_sshd import finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd
PY = sys.executable
CID = "c0ffee"
DAY = 86400.0


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def read_as_nobody(path: Path) -> str:
    """What uid 65534 gets when it reads `path` (or lists it, for a folder): the text, or the error's name."""
    code = (
        "import os, sys\n"
        "p = sys.argv[1]\n"
        "try:\n"
        "    print(os.listdir(p) if os.path.isdir(p) else open(p).read())\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    for python in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]):
        try:
            out = subprocess.run(
                [python, "-I", "-c", code, str(path)], user=65534, group=65534, extra_groups=[], cwd="/",
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
        except (PermissionError, FileNotFoundError, subprocess.CalledProcessError):
            continue
        return out.stdout.strip()
    pytest.skip("no Python interpreter that uid 65534 may run")


async def wait_ended(pool, node, run_dir: str) -> None:
    for _ in range(200):
        if (await run_states(pool, node, [run_dir], python=PY))[run_dir].finished:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{run_dir} did not end")


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_run_folders_and_files_are_private_to_the_scheduler_user(node_pool, tmp_path: Path) -> None:
    cluster, pool, node = node_pool
    home = cluster["node01"].home
    for folder in [home, *home.parents]:  # let others reach the home, as on a real node
        if folder == Path("/"):
            break
        folder.chmod(mode(folder) | 0o755)
    old = os.umask(0o022)
    try:
        await start_run(
            pool,
            node,
            run_dir=f"~/.ftconsole/runs/{CID}/5/1/0",
            argv=["sh", "-c", "echo secret-output"],
            env={"HF_TOKEN": "hf_secret"},
            workdir="~",
            files={"hostfile": b"node01 slots=8\n", "conf/extra.txt": b"x"},
            steps=[Step(StepKind.COMMAND, "command", ("sh", "-c", "echo secret-output"), {"HF_TOKEN": "hf_secret"})],
            token="tok-5-1",
            python=PY,
        )
        await prepare_run(pool, node, run_dir=f"~/.ftconsole/runs/{CID}/5/1/1", argv=["true"],
                          env={"HF_TOKEN": "hf_secret"}, files={"hostfile": b"h\n"}, python=PY)  # fmt: skip
    finally:
        os.umask(old)
    await wait_ended(pool, node, f"~/.ftconsole/runs/{CID}/5/1/0")
    root = home / ".ftconsole/runs" / CID
    for folder in (root, root / "5", root / "5/1", root / "5/1/0", root / "5/1/1", root / "5/1/0/conf"):
        assert mode(folder) == 0o700, folder
    rank0 = root / "5/1/0"
    for name in ("env.json", "argv.json", "hostfile", "steps.json", "claim", "status.json", "output.log",
                 "conf/extra.txt"):  # fmt: skip
        assert mode(rank0 / name) == 0o600, name
    for name in ("env.json", "argv.json", "hostfile"):
        assert mode(root / "5/1/1" / name) == 0o600, name
    assert "hf_secret" in (rank0 / "env.json").read_text()
    assert read_as_nobody(rank0 / "env.json") == "PermissionError"
    assert read_as_nobody(rank0 / "output.log") == "PermissionError"
    assert read_as_nobody(root / "5/1") == "PermissionError"  # not even which ranks there are
    assert read_as_nobody(root) == "PermissionError"


def backdate(run_dir: Path, ended: float) -> None:
    """Say in status.json that the run ended at `ended` (as a run that ended days ago says)."""
    status = json.loads((run_dir / "status.json").read_text())
    (run_dir / "status.json").write_text(json.dumps(dict(status, ended=ended)))


async def test_retention_removes_only_old_ended_runs_of_this_cluster(node_pool, tmp_path: Path) -> None:
    cluster, pool, node = node_pool
    home = cluster["node01"].home
    runs = home / ".ftconsole/runs"
    now = time.time()
    started = {}
    for where, argv in {
        f"{CID}/1/1/0": ["true"],  # ended 4 days ago: removed
        f"{CID}/1/2/0": ["true"],  # ended 4 days ago, both ranks: removed
        f"{CID}/1/2/1": ["true"],
        f"{CID}/2/1/0": ["true"],  # ended an hour ago: stays
        f"{CID}/3/1/0": ["true"],  # ended 4 days ago, but its attempt is current (keep): stays
        f"{CID}/4/1/0": ["true"],  # ended 4 days ago, claimed by a current token: stays
        f"{CID}/5/1/0": ["sleep", "60"],  # running: stays
        f"{CID}/6/1/0": ["sleep", "60"],  # says it ended 4 days ago, but its process is alive: stays
        "othercluster/1/1/0": ["true"],  # another cluster's run: never touched
    }.items():
        token = "current-token" if where.startswith(f"{CID}/4/") else "t-" + where.replace("/", "-")
        await start_run(pool, node, run_dir=f"~/.ftconsole/runs/{where}", argv=argv, env={}, workdir="~",
                        token=token, python=PY)  # fmt: skip
        started[where] = runs / where
    for where, path in started.items():
        if "sleep" not in where and not where.startswith((f"{CID}/5/", f"{CID}/6/")):
            await wait_ended(pool, node, f"~/.ftconsole/runs/{where}")
        if where.startswith(f"{CID}/2/"):
            backdate(path, now - 3600)
        elif not where.startswith(f"{CID}/5/"):
            backdate(path, now - 4 * DAY)
    (runs / f"{CID}/6/1/0/status.json").write_text(
        json.dumps(dict(json.loads((runs / f"{CID}/6/1/0/status.json").read_text()), state="exited", exit_code=0))
    )
    # a prepared rank (mpirun's) with no status, untouched for days, and a link that leads out of the run root
    outside = tmp_path / "outside/1/0"
    outside.mkdir(parents=True)
    (outside / "status.json").write_text(json.dumps({"state": "exited", "ended": now - 9 * DAY}))
    (runs / CID / "7").symlink_to(tmp_path / "outside")
    await prepare_run(pool, node, run_dir=f"~/.ftconsole/runs/{CID}/8/1/0", argv=["true"], env={}, python=PY)
    for path in [runs / CID / "8/1/0", *(runs / CID / "8/1/0").iterdir()]:
        os.utime(path, (now - 4 * DAY, now - 4 * DAY), follow_symlinks=False)

    def attempts() -> list[str]:
        return sorted(
            f"{j.name}/{a.name}"
            for j in (runs / CID).iterdir()
            if j.is_dir() and not j.is_symlink()
            for a in j.iterdir()
        )

    assert len(attempts()) == 8
    prune = Prune(
        run_root="~/.ftconsole/runs", cluster=CID, retention=3 * DAY, keep=("3/1",), tokens=("current-token",)
    )
    pruned: list[str] = []
    listed = await node_runs(pool, node, root=f"~/.ftconsole/runs/{CID}", prune=prune, pruned=pruned, python=PY)
    assert sorted(pruned) == ["1/1", "1/2", "8/1"]
    assert attempts() == ["2/1", "3/1", "4/1", "5/1", "6/1"]
    assert not (runs / CID / "1").exists()  # its last attempt gone: the job folder too
    assert (outside / "status.json").exists() and (runs / "othercluster/1/1/0/status.json").exists()
    assert {r.job for r in listed} >= {"2", "3", "4", "5", "6"} and "1" not in {r.job for r in listed}

    # off: nothing goes; a cluster id that leads out of the run root is refused, and the read still answers
    assert await run_states(pool, node, [], prune=Prune("~/.ftconsole/runs", CID, 0.0), pruned=pruned, python=PY) == {}
    for bad in ("..", "a/../../x", ""):
        pruned.clear()
        await run_states(pool, node, [], prune=Prune("~/.ftconsole/runs", bad, 1.0), pruned=pruned, python=PY)
        assert pruned == []
    assert (runs / "othercluster/1/1/0").exists() and len(attempts()) == 5


async def test_the_scheduler_removes_old_run_folders_and_keeps_current_ones(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"run_retention": "1d"})
    async with await Store.open(loaded.state_dir / STORE_FILE) as store:
        cid = store.cluster_id
    runs = cluster["node01"].home / ".ftconsole/runs" / cid
    async with SSHPool.from_config(loaded) as pool:
        node = loaded.cluster.node_list()[0]
        for where in ("90/1/0", "91/1/0"):
            await start_run(pool, node, run_dir=f"{runs}/{where}", argv=["true"], env={}, workdir="~",
                            token="t-" + where.replace("/", "-"), python=PY)  # fmt: skip
            await wait_ended(pool, node, f"{runs}/{where}")
        backdate(runs / "90/1/0", time.time() - 2 * DAY)  # old: removed by the sweep at start
        backdate(runs / "91/1/0", time.time() - 3600)  # recent: stays
    async with running(loaded) as (_, client):
        submitted = await client.call("submit", spec=job("current", "sleep 30"))
        shown = await until(client, submitted["id"], lambda j: j["status"] == "running", "running")
        run_dir = Path(shown["attempts"][0]["runs"][0]["run_dir"].replace("~", str(cluster["node01"].home), 1))
        for _ in range(100):
            if not (runs / "90").exists() and (run_dir / "status.json").exists():
                break
            await asyncio.sleep(0.1)
        assert run_dir.parent.parent.parent == runs, run_dir
        assert sorted(p.name for p in runs.iterdir()) == sorted(["91", str(submitted["id"])])
        assert stat.S_IMODE(loaded.state_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((loaded.state_dir / STORE_FILE).stat().st_mode) == 0o600
        await client.call("stop", jobs=[submitted["id"]])
        await finished(client, submitted["id"])
