"""One lab node: its folder, host key, simulated GPUs, environment and SSH server on its own loopback port."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

import asyncssh

from ftconsole.lab.files import LabPaths, _write_atomic
from ftconsole.lab.gpus import render_gpus
from ftconsole.lab.keys import _load_or_create_key
from ftconsole.lab.layout import DEFAULT_DRIVER_VERSION
from ftconsole.lab.plan import LAB_HOST, NodeSpec
from ftconsole.lab.session import _Child, _NodeServer
from ftconsole.scheduler.ssh import local_user

_INHERITED_ENV = ("PATH", "LANG")
_PROTECTED_ENV = ("HOME", "USER", "LOGNAME", "FTCONSOLE_SIM_GPUS", "FTCONSOLE_LAB_NODE", "FTCONSOLE_LAB_ROOT")


class LabNode:
    """One lab node: a folder, a host key, simulated GPUs and an SSH server on its own port."""

    def __init__(self, spec: NodeSpec, paths: LabPaths, driver_version: str = DEFAULT_DRIVER_VERSION) -> None:
        self.spec = spec
        self.name = spec.name
        self.host = LAB_HOST
        self.port = 0
        self.dir = paths.node_dir(spec.name)
        self.home = self.dir / "home"
        self.gpus_path = self.dir / "gpus.json"
        self.host_key_path = self.dir / "host_key"
        self.driver_version = driver_version
        self.stopping = False
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self._children: set[_Child] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._host_key: asyncssh.SSHKey | None = None
        self._env = {
            **{k: os.environ[k] for k in _INHERITED_ENV if k in os.environ},
            "USER": local_user(),
            "LOGNAME": local_user(),
            "HOME": str(self.home),
            "FTCONSOLE_SIM_GPUS": str(self.gpus_path),
            "FTCONSOLE_LAB_NODE": spec.name,
            "FTCONSOLE_LAB_ROOT": str(paths.root),
        }
        self._env.setdefault("PATH", os.defpath)

    @property
    def host_key(self) -> asyncssh.SSHKey:
        assert self._host_key is not None, "prepare() first"
        return self._host_key

    def prepare(self) -> None:
        """Create the folders, load (or create) the host key and write gpus.json from the layout."""
        (self.home / "cache").mkdir(parents=True, exist_ok=True)
        self._host_key = _load_or_create_key(self.host_key_path)
        self.write_gpus(render_gpus(self.spec, self.driver_version))

    async def start(self, authorized: asyncssh.SSHAuthorizedKeys, port: int = 0) -> None:
        self._acceptor = await asyncssh.listen(
            host=self.host,
            port=port,
            server_host_keys=[self.host_key],
            authorized_client_keys=authorized,
            server_factory=lambda: _NodeServer(self),
            encoding=None,
            agent_forwarding=False,
            allow_scp=False,
            gss_host=None,
            login_timeout=30,
            line_editor=False,  # a pty session gets a real pty, which edits lines itself
        )
        self.port = self._acceptor.get_port()

    @property
    def listening(self) -> bool:
        return self._acceptor is not None

    def session_env(self, client_env: Mapping[str, str]) -> dict[str, str]:
        """The environment of a session: the node's, plus what the client sent (never HOME or the lab's)."""
        env = dict(self._env)
        env.update((k, v) for k, v in client_env.items() if k not in _PROTECTED_ENV)
        return env

    # simulated GPUs: tests and the demo may change them while the lab runs
    def gpus(self) -> dict[str, Any]:
        return json.loads(self.gpus_path.read_text())

    def write_gpus(self, data: Mapping[str, Any]) -> None:
        _write_atomic(self.gpus_path, json.dumps(data, indent=1) + "\n")

    def update_gpu(self, index: int, **fields: Any) -> None:
        """Change fields of one GPU in gpus.json, e.g. ``update_gpu(2, ecc_uncorrectable=4)``."""
        data = self.gpus()
        data["gpus"][index].update(fields)
        self.write_gpus(data)

    # sessions and their processes
    def start_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def track(self, child: _Child) -> None:
        self._children.add(child)

    def untrack(self, child: _Child) -> None:
        self._children.discard(child)

    @property
    def processes(self) -> list[int]:
        """Pids of the commands of this node's sessions that are still running."""
        return [c.pid for c in self._children if c.pid is not None and not c.exited]

    def signal_sessions(self, sig: int) -> None:
        for child in list(self._children):
            child.signal_group(sig)

    async def close_listener(self) -> None:
        self.stopping = True
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_sessions(self, timeout: float) -> None:
        pending = [c.done for c in self._children if not c.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for child in list(self._children):
            child.close()

    async def close_connections(self, timeout: float) -> None:
        conns = list(self.connections)
        for conn in conns:
            conn.close()
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
