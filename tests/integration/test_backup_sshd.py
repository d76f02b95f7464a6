"""Backup and restore of the SQLite store on real sshd nodes with real processes.

`ftconsole state backup` runs beside a working `ftconsole serve` while jobs are submitted; a job started after the
backup is unknown to it. After `ftconsole state restore` (in place, or into a fresh state_dir) and a new `serve`,
what is counted is what runs on the node: the job the backup knows is read back (the same process, started once),
the one it does not know is killed, and the GPU it held goes to a new job, which never runs beside it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from ftconsole.scheduler.errors import NotFound, NotRunning
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.store.backup import check_file
from tests.cli_runner import Cli
from tests.integration.test_crash_sshd import kill, serve
from tests.integration.test_scheduler_sshd import write_config
from tests.sshd_cluster import SshdCluster, lab_processes, pid_alive

pytestmark = pytest.mark.sshd
WAIT = 60.0
T = TypeVar("T")
# each start appends its pid to a file of its node's home, then sleeps as that same process (exec)
LONG = "sh -c 'echo $$ >> \"$HOME/starts.$FT_JOB_ID\"; exec sleep 3600'"


def job(name: str, command: str = LONG, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "gpus_per_node": 1, **fields}


async def wait_for(what: str, check: Callable[[], Awaitable[T | None] | T | None]) -> T:
    """`check()` (a value or an awaitable) every 0.1 s until it gives something true; fail after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def call(sock: Path, op: str, **args: Any) -> Any:
    async with await ApiClient.connect(sock) as client:
        return await client.call(op, **args)


async def started(proc: subprocess.Popen[bytes], sock: Path, log: Path) -> None:
    """Wait until the scheduler `proc` answers on its socket; fail at once when it exits."""

    async def answers() -> bool:
        assert proc.poll() is None, f"serve exited {proc.returncode}: {log.read_text()[-3000:]}"
        try:
            await call(sock, "jobs")
        except (OSError, NotRunning):
            return False
        return True

    await wait_for("serve to answer", answers)


