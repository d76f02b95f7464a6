"""Interactive work as a cluster's users meet it: a real second account, with a home, an SSH key of its own and the
nodes' host keys in its known_hosts (as an admin's /etc/ssh/ssh_known_hosts gives them), runs the CLI itself. Its
`alloc` opens an interactive shell on the allocation's first node, its `run` steps go over both nodes, through its
own SSH logins; its idle allocation is warned in its shell, then ends; its hold, release and `--begin` place its
jobs as documented. Nothing of the scheduler's SSH account (key, known_hosts, ssh config) is readable to it, and
nothing runs as anyone but that account. What is checked is what the nodes did: who ran, where, with which GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import ftconsole
from tests.accounts import live_of, remove_account
from tests.cli_runner import TIMEOUT
from tests.integration.test_alloc_sshd import alive
from tests.integration.test_idle_sshd import Terminal
from tests.integration.test_run_as_sshd import write_config
from tests.integration.test_scheduler_sshd import finished, poll, running
from tests.integration.test_shell_sshd import Cli
from tests.sshd_cluster import SshdCluster

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(os.geteuid() != 0, reason="a second real account (useradd) needs root"),
]

CHECKOUT = Path(ftconsole.__file__).resolve().parent.parent


@dataclass
class Guest:
    name: str
    uid: int
    home: Path
    python: str  # an interpreter it may run, with the checkout and its packages on PYTHONPATH
    config: Path = Path()  # the cluster's config where it may read it

    def env(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": f"{CHECKOUT}:{sysconfig.get_paths()['purelib']}:{sysconfig.get_paths()['platlib']}",
            "FTCONSOLE_CONFIG": str(self.config),
            "LANG": "C.UTF-8",
            "TERM": "xterm",
        }

    async def cli(self, *args: str) -> tuple[int, str, str]:
        """`ftconsole ARGS` as this account (and group 0, which may reach the test's socket)."""
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "ftconsole.cli", *args, env=self.env(), cwd=str(self.home), user=self.uid,
            group=65534, extra_groups=[0], stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
        return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
def guest() -> Iterator[Guest]:
    """A real account of its own, made for this test and removed after it, with a home (in a folder every user may
    reach, as /home is), an ed25519 key of its own that its home's authorized_keys lets in."""
    if shutil.which("useradd") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("useradd and ssh-keygen are needed to make a second account with a key")
    homes = Path(tempfile.mkdtemp(prefix="ftconsole-homes-", dir="/tmp"))
    name = f"ftg{secrets.token_hex(4)}"
    home = homes / name
    try:
        homes.chmod(0o755)
        # password '*': none, but not a locked account ('!'), which sshd refuses even a key without PAM
        subprocess.run(["useradd", "--system", "--password", "*", "--create-home", "--home-dir", str(home),
                        "--no-user-group", "--gid", "65534", "--shell", "/bin/sh", name], check=True)  # fmt: skip
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(ssh / "id_ed25519")],
                       check=True)  # fmt: skip
        shutil.copy(ssh / "id_ed25519.pub", ssh / "authorized_keys")
        for path in (ssh, *ssh.iterdir()):
            os.chown(path, uid, 65534)
        python = _python_for(uid, Guest(name, uid, home, ""))
        yield Guest(name, uid, home, python)
    finally:
        remove_account(name)
        shutil.rmtree(homes, ignore_errors=True)


