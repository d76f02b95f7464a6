"""Jobs run as the user who submitted them (scheduler.run_as: submitter), on real sshd nodes with real uids.

The scheduler and its SSH account are root; the submitter is uid 65534 (nobody) over the API socket, or a
uid with no account at all. What is checked is what the node shows: the uid of the processes (/proc), the
owner and mode of the run folder and its files, what the job printed, and the rows of the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftconsole.scheduler import executor
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh.runs import (
    CannotSwitch,
    NoAccount,
    account,
    read_file,
    run_states,
    start_run,
    stop_runs,
)
from ftconsole.scheduler.ssh.shell import NO_FOLDER_EXIT, job_remote_command
from ftconsole.scheduler.ssh.transport import CommandResult
from tests.integration.test_scheduler_sshd import as_nobody, as_uid, finished, job, log_of, running, until
from tests.integration.test_scheduler_sshd import write_config as scheduler_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as other users needs root")

NOBODY = 65534
GHOST = 54321  # a uid with no account (no passwd entry) on any node
WAIT = 30


def write_config(cluster: SshdCluster, tmp_path: Path, sock_dir: Path, run_root: str, **overrides: Any) -> Any:
    sock_dir.chmod(0o755)  # uid 65534 reaches the socket (group 0, as in the access tests)
    scheduler = {"run_root": run_root, **overrides.pop("scheduler", {})}
    return scheduler_config(cluster, tmp_path, sock_dir, scheduler=scheduler, **overrides)


def uid_of(pid: int) -> int | None:
    """The real uid of a live process, from /proc (None once it is gone or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields["State"].split()[0] in ("Z", "X"):
        return None
    return int(fields["Uid"].split()[0])


async def gone(pid: int) -> bool:
    for _ in range(WAIT * 10):
        if uid_of(pid) is None:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_job_runs_as_its_submitter_with_its_hooks_in_a_run_folder_of_its_own(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    name = pwd.getpwuid(NOBODY).pw_name
    async with running(loaded) as (_, client):
        spec = job(
            "whoami",
            "sh -c 'echo command uid=$(id -u) user=$USER home=$HOME; pwd; cat $FT_HOSTFILE'",
            hooks={"before": "echo before uid=$(id -u)", "after": "echo after uid=$(id -u)"},
        )
        submitted = (await as_nobody(loaded.socket_path, "submit", spec=spec))["result"]
        assert submitted["owner"] == name
        shown = await finished(client, submitted["id"])
        assert shown["status"] == "succeeded", shown
        text = await log_of(client, submitted["id"])
        assert f"before uid={NOBODY}" in text
        assert f"command uid={NOBODY} user={name} home=/nonexistent" in text
        assert f"after uid={NOBODY}" in text
        assert "ftconsole: no home folder /nonexistent: running in /tmp" in text  # as slurmd does
        assert "\n/tmp\n" in text
        assert "slots=1" in text  # the hostfile, readable by the job

        (run,) = shown["attempts"][0]["runs"]
        run_dir = Path(run["run_dir"])
        assert run_dir.is_relative_to(shared_run_root.replace("{user}", name).rsplit("/runs", 1)[0])
        st = run_dir.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o700)
        for file in ("argv.json", "env.json", "hostfile", "status.json", "output.log", "steps.json", "claim"):
            st = (run_dir / file).stat()
            assert (file, st.st_uid, st.st_mode & 0o777) == (file, NOBODY, 0o600)
        # the owner reads its own logs and launch files through the scheduler, which reads them as the owner
        mine = await as_nobody(loaded.socket_path, "launch", job=submitted["id"])
        assert "slots=1" in mine["result"]["hostfile"]


async def test_stop_and_kill_reach_a_job_of_another_uid(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    async with running(loaded) as (_, client):
        path = loaded.socket_path
        # one that ignores SIGTERM (root stops it: SIGKILL after the grace period), one that does not (its
        # owner stops it)
        stubborn = await as_nobody(path, "submit", spec=job("stubborn", "sh -c \"trap '' TERM; sleep 300\""))
        polite = await as_nobody(path, "submit", spec=job("polite", "sleep 300"))
        pids = {}
        for submitted in (stubborn["result"], polite["result"]):
            shown = await until(
                client, submitted["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "a pid"
            )
            pids[submitted["id"]] = pid = shown["attempts"][0]["runs"][0]["pid"]
            assert uid_of(pid) == NOBODY
        await client.call("stop", jobs=[stubborn["result"]["id"]])
        assert (await as_nobody(path, "stop", jobs=[polite["result"]["id"]]))["result"][0]["stop_requested"]
        for job_id, pid in pids.items():
            assert (await finished(client, job_id))["status"] == "stopped"
            assert await gone(pid), f"job {job_id}: pid {pid} still runs"
        # the one that ignored SIGTERM got SIGKILL once the grace period was over (its supervisor, as its user)
        (run,) = (await client.call("show", job=stubborn["result"]["id"]))["attempts"][0]["runs"]
        assert run["signal"] == "SIGKILL", run
        ps = subprocess.run(["ps", "-o", "pid=", "-u", str(NOBODY)], capture_output=True, text=True, check=False)
        assert not set(map(int, ps.stdout.split())) & set(pids.values())


async def test_a_restart_leaves_both_ranks_of_another_uids_job_running_where_its_run_folders_are_shared(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str
) -> None:
    """The user's run root is one folder for every node (its home on a cluster, a sticky /scratch/{user} here),
    so each node's sweep after a restart meets the other node's rank: it must leave it alone."""
    cluster: SshdCluster = sshd_cluster(2, gpus=1, shared_home=True)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    async with running(loaded) as (_, client):
        submitted = await as_nobody(
            loaded.socket_path, "submit", spec=job("pair", "sleep 300", mode="pytorch", nodes=2)
        )
        job_id = submitted["result"]["id"]
        shown = await until(
            client, job_id, lambda j: j["attempts"] and all(r["pid"] for r in j["attempts"][0]["runs"]), "pids"
        )
        pids = [r["pid"] for r in shown["attempts"][0]["runs"]]
        assert len(pids) == 2 and all(uid_of(p) == NOBODY for p in pids)
    async with running(loaded) as (scheduler, client):
        for _ in range(WAIT * 10):
            if not scheduler.loop.executor._unswept:
                break
            await asyncio.sleep(0.1)
        assert not scheduler.loop.executor._unswept, "the nodes were not swept"
        await asyncio.sleep(1.0)  # a few ticks more
        shown = await client.call("show", job=job_id)
        assert shown["status"] == "running" and len(shown["attempts"]) == 1, shown["message"]
        assert [e["message"] for e in shown["events"] if e["kind"] == "Fenced"] == []
        assert all(uid_of(p) == NOBODY for p in pids), "a rank was killed"
        await client.call("stop", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "stopped"
    for pid in pids:
        assert await gone(pid), f"pid {pid} still runs"


async def test_a_user_without_an_account_on_the_node_gets_a_clear_error_and_the_node_stays_healthy(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # retention with every read: it visits the run folders of every recent user, the one without an account too
    monkeypatch.setattr(executor, "PRUNE_EVERY_S", 0.0)
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    async with running(loaded) as (_, client):
        submitted = await as_uid(GHOST, loaded.socket_path, "submit", spec=job("ghost", "touch /tmp/ghost-ran"))
        job_id = submitted["result"]["id"]
        text = f"user {GHOST} has no account on node01"
        shown = await until(client, job_id, lambda j: text in j["message"], "the no-account message")
        assert shown["status"] == "queued"  # nothing of it started: queued again, node01 left out for that user
        shown = await until(client, job_id, lambda j: "waiting" in j["message"], "the placement note")
        assert shown["message"].endswith(f"(user {GHOST} has no account on node01)"), shown["message"]
        assert [r["state"] for a in shown["attempts"] for r in a["runs"]] == ["cancelled"]
        events = await client.call("events", job=job_id)
        assert any(text in e["message"] for e in events), events
        (node,) = await client.call("nodes")
        assert node["state"] == "healthy"
        # the next user's job runs there
        other = (await client.call("submit", spec=job("other", "sleep 1")))["id"]  # its end is read
        assert (await finished(client, other))["status"] == "succeeded"
        assert (await client.call("show", job=job_id))["status"] == "queued"
        await client.call("stop", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "stopped"
    assert not Path("/tmp/ghost-ran").exists()


async def test_a_user_without_a_home_folder_is_left_off_the_node_with_the_reason_when_run_folders_live_in_homes(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    """nobody's home is /nonexistent: with the default run root (~/.ftconsole/runs) its job cannot keep its run
    folder there. It is not started and fails nowhere: queued again with the reason, placed elsewhere; the
    node stays healthy and runs the next user's job."""
    home = pwd.getpwuid(NOBODY).pw_dir
    assert not os.path.isdir(home), f"{home} exists: this test needs an account without a home"
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, "~/.ftconsole/runs")
    name = pwd.getpwuid(NOBODY).pw_name
    async with running(loaded) as (_, client):
        submitted = await as_nobody(loaded.socket_path, "submit", spec=job("homeless", "touch /tmp/homeless-ran"))
        job_id = submitted["result"]["id"]
        text = f"user {name} has no home folder on node01 ({home})"
        note = f"(user {name} has no home folder on node01)"
        shown = await until(client, job_id, lambda j: j["message"].endswith(note), "the placement note")
        assert shown["status"] == "queued" and shown["message"].startswith("waiting"), shown
        assert [r["state"] for a in shown["attempts"] for r in a["runs"]] == ["cancelled"]
        events = await client.call("events", job=job_id)
        assert any(text in e["message"] and e["node"] == "node01" for e in events), events
        (node,) = await client.call("nodes")
        assert node["state"] == "healthy"
        other = (await client.call("submit", spec=job("other", "sleep 0.5")))["id"]
        assert (await finished(client, other))["status"] == "succeeded"
        await client.call("stop", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "stopped"
    assert not Path("/tmp/homeless-ran").exists()


def _config_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftconsole.cli", "config", "check", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_run_as_ssh_user_with_a_group_and_a_root_ssh_account_is_refused(sshd_cluster: Any, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1)
    data = cluster.config_data(scheduler={"run_as": "ssh_user"}, api={"group": "root"})
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    checked = _config_check(path)
    assert checked.returncode != 0
    assert "scheduler.run_as: run_as: ssh_user runs every job as the SSH account, which is root on node01" in (
        checked.stdout + checked.stderr
    )
    assert "any member of that group could run commands as root on every node" in checked.stdout + checked.stderr
    served = subprocess.run(
        [sys.executable, "-m", "ftconsole.cli", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert served.returncode != 0
    assert "could run commands as root" in served.stderr
    data["scheduler"]["accept_group_as_root"] = True
    path.write_text(yaml.safe_dump(data))
    accepted = _config_check(path)
    assert accepted.returncode == 0 and "jobs run as: the SSH account (run_as: ssh_user)" in accepted.stdout


# -- through sudo: an SSH account that is not root ---------------------------------------------------------------


class AsUid:
    """A Transport that runs each command on this machine as `uid`: the SSH account of a node, without the SSH
    hop (system accounts have no login shell for sshd to run commands with). What runs is real: sudo, the
    supervisor, the processes it starts."""

    def __init__(self, uid: int) -> None:
        self.uid = uid

    async def run(
        self, node: Node, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            user=self.uid, group=self.uid, extra_groups=[], cwd="/",
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(input.encode() if input else None), timeout or WAIT)
        return CommandResult(node.name, tuple(argv), proc.returncode, None, out.decode(), err.decode(), 0.0)

    async def close(self) -> None:
        return None


@pytest.fixture
def sudoers() -> Iterator[Callable[[str], None]]:
    """Write a sudoers.d rule for the test (checked by visudo); removed afterwards."""
    if shutil.which("sudo") is None or shutil.which("visudo") is None:
        pytest.skip("sudo is not installed (.ci/run installs it)")
    path = Path(f"/etc/sudoers.d/ftconsole-test-{os.getpid()}")

    def write(rule: str) -> None:
        path.write_text(rule + "\n")
        path.chmod(0o440)
        subprocess.run(["visudo", "-c", "-q", "-f", str(path)], check=True, timeout=WAIT)

    try:
        yield write
    finally:
        path.unlink(missing_ok=True)


async def test_a_non_root_ssh_account_switches_through_sudo_or_says_what_it_needs(
    sudoers: Callable[[str], None], shared_run_root: str
) -> None:
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    node = Node(name="sudo-node", host="127.0.0.1", port=None, user=None, pool="default")
    transport = AsUid(NOBODY)  # the SSH account: nobody; the job's user: daemon
    user = pwd.getpwnam("daemon")
    refused = (r"sudo-node: .*the SSH account nobody is not root and may not run /usr/bin/python3 as daemon "
               r"through sudo without a password .* sudoers line")  # fmt: skip
    with pytest.raises(CannotSwitch, match=refused):
        await account(transport, node, "daemon", python=python)
    # asked again (through sudo at once now, as the node is known to need it): the refusal still names the account
    # (it said "the SSH account the SSH account" where another test had asked a node of that name first)
    with pytest.raises(CannotSwitch, match=refused):
        await account(transport, node, "daemon", python=python)
    with pytest.raises(NoAccount, match="user ftconsole-no-such-user has no account on sudo-node"):
        await account(transport, node, "ftconsole-no-such-user", python=python)

    sudoers(f"nobody ALL=(daemon) NOPASSWD: {python}")
    assert (await account(transport, node, "daemon", python=python))["uid"] == user.pw_uid
    run_dir = f"{shared_run_root.replace('{user}', 'daemon')}/cid/1/1/0"
    started, status = await start_run(
        transport, node, run_dir=run_dir, argv=["sh", "-c", "id -u; sleep 300"], env={}, workdir="/tmp",
        token="t1", user="daemon", python=python,
    )  # fmt: skip
    assert started and status.state == "running" and status.pid is not None
    assert uid_of(status.pid) == user.pw_uid
    assert status.supervisor_pid is not None and uid_of(status.supervisor_pid) == user.pw_uid
    assert Path(run_dir).stat().st_uid == user.pw_uid
    users = {run_dir: "daemon"}
    states = await run_states(transport, node, [run_dir], tokens={run_dir: "t1"}, users=users, python=python)
    assert states[run_dir].state == "running"
    (answer,) = await stop_runs(transport, node, [run_dir], tokens={run_dir: "t1"}, users=users, force=True,
                                python=python)  # fmt: skip
    assert answer["signalled"]
    assert await gone(status.pid) and await gone(status.supervisor_pid)
    read = await read_file(transport, node, f"{run_dir}/output.log", limit=100, user="daemon", python=python)
    assert read is not None and read[1].decode().strip() == str(user.pw_uid)


async def _job_env(transport: AsUid, node: Node, run_dir: str, python: str) -> tuple[str, dict[str, str]]:
    """The umask and the environment a job of daemon's started through `transport` sees (`sh -c 'umask; env'`)."""
    started, _ = await start_run(
        transport, node, run_dir=run_dir, argv=["sh", "-c", "umask; env"], env={}, workdir="/tmp", token="t1",
        user="daemon", python=python,
    )  # fmt: skip
    assert started
    users, tokens = {run_dir: "daemon"}, {run_dir: "t1"}
    for _ in range(WAIT * 10):
        states = await run_states(transport, node, [run_dir], tokens=tokens, users=users, python=python)
        if states[run_dir].state == "exited":
            break
        await asyncio.sleep(0.1)
    assert states[run_dir].state == "exited" and states[run_dir].exit_code == 0, states[run_dir]
    read = await read_file(transport, node, f"{run_dir}/output.log", limit=65536, user="daemon", python=python)
    assert read is not None
    umask, *lines = read[1].decode().splitlines()
    return umask, dict(line.split("=", 1) for line in lines if "=" in line)


async def test_a_job_switched_through_sudo_gets_the_environment_and_umask_of_one_switched_by_root(
    sudoers: Callable[[str], None], shared_run_root: str
) -> None:
    """sudo leaves SUDO_*, MAIL and its own umask behind; the job must not see them, as when root switches."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    sudoers(f"nobody ALL=(daemon) NOPASSWD: {python}")
    user = pwd.getpwnam("daemon")
    root = f"{shared_run_root.replace('{user}', 'daemon')}/cid"
    through_sudo = await _job_env(
        AsUid(NOBODY), Node(name="sudo-node", host="127.0.0.1", port=None, user=None, pool="default"),
        f"{root}/1/1/0", python,
    )  # fmt: skip
    by_root = await _job_env(
        AsUid(0), Node(name="root-node", host="127.0.0.1", port=None, user=None, pool="default"), f"{root}/2/1/0",
        python,
    )  # fmt: skip
    for umask, env in (through_sudo, by_root):
        assert umask == "0077", (umask, env)
        assert not [name for name in env if name.startswith("SUDO_")], env
        assert not {"MAIL", "OLDPWD", "XDG_RUNTIME_DIR"} & set(env), env
        mine = {"HOME": user.pw_dir, "USER": "daemon", "LOGNAME": "daemon", "SHELL": user.pw_shell}
        assert {name: env.get(name) for name in mine} == mine, env
    # the SSH account is the user: no switch, the session's own environment, and still umask 077
    umask, _ = await _job_env(
        AsUid(user.pw_uid), Node(name="self-node", host="127.0.0.1", port=None, user=None, pool="default"),
        f"{root}/3/1/0", python,
    )  # fmt: skip
    assert umask == "0077"


def test_a_debug_shell_of_a_non_root_login_switches_through_sudo_or_says_what_it_needs(
    sudoers: Callable[[str], None], shared_run_root: str
) -> None:
    """`ftconsole shell` on another user's job, logged in as an account that is neither root nor that user
    (daemon here, the job's user nobody): the node-side snippet goes on through `sudo -n -u nobody`, with the
    job's environment clean-up and umask, or says what sudo said."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    name = pwd.getpwuid(NOBODY).pw_name
    top = Path(shared_run_root.split("/{user}")[0])
    run_dir = top / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "env.json").write_text(json.dumps({"MARK": "the user's"}))
    for path in (run_dir, run_dir / "env.json"):
        os.chown(path, NOBODY, NOBODY)
    command = 'id -u; umask; echo "[$MARK]"; env | grep -c "^SUDO_" || true'

    def as_daemon() -> subprocess.CompletedProcess[str]:
        remote = job_remote_command(str(run_dir), banner="b", command=command, python=python, user=name)
        return subprocess.run(
            ["/bin/sh", "-c", remote], capture_output=True, text=True, timeout=WAIT, check=False, user=1, group=1,
            extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/usr/sbin", "USER": "daemon"},
        )  # fmt: skip

    refused = as_daemon()
    assert (refused.returncode, refused.stdout) == (NO_FOLDER_EXIT, ""), refused.stderr
    assert (
        f"ftconsole: this run folder is {name}'s, the job's user; this login (daemon) is not root and may not run "
        f"{python} as {name} through sudo without a password (sudo said: "
    ) in refused.stderr
    sudoers(f"daemon ALL=({name}) NOPASSWD: {python}")
    done = as_daemon()
    assert (done.returncode, done.stdout) == (0, f"{NOBODY}\n0077\n[the user's]\n0\n"), done.stderr
    assert done.stderr == f"ftconsole: running as {name} (uid {NOBODY}), the job's user, not as daemon\n"


async def test_the_scheduler_kills_what_is_left_of_another_uids_run_whose_supervisor_died(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, shared_run_root)
    async with running(loaded) as (_, client):
        submitted = (await as_nobody(loaded.socket_path, "submit", spec=job("orphan", "sleep 300")))["result"]
        shown = await until(
            client, submitted["id"], lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "a pid"
        )
        (run,) = shown["attempts"][0]["runs"]
        status = json.loads((Path(run["run_dir"]) / "status.json").read_text())
        assert uid_of(status["supervisor_pid"]) == NOBODY
        os.kill(status["supervisor_pid"], signal.SIGKILL)  # its step lives on, holding the GPU: orphaned
        shown = await finished(client, submitted["id"])
        assert await gone(run["pid"]), "the orphaned step still runs"
        events = await client.call("events", job=submitted["id"])
        assert any(e["kind"] == "Killed" and "its supervisor is gone" in e["message"] for e in events), events
        assert shown["attempts"][0]["runs"][0]["state"] == "lost"
