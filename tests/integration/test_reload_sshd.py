"""`ftconsole config reload` and SIGHUP against a working `ftconsole serve` on real sshd nodes with real processes.

Under load (jobs running), a reload that adds a node and removes another is refused while a job runs on the one
removed, and accepted once that node is drained and its job stopped: the node added is probed before its first
job is placed there. A config that does not validate, or that changes a key set up at start (api.socket), changes
nothing, through the command and through SIGHUP alike. What is counted is what runs on the nodes: a job that runs
through every reload is the same process, started once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftconsole.scheduler.errors import NotRunning, PermissionDenied, UsageError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.serve.daemon import Operations
from ftconsole.scheduler.spec.config import load_config
from tests.cli_runner import Cli
from tests.integration.test_backup_sshd import call, job, running_pid, sleepers, started, starts, stop_serve, wait_for
from tests.integration.test_crash_sshd import serve
from tests.pg_server import PgServer, pg_server_fixture  # noqa: F401  (provides the `pg_server` fixture)
from tests.sshd_cluster import SshdCluster, current_user, pid_alive

pytestmark = pytest.mark.sshd


def config_data(cluster: SshdCluster, root: Path, sock_dir: Path, nodes: list[str], **overrides: Any) -> dict[str, Any]:
    """The cluster's config with only `nodes`; this test's user an admin (it reloads)."""
    settings: dict[str, Any] = {
        "state_dir": str(root / "state"),
        "ssh": {"python": sys.executable},
        "scheduler": {"tick": "0.3s", "stop_grace": "2s"},
        "api": {"socket": str(sock_dir / "ft.sock")},
        "probes": {"interval": "30s"},
        "admins": [current_user()],
    }
    for key, value in overrides.items():
        settings[key] = {**settings.get(key, {}), **value} if isinstance(value, dict) else value
    data = cluster.config_data(**settings)
    data["nodes"] = [n for n in data["nodes"] if n["name"] in nodes]
    return data


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def node_names(sock: Path) -> list[str]:
    return [n["name"] for n in await call(sock, "nodes")]


async def run_of(sock: Path, job_id: int) -> dict[str, Any]:
    shown = await call(sock, "show", job=job_id)
    return {**shown["attempts"][-1]["runs"][0], "created": shown["attempts"][-1]["created"]}


async def reload_cli(cli: Cli, *args: str, check: int) -> Any:
    """`ftconsole config reload ARGS` in a thread (the loop goes on meanwhile), its exit status checked."""
    return await asyncio.to_thread(cli, "config", "reload", *args, check=check)


def log_lines(log: Path, text: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if text in line]


async def test_a_reload_adds_a_node_and_removes_a_drained_one_while_a_job_runs(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(3, gpus=1, shared_home=True)  # the new node meets the others' run folders
    config = write(tmp_path / "cluster.yaml", config_data(cluster, tmp_path, sock_dir, ["node01", "node02"]))
    sock, log, cli = sock_dir / "ft.sock", tmp_path / "serve.log", Cli(config)
    proc = serve(config, tmp_path)
    try:
        await started(proc, sock, log)
        a = (await call(sock, "submit", spec=job("a")))["id"]
        b = (await call(sock, "submit", spec=job("b")))["id"]
        pid_a = await wait_for("job a to run", lambda: running_pid(sock, a))
        await wait_for("job b to run", lambda: running_pid(sock, b))
        kept, retired = (await run_of(sock, a))["node"], (await run_of(sock, b))["node"]
        assert {kept, retired} == {"node01", "node02"}

        # node03 added, the node of job b removed while b runs there: refused, with the reason; nothing changes
        write(config, config_data(cluster, tmp_path, sock_dir, [kept, "node03"]))
        doc = json.loads((await reload_cli(cli, "--json", check=2)).stdout)
        assert (doc["applied"], doc["changed"]) == (False, False)
        assert (doc["nodes_added"], doc["nodes_removed"]) == (["node03"], [retired])
        [problem] = doc["problems"]
        assert problem["key"] == "nodes" and problem["file"] == str(config)
        assert f"node {retired} is removed but runs job {b}: drain it" in problem["message"]
        text = await reload_cli(cli, check=2)
        assert text.stdout == "" and f"config not reloaded from {config}: nothing was changed" in text.stderr
        assert f"runs job {b}" in text.stderr
        assert sorted(await node_names(sock)) == ["node01", "node02"]
        assert log_lines(log, "config not reloaded") and f"asked by {current_user()}" in log_lines(log, "not rel")[-1]

        # drained, its job stopped and gone: accepted; requests are answered throughout (timed)
        await call(sock, "drain", nodeset=retired, reason="retired")
        await call(sock, "stop", jobs=[b])

        async def b_gone() -> bool:
            shown = await call(sock, "show", job=b)
            views = {v["name"]: v for v in await call(sock, "nodes")}
            return shown["status"] == "stopped" and not views[retired]["held"]

        await wait_for("job b to end and free its node", b_gone)
        waits: list[float] = []
        measuring = asyncio.Event()

        async def ask_meanwhile() -> None:
            while not measuring.is_set():
                began = time.monotonic()
                await call(sock, "status")
                waits.append(time.monotonic() - began)
                await asyncio.sleep(0.01)

        asker = asyncio.create_task(ask_meanwhile())
        began = time.monotonic()
        doc = await call(sock, "reload")
        took, answered = time.monotonic() - began, time.time()
        measuring.set()
        await asker
        assert (doc["applied"], doc["changed"], doc["problems"]) == (True, True, [])
        assert (doc["nodes_added"], doc["nodes_removed"], doc["keys_changed"]) == (["node03"], [retired], [])
        assert sorted(await node_names(sock)) == sorted([kept, "node03"])
        print(
            f"\nreload: answered in {took:.3f} s, the loop paused {doc['paused_s']:.3f} s; {len(waits)} requests "
            f"meanwhile, the slowest {max(waits):.3f} s"
        )
        assert max(waits) < 2.0 and doc["paused_s"] < 5.0

        # a job that fits only on node03 (node01 runs job a, node02 is gone) starts there after node03's first probe
        c = (await call(sock, "submit", spec=job("c")))["id"]
        pid_c = await wait_for("job c to run", lambda: running_pid(sock, c))
        run_c = await run_of(sock, c)
        assert run_c["node"] == "node03"
        first = next(e for e in await call(sock, "events", node="node03") if e["kind"] == "state-changed")
        assert first["data"] == {"from": "unknown", "to": "healthy"}
        assert first["time"] <= run_c["created"] <= run_c["started"]  # probed, then placed, then started
        adopted = log_lines(log, "adopted ")
        assert len(adopted) >= 2, log.read_text()[-3000:]  # at the start, and again after the reload
        print(
            f"after the reload: {adopted[-1].split(' INFO ')[-1]}; job c placed {run_c['created'] - answered:.2f} s "
            f"after the answer (submitted at once), node03 probed {first['time'] - answered:.2f} s after it"
        )

        # job a ran through all of it: the same process, started once; on the nodes, a's and c's processes only
        assert await running_pid(sock, a) == pid_a and pid_alive(pid_a)
        assert starts(cluster, a) == [pid_a]
        assert sleepers(cluster) == {pid_a, pid_c}
    finally:
        stop_serve(proc)


async def test_a_reload_that_cannot_apply_changes_nothing_and_sighup_does_what_the_command_does(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    good = config_data(cluster, tmp_path, sock_dir, ["node01", "node02"])
    config = write(tmp_path / "cluster.yaml", good)
    sock, log, cli = sock_dir / "ft.sock", tmp_path / "serve.log", Cli(config)
    invalid = {**good, "scheduler": {**good["scheduler"], "tick": "soon"}, "probes": {**good["probes"], "colour": 1}}
    moved = {**good, "api": {"socket": str(sock_dir / "elsewhere.sock")}}
    with_spec = {**good, "specs": {"one": {"gpus_per_node": 1}}, "scheduler": {**good["scheduler"], "tick": "0.5s"}}
    proc = serve(config, tmp_path)
    try:
        await started(proc, sock, log)
        a = (await call(sock, "submit", spec=job("a")))["id"]
        pid_a = await wait_for("job a to run", lambda: running_pid(sock, a))
        assert (await call(sock, "reload"))["changed"] is False  # the same file: nothing changes, nothing stops
        assert "nothing changed" in (await reload_cli(cli, check=0)).stdout

        # an invalid file: every problem, with its line; nothing changed
        write(config, invalid)
        doc = json.loads((await reload_cli(cli, "--json", check=2)).stdout)
        assert doc["applied"] is False
        assert sorted(p["key"] for p in doc["problems"]) == ["probes.colour", "scheduler.tick"]
        assert all(p["line"] and p["file"] == str(config) for p in doc["problems"])
        # the running scheduler still knows its specs as they were: a spec it was never given is refused
        with pytest.raises(UsageError):
            await call(sock, "predict", spec={"name": "p", "command": "true", "spec": "one"})

        # a key set up at start: refused as needing a restart, by the scheduler (asked at its socket)
        write(config, moved)
        doc = await call(sock, "reload")
        [problem] = doc["problems"]
        assert doc["applied"] is False and problem["key"] == "api.socket"
        assert problem["message"].startswith("changing it needs a restart (the API socket is bound at start)")
        # the command finds no scheduler at the socket the file names now, and says why
        out = await reload_cli(cli, check=3)
        assert "If api.socket or state_dir changed in the file" in out.stderr

        # SIGHUP: the same three, in the log
        for data, said in ((invalid, "probes.colour"), (moved, "api.socket: changing it needs a restart")):
            write(config, data)
            refused = len(log_lines(log, "config not reloaded"))
            proc.send_signal(signal.SIGHUP)
            line = await wait_for("the refusal in the log", lambda r=refused: log_lines(log, "config not reloaded")[r:])
            assert said in line[0] and "(asked by SIGHUP)" in line[0]
            if data is invalid:
                assert "scheduler.tick" in line[0]  # every problem, on its one line
        write(config, with_spec)
        proc.send_signal(signal.SIGHUP)
        [line] = await wait_for("the reload in the log", lambda: log_lines(log, "keys changed"))
        assert "specs.one, scheduler.tick" in line and "(asked by SIGHUP)" in line
        assert (await call(sock, "predict", spec={"name": "p", "command": "true", "spec": "one"}))["starts_now"] is True

        assert await running_pid(sock, a) == pid_a and starts(cluster, a) == [pid_a] and sleepers(cluster) == {pid_a}
        assert proc.poll() is None
    finally:
        stop_serve(proc)


async def test_only_admins_reload_and_only_where_a_scheduler_serves(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "admins": ["alice"]}))
    async with ClusterService.open(load_config(path)) as service:
        ops = Operations(Scheduler(service))
        with pytest.raises(PermissionDenied, match="mallory may not reload the config: that is for admins"):
            await ops(Caller(uid=4242, gid=4242, pid=1, user="mallory"), "reload", {})
        with pytest.raises(UsageError, match="no scheduler runs here"):  # the CLI's own process: nothing to reload
            await ops(Caller(uid=4243, gid=4243, pid=1, user="alice"), "reload", {})


async def test_on_postgresql_a_standby_reloads_and_its_next_term_leads_with_the_new_config(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, pg_server: PgServer
) -> None:
    """Two head nodes on one PostgreSQL store: the leader's reload restarts its loop, a standby's applies at once
    (no loop runs there); when the leader stops, the standby leads with the config it was given, and re-adopts
    the job the leader started."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    state = {"url": pg_server.database(), "lease": "3s"}
    heads = {name: (tmp_path / name, sock_dir / f"{name}.sock") for name in ("a", "b")}

    def head_config(name: str, nodes: list[str]) -> dict[str, Any]:
        root, sock = heads[name]
        return config_data(cluster, root, sock_dir, nodes, state=state, api={"socket": str(sock)})

    for root, _ in heads.values():
        root.mkdir()
    configs = {name: write(root / "cluster.yaml", head_config(name, ["node01"])) for name, (root, _) in heads.items()}
    (a_root, a_sock), (b_root, b_sock) = heads["a"], heads["b"]
    procs = [serve(configs["a"], a_root)]
    try:
        # (not `started`: its `jobs` on an empty PostgreSQL store fails, a fault of the job listing's own)
        await wait_for("a to lead", lambda: _role(a_sock, "leader"))
        procs.append(serve(configs["b"], b_root))
        await wait_for("b to stand by", lambda: _role(b_sock, "standby"))
        a = (await call(a_sock, "submit", spec=job("a")))["id"]
        pid_a = await wait_for("job a to run", lambda: running_pid(a_sock, a))

        for name, sock in (("b", b_sock), ("a", a_sock)):  # node02 added on both head nodes
            write(configs[name], head_config(name, ["node01", "node02"]))
            doc = await call(sock, "reload")
            assert (doc["applied"], doc["nodes_added"]) == (True, ["node02"]), doc
            assert (doc["paused_s"] is None) == (name == "b")  # the standby's loop does not run: nothing paused
            assert sorted(await node_names(sock)) == ["node01", "node02"]

        stop_serve(procs[0])  # a clean stop lets the lease go: b takes it at its next look
        await wait_for("b to lead", lambda: _role(b_sock, "leader"))
        c = (await call(b_sock, "submit", spec=job("c")))["id"]  # node01 runs job a: c fits only on node02
        await wait_for("job c to run", lambda: running_pid(b_sock, c))
        assert (await run_of(b_sock, c))["node"] == "node02"
        assert await running_pid(b_sock, a) == pid_a and starts(cluster, a) == [pid_a]
    finally:
        for proc in reversed(procs):
            stop_serve(proc)


async def _role(sock: Path, role: str) -> bool:
    try:
        return bool((await call(sock, "status"))["leadership"]["role"] == role)
    except (OSError, NotRunning, KeyError):
        return False
