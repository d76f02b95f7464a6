"""Idle reclaim end to end on a real sshd node: an allocation gets the cluster's idle_timeout; a step keeps it at work
past it; then, with a shell open in it and nobody typing, the warning is written in that shell, a job_idle alert is
raised, and the allocation ends once idle for its idle_timeout, its shell with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import finished, poll, running, write_config
from tests.integration.test_steps_sshd import allocation
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

WAIT = 90.0


class Terminal:
    """`ftconsole shell JOB` on a pseudo-terminal of its own, as a user's terminal; what it shows, read as it comes.
    `user`: as that uid (group 65534, and group 0, which may reach the tests' sockets), in `env`, with `python`."""

    def __init__(
        self,
        config: Path,
        job: int,
        *,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        user: int | None = None,
    ) -> None:
        env = env or {**os.environ, "FTCONSOLE_CONFIG": str(config), "TERM": "dumb"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the shell's client on the terminal, and never pytest again
            try:
                if user is not None:
                    os.setgroups([0])
                    os.setgid(65534)
                    os.setuid(user)
                    os.chdir(env.get("HOME", "/"))
                os.execvpe(python, [python, "-m", "ftconsole.cli", "shell", str(job)], env)
            finally:
                os._exit(127)
        self.shown = b""
        os.set_blocking(self.fd, False)
        asyncio.get_running_loop().add_reader(self.fd, self._read)

    def _read(self) -> None:
        try:
            self.shown += os.read(self.fd, 65536)
        except OSError:
            asyncio.get_running_loop().remove_reader(self.fd)

    def ended(self) -> bool:
        pid, _ = os.waitpid(self.pid, os.WNOHANG)
        return pid == self.pid

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.fd)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


async def test_an_idle_allocation_is_warned_in_its_shell_then_ends(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    idle = {"idle_timeout": "10s", "idle_warning": "5s"}
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=idle, probes={"interval": "2s"})
    async with running(loaded) as (_, client):
        alloc = await allocation(loaded.file)
        assert (await client.call("show", job=alloc))["spec"]["idle_timeout"] == 10  # the cluster's default
        # a step at work past the idle_timeout: the allocation goes on
        code, _, err = await cli(loaded.file, "run", str(alloc), "--", "sleep", "13")
        assert code == 0, err
        shown = await client.call("show", job=alloc)
        assert shown["status"] == "running" and not shown["stop_reason"]
        # a shell, and nobody types: the warning shows in it, then the allocation ends
        terminal = Terminal(loaded.file, alloc)
        try:
            await poll(lambda: asyncio.sleep(0, terminal.shown), lambda s: b"has been idle since" in s,
                       "the warning in the shell")  # fmt: skip
            alerts = await client.call("alerts")
            assert any(a["kind"] == "job_idle" and a["job"] == alloc for a in alerts)
            ended = await finished(client, alloc)
            assert ended["status"] == "stopped" and "idle for" in ended["message"], ended["message"]
            assert "past its idle_timeout 10s" in ended["message"]
            kinds = [e["kind"] for e in ended["events"]]
            assert "IdleWarning" in kinds
            await poll(lambda: asyncio.sleep(0, terminal.ended()), bool, "the shell to end with the allocation")
        finally:
            terminal.close()
        alerts = await client.call("alerts")
        assert not any(a["kind"] == "job_idle" and a["job"] == alloc for a in alerts)  # resolved with its end
        # off is refused where the cluster bounds idle allocations; within the bound, a job's own is kept
        code, _, err = await cli(loaded.file, "alloc", "--idle-timeout", "off", "--command", "true")
        assert code == 0, err  # no max_idle_timeout here: off is the user's to ask