def stop_serve(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as systemd stops it: the scheduler ends, the runs go on on their nodes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise


async def running_pid(sock: Path, job_id: int) -> int | None:
    """The pid of the job's rank 0 once the scheduler reads it running."""
    shown = await call(sock, "show", job=job_id)
    runs = shown["attempts"][-1]["runs"] if shown["attempts"] else []
    running = shown["status"] == "running" and runs and runs[0]["state"] == "running"
    return int(runs[0]["pid"]) if running else None


async def ended(sock: Path, job_id: int) -> dict[str, Any] | None:
    shown = await call(sock, "show", job=job_id)
    return shown if shown["status"] not in ("queued", "running") else None


async def log_of(sock: Path, job_id: int) -> str:
    async with await ApiClient.connect(sock) as client:
        return "".join([chunk async for chunk in client.stream("logs", job=job_id)])


def sleepers(cluster: SshdCluster) -> set[int]:
    """The jobs' processes on the lab's nodes now: `sleep 3600` started through a node's sshd."""
    return {pid for pid, argv in lab_processes(cluster.root).items() if argv[:2] == [b"sleep", b"3600"]}


def starts(cluster: SshdCluster, job_id: int) -> list[int]:
    """The pids each start of the job's rank wrote (one per start)."""
    return [int(p) for h in cluster.homes for f in h.glob(f"starts.{job_id}") for p in f.read_text().split()]


def fresh_config(config: Path, root: Path, sock_dir: Path) -> Path:
    """The same cluster's config with another (empty) state_dir and socket: a new head node's disk."""
    data = yaml.safe_load(config.read_text())
    data["state_dir"] = str(root / "state")
    data["api"]["socket"] = str(sock_dir / "fresh.sock")
    (path := root / "cluster.yaml").parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("where", ["in place", "fresh state_dir"])
async def test_a_restored_store_readopts_what_it_knows_and_stops_what_started_after_the_backup(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, where: str
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "30s"})
    sock, cli = loaded.socket_path, Cli(loaded.file)
    backup = tmp_path / "backups" / "state.db"
    backup.parent.mkdir()
    proc = serve(loaded.file, tmp_path)
    try:
        await started(proc, sock, tmp_path / "serve.log")
        a = (await call(sock, "submit", spec=job("a")))["id"]
        a_pid = await wait_for("job A to run", lambda: running_pid(sock, a))

        # the backup while jobs are submitted (each waits for A: nothing more is placed) and serve writes them
        submitted: list[int] = []
        done = asyncio.Event()

        async def submitting() -> None:
            async with await ApiClient.connect(sock) as client:
                while not done.is_set():
                    spec = job("waits", "true", after={"ok": [a]})
                    submitted.append((await client.call("submit", spec=spec))["id"])
                    await asyncio.sleep(0.02)

        writer = asyncio.create_task(submitting())
        await wait_for("submits under way", lambda: len(submitted) >= 3)
        before = len(submitted)
        made = await asyncio.to_thread(cli.json, "state", "backup", str(backup))
        after = len(submitted)
        done.set()
        await writer
        assert after > before, "no job was submitted while the backup ran"
        facts = check_file(backup)  # integrity, an ftconsole store, its schema
        # one commit's view: every job submitted before it began, none after it ended (one may be in flight)
        assert 1 + before <= facts.rows["jobs"] <= 2 + after, (before, facts.rows, after)
        assert made["rows"] == facts.rows and made["cluster_id"] == facts.cluster_id
        assert made["schema_version"] == facts.schema_version and made["bytes"] == backup.stat().st_size
        assert backup.stat().st_mode & 0o777 == 0o600 and not backup.with_name("state.db.tmp").exists()
        assert "exists" in cli("state", "backup", str(backup), check=2).stderr

        b = (await call(sock, "submit", spec=job("b")))["id"]  # after the backup: unknown to it
        b_pid = await wait_for("job B to run", lambda: running_pid(sock, b))
        assert b > max(submitted)
        refused = cli("state", "restore", str(backup), check=1)  # serve holds the state_dir
        assert "already running: another scheduler (pid" in refused.stderr
    finally:
        stop_serve(proc)
    assert sleepers(cluster) == {a_pid, b_pid}  # the scheduler is down; both runs go on on the node

    if where == "fresh state_dir":
        config = fresh_config(loaded.file, tmp_path / "fresh", sock_dir)
        cli, sock, root = Cli(config), sock_dir / "fresh.sock", tmp_path / "fresh"
        state_dir = root / "state"
    else:
        config, root, state_dir = loaded.file, tmp_path, loaded.state_dir
    restored = cli.json("state", "restore", str(backup))
    assert restored["rows"] == facts.rows and restored["cluster_id"] == facts.cluster_id
    assert (state_dir / "state.db").stat().st_mode & 0o777 == 0o600
    if where == "in place":
        assert Path(restored["moved_aside"][0]).name.startswith("state.db.before-restore-")
        assert restored["job_ids_carried"] and restored["next_job_id"] > b  # after the old store's last id
    else:
        assert restored["moved_aside"] == [] and restored["next_job_id"] == restored["last_job_id"] + 1

    proc = serve(config, root)
    try:
        await started(proc, sock, root / "serve.log")
        with pytest.raises(NotFound):
            await call(sock, "show", job=b)
        await wait_for("B's process to be killed", lambda: not pid_alive(b_pid))
        assert await running_pid(sock, a) == a_pid  # read back: the same process
        assert sleepers(cluster) == {a_pid}
        assert starts(cluster, a) == [a_pid] and starts(cluster, b) == [b_pid]  # each started once

        async def fenced_events() -> list[dict[str, Any]]:  # written once the kill is done: wait for it
            return [e for e in await call(sock, "events", node="node01", limit=1000) if e["kind"] == "Fenced"]

        fenced = await wait_for("the fenced event", fenced_events)
        assert [(e["job"], f"run folder {b}/1/0" in e["message"]) for e in fenced] == [(None, True)], fenced

        if where == "in place":  # B's GPU is free in the restored store: a new job gets it, with an id after B's
            # and B gone when it starts (a killed process may stay a zombie a while: it holds nothing)
            (cluster.node("node01").home / "check.sh").write_text(
                f'case "$(cut -d" " -f3 /proc/{b_pid}/stat 2>/dev/null)" in ""|Z|X) ;; *) echo B is alive;; esac\n'
                "echo started\n"
            )
            c = (await call(sock, "submit", spec=job("c", "sh check.sh")))["id"]
            shown = await wait_for("job C to end", lambda: ended(sock, c))
            assert shown["status"] == "succeeded", shown["message"]
            assert await log_of(sock, c) == "started\n"
            assert (await call(sock, "show", job=a))["status"] == "running"
    finally:
        stop_serve(proc)