def _python_for(uid: int, guest: Guest) -> str:
    """An interpreter of this Python's version that the account may run and that imports the checkout's CLI (this
    venv's own may sit under root's private home); skips the test when there is none (a checkout it cannot read)."""
    found = []
    for python in dict.fromkeys([sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]):
        if not python:
            continue
        check = f"import sys, ftconsole.cli; assert sys.version_info[:2] == {tuple(sys.version_info[:2])!r}"
        try:
            done = subprocess.run([python, "-c", check], env=guest.env(), user=uid, group=65534, cwd="/",
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
        except OSError as exc:
            found.append(f"{python}: {exc}")
            continue
        if done.returncode == 0:
            return python
        found.append(f"{python}: {done.stderr.strip().splitlines()[-1:]}")
    pytest.skip(f"no interpreter runs this checkout as another account: {'; '.join(found)}")


def guest_config(guest: Guest, loaded: Any, cluster: SshdCluster) -> Path:
    """The cluster's config where the account may read it (as /etc/ftconsole/cluster.yaml), its paths made whole;
    the scheduler's key and known_hosts stay root's own. The nodes' host keys go to the account's known_hosts."""
    data = yaml.safe_load(loaded.file.read_text())
    base = loaded.file.parent
    for key in ("known_hosts", "identity_file", "config_file"):
        if data.get("ssh", {}).get(key):
            data["ssh"][key] = str(base / data["ssh"][key])
    data["state_dir"] = str(base / data.get("state_dir", "state"))
    config = guest.home / "cluster.yaml"
    config.write_text(yaml.safe_dump(data))
    os.chown(config, guest.uid, 65534)
    known = guest.home / ".ssh" / "known_hosts"
    known.write_text(cluster.known_hosts.read_text())
    os.chown(known, guest.uid, 65534)
    guest.config = config
    return config


async def test_a_second_account_allocates_shells_in_and_runs_steps_through_its_own_ssh(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str, guest: Guest
) -> None:
    cluster: SshdCluster = sshd_cluster(2, gpus=2)
    cluster.admit(guest.name)
    # the nodes' own python3 runs what a user's login starts there (the scheduler's venv is root's); the scheduler's
    # ssh config file is root's own too
    (tmp_path / "ssh_config").write_text("ServerAliveCountMax 3\n")
    ssh = {"python": "/usr/bin/python3", "config_file": str(tmp_path / "ssh_config")}
    idle = {"idle_timeout": "15s", "idle_warning": "8s"}
    loaded = write_config(
        cluster, tmp_path, sock_dir, shared_run_root, ssh=ssh, scheduler=idle, probes={"interval": "2s"}
    )
    guest_config(guest, loaded, cluster)
    # the scheduler's SSH account's key, known_hosts and config: not the guest's to use
    for private in (cluster.key, cluster.known_hosts, tmp_path / "ssh_config"):
        assert subprocess.run(["test", "-r", str(private)], user=guest.uid, group=65534).returncode != 0, private
    async with running(loaded) as (_, client):
        # an allocation of both nodes, kept, and its interactive shell under a terminal: the allocation's GPU, the
        # account's uid, the first rank's run folder
        typed = 'echo "shell gpus=$CUDA_VISIBLE_DEVICES uid=$(id -u) dir=$(pwd)"; exit\n'
        args = ["alloc", "--nodes", "2", "--gpus-per-node", "1", "--keep"]
        text = await asyncio.to_thread(_interactive, guest, args, typed, "env of the run loaded")
        alloc = int(text.split("allocation ", 1)[1].split()[0])
        shown = await client.call("show", job=alloc)
        assert shown["owner"] == guest.name and shown["status"] == "running"
        runs = shown["attempts"][0]["runs"]
        assert f"shell gpus={runs[0]['gpus'][0]} uid={guest.uid} dir={runs[0]['run_dir']}" in text, text
        assert f"allocation {alloc} kept" in text

        # a step on the first node, then a pytorch step over both: each rank its node's GPU, as the account
        code, out, err = await guest.cli("run", str(alloc), "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $(id -u)"')
        assert (code, out) == (0, f"{runs[0]['gpus'][0]} {guest.uid}\n"), err
        # (the node: the address its login reached, from SSH_CONNECTION)
        argv = ["sh", "-c", 'set -- $SSH_CONNECTION; echo "$RANK/$WORLD_SIZE $CUDA_VISIBLE_DEVICES $(id -u) $3"']
        code, out, err = await guest.cli("run", str(alloc), "--mode", "pytorch", "--", *argv)
        assert code == 0, err
        address = {n.name: n.address for n in cluster.nodes}
        expected = {f"{rank}/2 {r['gpus'][0]} {guest.uid} {address[r['node']]}" for rank, r in enumerate(runs)}
        assert set(out.splitlines()) == expected, out

        # a shell of the account's, and nobody types: the warning shows in it, then the allocation ends by itself,
        # the shell with it; what held the GPUs is gone on both nodes
        terminal = Terminal(guest.config, alloc, python=guest.python, env=guest.env(), user=guest.uid)
        try:
            await poll(lambda: asyncio.sleep(0, terminal.shown), lambda s: b"has been idle since" in s,
                       "the warning in the shell")  # fmt: skip
            ended = await finished(client, alloc)
            await poll(lambda: asyncio.sleep(0, terminal.ended()), bool, "the shell to end with the allocation")
        finally:
            terminal.close()
        assert ended["status"] == "stopped" and "past its idle_timeout 15s" in ended["message"], ended["message"]
        steps = {s["number"]: s["state"] for s in ended["steps"]}
        assert steps == {1: "succeeded", 2: "succeeded"}, ended["steps"]
        held = [r["pid"] for r in ended["attempts"][0]["runs"]]
        assert len(held) == 2 and all(held) and not any(alive(pid) for pid in held)
        # nothing of the shell, the steps or the allocation runs on as the account
        await poll(
            lambda: asyncio.to_thread(_processes_of, guest.uid), lambda pids: not pids, "the account's processes to end"
        )

        # its own hold and release: a held job waits, released it runs
        spec = guest.home / "job.yaml"
        spec.write_text(yaml.safe_dump({"name": "later", "command": "true", "gpus_per_node": 1}))
        code, out, err = await guest.cli("submit", str(spec), "--hold", "--json")
        assert code == 0, err
        held = int(json.loads(out)["id"])
        shown = await poll(lambda: client.call("show", job=held), lambda j: bool(j["message"]), "the hold's note")
        assert shown["status"] == "queued" and shown["held"]["by"] == guest.name and not shown["held"]["admin"]
        code, _, err = await guest.cli("release", str(held))
        assert code == 0, err
        assert (await finished(client, held))["status"] == "succeeded"
        # and --begin: not placed before then, on free GPUs
        code, out, err = await guest.cli("submit", str(spec), "--begin", "+3s", "--json")
        assert code == 0, err
        later = json.loads(out)
        waits = await poll(lambda: client.call("show", job=later["id"]), lambda j: bool(j["message"]), "its note")
        assert waits["status"] == "queued" and "not before" in waits["message"], waits["message"]
        done = await finished(client, later["id"])
        assert done["status"] == "succeeded" and done["attempts"][0]["started"] >= waits["submitted"] + 3


def _interactive(guest: Guest, args: list[str], keys: str, wait_for: str) -> str:
    """The CLI as the account under a pseudo-terminal (`script`), `keys` typed once `wait_for` was printed."""
    cli = Cli(guest.config)
    cli.env = guest.env()
    return cli.interactive(*args, keys=keys, wait_for=wait_for, python=guest.python, user=guest.uid)


def _processes_of(uid: int) -> dict[int, bytes]:
    """The live processes of `uid` (pid -> command line), but for the scheduler's own channel to the nodes as that
    user (it reads the user's run folders as the user, and closes once idle a minute)."""
    found = {}
    for pid in live_of(uid):
        with contextlib.suppress(OSError):  # gone since
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
    return {pid: line for pid, line in found.items() if b"ftconsole-channel" not in line}
