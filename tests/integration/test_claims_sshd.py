"""What a job's user writes is a claim about their own job, never evidence (issue 40), on real sshd nodes with a
real second account: the user's own `pkill -u`, a status.json they corrupt, a status.json whose `started` they hide.
Each may end that job; none takes a node out of service or changes anyone's usage. What is checked is what is
real afterwards: the nodes' states, the job's attempts, its events, the usage the scheduler reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.accounts import remove_account
from tests.integration.test_run_as_sshd import write_config
from tests.integration.test_scheduler_sshd import as_uid, finished, job, log_of, poll, running, until
from tests.sshd_cluster import SshdCluster

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(os.geteuid() != 0, reason="a second real account (useradd, runuser) needs root"),
]


@pytest.fixture
def account() -> Iterator[tuple[str, int]]:
    """A real account of its own (name, uid), made for this test and removed after it: the job's user, whose
    `pkill -u` can touch nothing but this test's processes."""
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("useradd and runuser are needed to make a second account")
    name = f"ftc{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--no-user-group", "--gid", "65534",
                    "--shell", "/bin/sh", name], check=True)  # fmt: skip
    try:
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
        yield name, uid
    finally:
        remove_account(name)


def in_service(nodes: list[dict[str, Any]]) -> dict[str, str]:
    return {n["name"]: n["state"] for n in nodes}


