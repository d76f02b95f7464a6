"""`ftconsole shell` against real sshd nodes: the real CLI runs the system ssh client, with --command, --print
and interactively under a pseudo-terminal (`script`), into a running job's rank and onto a node."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import TIMEOUT
from tests.cli_runner import Cli as CliBase
from tests.integration.test_run_as_sshd import NOBODY
from tests.integration.test_run_as_sshd import write_config as run_as_config
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd
VALUE = 'it\'s a "value" with $(touch PWNED) and `id`'


class Cli(CliBase):
    def interactive(
        self, *args: str, keys: str, wait_for: str, python: str = sys.executable, user: int | None = None
    ) -> str:
        """Run the CLI under a pseudo-terminal (`script`); type `keys` once `wait_for` was printed; all output.
        `user`: as that uid (group 65534, and group 0, which may reach the tests' sockets), with `python`."""
        if shutil.which("script") is None:
            pytest.skip("no `script` (util-linux) to give the CLI a pseudo-terminal")
        command = shlex.join([python, "-m", "ftconsole.cli", *args])
        as_user: dict[str, Any] = {} if user is None else {"user": user, "group": 65534, "extra_groups": [0]}
        proc = subprocess.Popen(
            ["script", "-qefc", command, "/dev/null"],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.env.get("HOME") if user is not None else None,
            **as_user,
        )
        assert proc.stdin is not None and proc.stdout is not None
        output = b""
        typed = False
        deadline = time.monotonic() + TIMEOUT
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                while True:
                    left = deadline - time.monotonic()
                    assert left > 0, f"no end of the session in {TIMEOUT}s: {output.decode(errors='replace')}"
                    if not sel.select(timeout=min(left, 1.0)):
                        continue
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    output += chunk
                    if not typed and wait_for.encode() in output:
                        proc.stdin.write(keys.encode())
                        proc.stdin.flush()
                        typed = True
            assert proc.wait(TIMEOUT) == 0, output.decode(errors="replace")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(TIMEOUT)
            proc.stdin.close()
            proc.stdout.close()
        assert typed, f"never printed {wait_for!r}: {output.decode(errors='replace')}"
        return output.decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture
def setup(sshd_cluster, tmp_path: Path, sock_dir: Path) -> tuple[Cli, SshdCluster, Path, Path]:
    cluster: SshdCluster = sshd_cluster(2, gpus=1)
    return Cli(write_config(cluster, tmp_path, sock_dir).file), cluster, tmp_path, sock_dir


def serve(cli: Cli, tmp_path: Path, sock_dir: Path) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115  (closed with the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftconsole.cli", "serve"], env=cli.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
    )
    log.close()
    deadline = time.monotonic() + TIMEOUT
    while not (sock_dir / "ft.sock").exists():
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        assert time.monotonic() < deadline, "serve never opened its socket"
        time.sleep(0.1)
    return proc


def stop_serving(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(TIMEOUT)


def until_runs(cli: Cli, job_id: int) -> dict[str, Any]:
    """The job once every run of its latest attempt is running."""
    deadline = time.monotonic() + TIMEOUT
    shown: dict[str, Any] = {}
    while time.monotonic() < deadline:
        shown = cli.json("show", str(job_id))
        assert shown["status"] in ("queued", "running"), shown["message"]
        runs = shown["attempts"][-1]["runs"] if shown["attempts"] else []
        if runs and all(r["state"] == "running" for r in runs):
            return shown
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never had every run running: {json.dumps(shown)[:2000]}")


def test_shell_into_a_running_jobs_rank(setup) -> None:
    cli, cluster, tmp_path, sock_dir = setup
    spec = tmp_path / "sleeper.yaml"
    spec.write_text(
        "name: sleeper\nmode: pytorch\nnodes: 2\ngpus_per_node: 1\ncommand: sleep 300\nworkdir: /tmp\n"
        f"env: {{SHELL_TEST_VAR: {json.dumps(VALUE)}}}\n"
    )
    proc = serve(cli, tmp_path, sock_dir)
    try:
        job_id = cli.json("submit", str(spec))["id"]
        shown = until_runs(cli, job_id)
        runs = {r["rank"]: r for r in shown["attempts"][-1]["runs"]}
        rank1 = runs[1]
        assert rank1["run_dir"].startswith(str(cluster.node(rank1["node"]).home))

        done = cli(
            "shell",
            str(job_id),
            "--rank",
            "1",
            "--command",
            'pwd; printf "%s\\n" "$SHELL_TEST_VAR" "$FTCONSOLE_LAB_NODE" "$RANK" "$FT_JOB_ID"',
        )
        assert done.stdout.splitlines() == [rank1["run_dir"], VALUE, rank1["node"], "1", str(job_id)]
        assert done.stderr == ""
        assert not list(tmp_path.parent.rglob("PWNED"))

        rank0 = cli("shell", str(job_id), "--command", "pwd; echo $FTCONSOLE_LAB_NODE").stdout.splitlines()
        assert rank0 == [runs[0]["run_dir"], runs[0]["node"]]
        assert cli("shell", str(job_id), "--attempt", "1", "--command", "exit 7", check=7).stdout == ""

        printed = shlex.split(cli("shell", str(job_id), "--rank", "1", "--print").stdout)
        node = cluster.node(rank1["node"])
        assert printed[:2] == ["ssh", "-t"] and printed[-2] == node.address
        assert f"UserKnownHostsFile={cluster.known_hosts}" in printed and "StrictHostKeyChecking=yes" in printed
        assert printed[printed.index("-p") + 1] == str(node.port)

        missing = cli("shell", "999", "--command", "true", check=2)
        assert missing.stderr == "ftconsole: not found: no job 999\n"
        no_rank = cli("shell", str(job_id), "--rank", "5", check=2)
        assert f"job {job_id} attempt 1 has no rank 5 (ranks: [0, 1])" in no_rank.stderr
        no_attempt = cli("shell", str(job_id), "--attempt", "3", check=2)
        assert f"job {job_id} has no attempt 3 (attempts: [1])" in no_attempt.stderr

        # interactively, under a pseudo-terminal: the banner, then a shell in the run folder with the run's env
        out = cli.interactive(
            "shell",
            str(job_id),
            "--rank",
            "1",
            keys='echo "dir=$(pwd)" "rank=$RANK" marker-$((6*7)); exit\n',
            wait_for="exit to return",
        )
        assert f"ftconsole: job {job_id} (sleeper, running) attempt 1 rank 1 (running) on {node.name}:" in out
        assert f"dir={rank1['run_dir']} rank=1 marker-42" in out
    finally:
        stop_serving(proc)


def test_shell_onto_a_node(setup) -> None:
    cli, cluster, _tmp_path, _ = setup
    node = cluster.node("node02")
    done = cli("shell", "node02", "--command", 'echo "$FTCONSOLE_LAB_NODE"; pwd')
    assert done.stdout.splitlines() == ["node02", str(node.home)]
    assert cli("shell", "node01", "--command", "exit 3", check=3).stderr == ""

    unknown = cli("shell", "node09", check=2)
    assert unknown.stderr.startswith("ftconsole: not found: no node 'node09' in ")
    assert cli("shell", "node01", "--rank", "1", check=2).stderr.startswith(
        "ftconsole: bad input: --rank and --attempt"
    )

    out = cli.interactive("shell", "node01", keys="echo marker-$((6*7)) $FTCONSOLE_LAB_NODE; exit\n", wait_for="$HOME")
    assert "ftconsole: node node01 (unknown: not probed yet) - login shell in $HOME; exit to return\n" in out
    assert "marker-42 node01" in out


def test_shell_refuses_a_changed_host_key(setup) -> None:
    cli, cluster, _tmp_path, _ = setup
    cluster.change_host_key("node01")
    refused = cli("shell", "node01", "--command", "echo ran", check=255)
    assert "ran" not in refused.stdout
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr or "verification failed" in refused.stderr


# -- another user's job: root's shell must not run that user's code as root ------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="a job of another uid needs root")
async def test_roots_shell_on_another_users_job_runs_as_that_user(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path, shared_run_root: str
) -> None:
    """uid 65534 submits a job whose env puts a folder of its own first on PATH (an `id` that records who ran
    it) and names a startup file in BASH_ENV and ENV; root runs `ftconsole shell JOB --command 'id -u'`. The
    user's programs may run, but as the user only: never as root."""
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = run_as_config(cluster, tmp_path, sock_dir, shared_run_root)
    trap = Path(shared_run_root.split("/{user}")[0]) / "trap"  # removed with the run root
    (trap / "bin").mkdir(parents=True)
    trap.chmod(0o755)
    (trap / "bin").chmod(0o755)
    record = trap / "ran-as"
    record.touch(mode=0o666)
    record.chmod(0o666)
    fake_id = trap / "bin" / "id"
    fake_id.write_text(f'#!/bin/sh\n/usr/bin/id -u >> {record}\nexec /usr/bin/id "$@"\n')
    startup = trap / "startup.sh"
    startup.write_text(f"/usr/bin/id -u >> {record}\n")
    for script in (fake_id, startup):
        script.chmod(0o755)
    env = {"PATH": f"{trap / 'bin'}:/usr/local/bin:/usr/bin:/bin", "BASH_ENV": str(startup), "ENV": str(startup)}
    cli = Cli(loaded.file)
    async with running(loaded) as (_, client):
        spec = job("trap", "sleep 300", env=env, workdir="/tmp")
        job_id = (await as_nobody(loaded.socket_path, "submit", spec=spec))["result"]["id"]
        try:
            await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "a pid")
            record.write_text("")  # whatever the job itself ran (as its user) is not the question
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ftconsole.cli", "shell", str(job_id), "--command", "id -u",
                env=cli.env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
            stdout, stderr = out.decode(), err.decode()
            # the run's env was loaded (the user's `id` ran), as the user
            assert set(record.read_text().split()) == {str(NOBODY)}, f"ran as: {record.read_text()!r}; {stdout}{stderr}"
            assert (proc.returncode, stdout) == (0, f"{NOBODY}\n"), stderr
            name = pwd.getpwuid(NOBODY).pw_name
            assert stderr == f"ftconsole: running as {name} (uid {NOBODY}), the job's user, not as root\n"

            # and interactively (`s` in the console runs the same argv): the banner says as whom
            record.write_text("")
            typed = 'echo "uid=$(id -u) dir=$(pwd)"; exit\n'
            text = await asyncio.to_thread(cli.interactive, "shell", str(job_id), keys=typed, wait_for="not as root")
            assert f"ftconsole: this shell runs as {name} (uid {NOBODY}), the job's user, not as root" in text
            assert f"uid={NOBODY} dir=/" in text
            assert set(record.read_text().split()) == {str(NOBODY)}, record.read_text()
        finally:
            await client.call("stop", jobs=[job_id])
        assert (await finished(client, job_id))["status"] == "stopped"