async def test_a_users_pkill_of_their_own_processes_ends_their_job_and_takes_no_node_out(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """`pkill -u $USER` on a node (a user tidying up) kills the run's supervisor with the rank: the run reads lost.
    With `retries`, that used to isolate the node and requeue the job elsewhere. The scheduler probes the node
    itself, finds it healthy and on the run's boot, and ends the job alone."""
    name, uid = account
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    async with running(loaded) as (_, client):
        spec = job("tidy", "sleep 300", fault_tolerance={"retries": 2})
        submitted = (await as_uid(uid, loaded.socket_path, "submit", spec=spec))["result"]
        assert submitted["owner"] == name
        await until(client, submitted["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "a pid")
        subprocess.run(["runuser", "-u", name, "--", "pkill", "-KILL", "-u", name], check=False)
        shown = await finished(client, submitted["id"])
        nodes = await client.call("nodes")
        events = await client.call("events", job=submitted["id"])
    assert shown["status"] == "error" and "lost" in shown["message"], shown["message"]
    assert len(shown["attempts"]) == 1, "requeued after the user's own kill"
    assert in_service(nodes) == {"node01": "healthy", "node02": "healthy"}, nodes
    assert not [e for e in events if e["kind"] in ("Isolated", "Requeued", "Restarting")], events


# Once its supervisor has written it running (else the supervisor's own write could land after this one), the rank
# overwrites its status file with what is not JSON, then sleeps.
CORRUPT = (
    "import os, time\n"
    "path = os.path.join(os.path.dirname(os.environ['FT_OUTPUT_DIR']), 'status.json')\n"
    "while '\"running\"' not in open(path).read():\n"
    "    time.sleep(0.05)\n"
    "with open(path, 'w') as fh:\n"
    "    fh.write('{not json')\n"
    "time.sleep(300)\n"
)


async def test_a_corrupted_status_file_ends_its_job_and_takes_no_node_out(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """The rank overwrites its own status.json with garbage: the run reads lost (unreadable), its job ends, and
    with `retries` no node is isolated and nothing is requeued."""
    _, uid = account
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    corrupt = f"python3 -c {shlex.quote(CORRUPT)}"
    async with running(loaded) as (_, client):
        spec = job("corrupt", corrupt, fault_tolerance={"retries": 2})
        submitted = (await as_uid(uid, loaded.socket_path, "submit", spec=spec))["result"]
        shown = await finished(client, submitted["id"])
        nodes = await client.call("nodes")
    (run,) = shown["attempts"][0]["runs"]
    assert shown["status"] == "error" and run["state"] == "lost", shown
    assert "unreadable" in shown["message"], shown["message"]
    assert len(shown["attempts"]) == 1
    assert in_service(nodes) == {"node01": "healthy", "node02": "healthy"}, nodes


async def test_a_hidden_started_still_counts_the_gpu_time_the_scheduler_saw(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """The rank claims its own end: it rewrites its status.json as exited with `started` hidden and `ended` at 1970,
    then kills its supervisor so that nothing writes the truth over it. Usage still counts the time its GPU was
    held, from the scheduler's clock, and the run's times are the scheduler's."""
    name, uid = account
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    hide = (
        "import json, os, signal, time\n"
        "path = os.path.join(os.path.dirname(os.environ['FT_OUTPUT_DIR']), 'status.json')\n"
        "time.sleep(3)\n"
        "doc = json.load(open(path))\n"
        "doc.pop('started', None)\n"
        "doc.update(state='exited', exit_code=0, ended=1.0)\n"
        "json.dump(doc, open(path + '.t', 'w'))\n"
        "os.replace(path + '.t', path)\n"
        "os.kill(doc['supervisor_pid'], signal.SIGKILL)\n"
    )
    async with running(loaded) as (_, client):
        command = f"python3 -c {shlex.quote(hide)}"
        submitted = (await as_uid(uid, loaded.socket_path, "submit", spec=job("hide", command)))["result"]
        shown = await finished(client, submitted["id"])
        usage = await client.call("usage", since=0.0, by="user")
    (run,) = shown["attempts"][0]["runs"]
    assert run["started"] is not None and run["ended"] is not None and run["ended"] - run["started"] >= 2.5, run
    assert usage["rows"][name]["gpu_seconds"] >= 2.5, usage


async def printed(client: Any, job_id: int, text: str) -> None:
    """Wait until the job's rank runs and has printed `text`."""
    ran = lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["state"] == "running"  # noqa: E731
    await until(client, job_id, ran, "its rank read running")
    await poll(lambda: log_of(client, job_id), lambda t: text in t, f"{text!r} in its output")


async def debugged(loaded: Any, client: Any, uid: int, script: str, marker: str, *args: str) -> dict[str, Any]:
    """Submit `script` (Python, with `args`) as `uid`, wait until it printed `marker`, and `ftconsole debug` it as
    root: the evidence of its Python process."""
    command = shlex.join(["python3", "-c", script, *args])
    submitted = (await as_uid(uid, loaded.socket_path, "submit", spec=job("evidence", command)))["result"]
    await printed(client, submitted["id"], marker)
    doc = await client.call("debug", job=submitted["id"])
    (rank,) = [p for r in doc["runs"] for p in r.get("processes") or [] if p.get("python")]
    return dict(rank)


def start_time(pid: int) -> int:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), as status.json keeps it."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])


VICTIM = "import time\ndef secret_work():\n    time.sleep(300)\nsecret_work()\n"  # another user's work
POINT_AT = (
    "import json, os, sys, time\n"
    "path = os.path.join(os.path.dirname(os.environ['FT_OUTPUT_DIR']), 'status.json')\n"
    "victim, start = int(sys.argv[1]), int(sys.argv[2])\n"
    "for _ in range(3000):\n"
    "    doc = json.load(open(path))\n"
    "    if doc.get('pid') != victim:\n"
    "        doc.update(pid=victim, pid_start=start)\n"
    "        json.dump(doc, open(path + '.t', 'w'))\n"
    "        os.replace(path + '.t', path)\n"
    "    time.sleep(0.1)\n"
)


async def test_a_status_file_that_points_at_another_users_processes_gets_none_of_them_read(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """The rank points its status.json's `pid` and `pid_start` at another user's process group (here root's, a
    Python process with a secret on its command line). `ftconsole debug`, which root gathers, must not read it:
    neither its stack nor its command line appears in the job's evidence, whoever asks."""
    _, uid = account
    victim = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\ndef secret_work():\n    time.sleep(300)\nsecret_work()\n",
            "VICTIM-SECRET",
        ],
        start_new_session=True,
    )
    try:
        cluster: SshdCluster = sshd_cluster(1, gpus=1)
        loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root, probes={"interval": "1h"})
        async with running(loaded) as (_, client):
            command = f"python3 -c {shlex.quote(POINT_AT)} {victim.pid} {start_time(victim.pid)}"
            submitted = (await as_uid(uid, loaded.socket_path, "submit", spec=job("pointer", command)))["result"]
            await until(
                client,
                submitted["id"],
                lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"] == victim.pid,
                "the run to read the victim's pid",
            )
            asked = await as_uid(uid, loaded.socket_path, "debug", job=submitted["id"])
            by_root = await client.call("debug", job=submitted["id"])
    finally:
        victim.kill()
        victim.wait(timeout=10)
    for doc in (asked["result"], by_root):
        text = json.dumps(doc)
        assert "VICTIM-SECRET" not in text and "secret_work" not in text, text[:3000]
        pids = [p["pid"] for r in doc["runs"] for p in r.get("processes") or []]
        assert victim.pid not in pids, pids


DRIP = (
    "import os, socket, threading, time\n"
    "path = os.path.join(os.path.dirname(os.environ['FT_OUTPUT_DIR']), 'ftconsole-torch-drip.sock')\n"
    "server = socket.socket(socket.AF_UNIX)\n"
    "server.bind(path)\n"
    "server.listen(8)\n"
    "def drip(conn):\n"
    "    try:\n"
    "        for byte in b'HTTP/1.0 200 OK' * 1000:\n"
    "            conn.send(bytes([byte]))\n"
    "            time.sleep(0.2)\n"
    "    except OSError:\n"
    "        pass\n"
    "def serve():\n"
    "    while True:\n"
    "        conn, _ = server.accept()\n"
    "        threading.Thread(target=drip, args=(conn,), daemon=True).start()\n"
    "threading.Thread(target=serve, daemon=True).start()\n"
    "print('serving', flush=True)\n"
    "def wait_for_peer():\n"
    "    time.sleep(300)\n"
    "wait_for_peer()\n"
)


async def test_a_trace_server_that_drips_bytes_is_cut_off_and_the_rest_of_the_evidence_comes(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """The rank serves its 'torch trace' socket one byte every 0.2 s, for ever: root's read of it is cut off after
    its few seconds (it was a timeout per read: a stuck root process per `debug`), and the rank's stack comes."""
    _, uid = account
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root, probes={"interval": "1h"})
    async with running(loaded) as (_, client):
        rank = await debugged(loaded, client, uid, DRIP, "serving")
    assert "within" in (rank.get("collectives_error") or ""), rank
    assert rank["stack"] and any(f["name"] == "wait_for_peer" for t in rank["stack"] for f in t["frames"]), rank


SWAP = (
    "import os, socket, sys, time\n"
    "path = os.path.join(os.path.dirname(os.environ['FT_OUTPUT_DIR']), 'ftconsole-torch-swap.sock')\n"
    "server = socket.socket(socket.AF_UNIX)\n"
    "server.bind(path)\n"
    "server.listen(8)\n"
    "os.unlink(path)\n"
    "os.symlink(sys.argv[1], path)\n"
    "print('swapped', flush=True)\n"
    "time.sleep(300)\n"
)


async def test_root_never_connects_to_a_socket_that_is_not_the_job_users(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """The rank binds its 'torch trace' socket, then puts a symlink to a root-only socket in its place: root, who
    gathers the evidence, must not connect there for it (a confused deputy)."""
    _, uid = account
    private = Path(tempfile.mkdtemp(prefix="ft-root-", dir="/tmp"))
    private.chmod(0o711)  # the user can name the path, not list or use it
    target = private / "root-only.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(target))
    target.chmod(0o600)
    listener.listen(8)
    listener.setblocking(False)
    try:
        cluster: SshdCluster = sshd_cluster(1, gpus=1)
        loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root, probes={"interval": "1h"})
        async with running(loaded) as (_, client):
            rank = await debugged(loaded, client, uid, SWAP, "swapped", str(target))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
        shutil.rmtree(private, ignore_errors=True)
    assert "not a socket of the job's user" in (rank.get("collectives_error") or ""), rank


async def test_a_user_who_stops_their_node_channel_takes_no_node_out_and_ends_no_job(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, account: tuple[str, int]
) -> None:
    """The scheduler's channel for a user's runs on a node is a process of that user: they may SIGSTOP it. Its
    heartbeat then stops, as a frozen node's does; that used to start the node's silence clock and read the node
    through the stopped channel until `node_timeout` gave the node up, ending root's job beside theirs. The
    node's own SSH connection still answers, so the stopped channel is dropped and the node is read again."""
    name, uid = account
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root, scheduler={"node_timeout": "4s"})
    async with running(loaded) as (scheduler, client):
        mine = await client.call("submit", spec=job("mine", "sleep 300", gpus_per_node=1))
        theirs = await as_uid(uid, loaded.socket_path, "submit", spec=job("theirs", "sleep 300", gpus_per_node=1))
        theirs = theirs["result"]
        for submitted in (mine, theirs):
            await until(
                client, submitted["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "a pid"
            )
        channels = scheduler.loop.executor.channels
        assert channels is not None

        async def users_channel() -> int | None:
            pids = [c.pid for (_, user, _), c in channels.live().items() if user == name]
            return pids[0] if pids else None

        stopped = await poll(users_channel, bool, f"a channel of {name} on node01")
        assert stopped is not None
        subprocess.run(["runuser", "-u", name, "--", "kill", "-STOP", str(stopped)], check=True)
        try:
            fresh = await poll(users_channel, lambda pid: pid not in (None, stopped), "another channel of the user")
            await asyncio.sleep(loaded.cluster.scheduler.node_timeout + 2)  # what it cost, once the node was late
            nodes = await client.call("nodes")
            shown = [await client.call("show", job=j["id"]) for j in (mine, theirs)]
            events = await client.call("events")
        finally:
            subprocess.run(["kill", "-KILL", str(stopped)], check=False)
    assert fresh and fresh != stopped
    assert in_service(nodes) == {"node01": "healthy"}, nodes
    for one in shown:
        assert one["status"] == "running" and len(one["attempts"]) == 1, one
    assert not [e for e in events if e["kind"] in ("Restarting", "Stopping", "Failed")], events
