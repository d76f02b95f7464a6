"""One lab node: its folder, host key, simulated GPUs, environment and SSH server on its own loopback port.

The node owns its listening socket and serves SSH on a duplicate of it, so that it can stop serving without
closing the port: a frozen node (`freeze`, the hang fault) still completes TCP handshakes in the kernel's
backlog but never sends a banner, and its open connections are neither read nor answered, as with a
SIGSTOPped sshd; `thaw` serves the same socket again, connections that waited in the backlog included.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import Mapping
from typing import Any

import asyncssh

from ftconsole.lab.faults import NodeState
from ftconsole.lab.files import LabPaths, _write_atomic
from ftconsole.lab.gpus import render_gpus
from ftconsole.lab.keys import _load_or_create_key
from ftconsole.lab.layout import DEFAULT_DRIVER_VERSION
from ftconsole.lab.plan import LAB_HOST, NodeSpec
from ftconsole.lab.session import _Child, _NodeServer
from ftconsole.scheduler.node.proc import start_time
from ftconsole.scheduler.ssh.transport import local_user

_INHERITED_ENV = ("PATH", "LANG")
_PROTECTED_ENV = ("HOME", "USER", "LOGNAME", "FTCONSOLE_SIM_GPUS", "FTCONSOLE_LAB_NODE", "FTCONSOLE_LAB_ROOT")
_BACKLOG = 100  # asyncssh's default


def _transport(conn: asyncssh.SSHServerConnection) -> asyncio.Transport | None:
    # asyncssh can pause one channel but not a whole connection, and a frozen node must not even answer
    # keep-alives or open channels: so the socket transport under the connection is paused itself.
    transport = getattr(conn, "_transport", None)
    return transport if isinstance(transport, asyncio.Transport) else None


class LabNode:
    """One lab node: a folder, a host key, simulated GPUs and an SSH server on its own port."""

    def __init__(
        self,
        spec: NodeSpec,
        paths: LabPaths,
        driver_version: str = DEFAULT_DRIVER_VERSION,
        *,
        shared_home: bool = False,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.host = LAB_HOST
        self.port = 0
        self.dir = paths.node_dir(spec.name)
        # with shared_home every node has the same HOME (an NFS /home): only FTCONSOLE_LAB_NODE tells them apart
        self.home = paths.shared_home if shared_home else self.dir / "home"
        self.gpus_path = self.dir / "gpus.json"
        self.host_key_path = self.dir / "host_key"
        self.driver_version = driver_version
        self.stopping = False
        self.state = NodeState.DOWN
        self.stopped: dict[int, int | None] = {}  # pid -> start time: the processes the hang fault stopped
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self._children: set[_Child] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._socket: socket.socket | None = None
        self._authorized: asyncssh.SSHAuthorizedKeys | None = None
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
        self.dir.mkdir(parents=True, exist_ok=True)  # not under the home folder when the nodes share one
        (self.home / "cache").mkdir(parents=True, exist_ok=True)
        self._host_key = _load_or_create_key(self.host_key_path)
        self.write_gpus(render_gpus(self.spec, self.driver_version))

    async def start(self, authorized: asyncssh.SSHAuthorizedKeys, port: int = 0) -> None:
        """Listen on `port` (0: any free one) and serve SSH there; OSError when the port is taken."""
        sock = socket.create_server((self.host, port), backlog=_BACKLOG)  # SO_REUSEADDR: the port may be in TIME_WAIT
        try:
            self._authorized = authorized
            self._socket = sock
            await self._serve()
        except BaseException:
            self._socket = None
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.stopping = False
        self.state = NodeState.UP

    async def _serve(self) -> None:
        """Serve SSH on a duplicate of the node's socket (asyncio closes the socket it served when it stops)."""
        assert self._socket is not None and self._authorized is not None
        authorized = self._authorized
        self._acceptor = await asyncssh.listen(
            sock=self._socket.dup(),
            backlog=_BACKLOG,
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
        if self.state is NodeState.HUNG and child.pid is not None:  # a session that was starting as the node froze
            child.signal_group(signal.SIGSTOP)
            child.pause_output()
            self.stopped[child.pid] = start_time(child.pid)

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
        """Stop listening: new connections are refused from now on (open ones stay until closed)."""
        self.stopping = True
        self.state = NodeState.DOWN
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # the hang fault
    def freeze(self) -> None:
        """Stop serving but keep the port: new connections wait in the backlog, open ones are not read."""
        if self._acceptor is not None:
            self._acceptor.close()  # closes its duplicate of the socket, not the node's
            self._acceptor = None
        self.pause_io()
        self.state = NodeState.HUNG

    async def thaw(self) -> None:
        """Serve again what `freeze` stopped: the open connections and the port, with its backlog."""
        self.resume_io()
        if self._acceptor is None and self._socket is not None:
            await self._serve()
        self.state = NodeState.UP

    def pause_io(self) -> None:
        for conn in self.connections:
            if (transport := _transport(conn)) is not None and not transport.is_closing():
                transport.pause_reading()
        for child in self._children:
            child.pause_output()

    def resume_io(self) -> None:
        for conn in self.connections:
            if (transport := _transport(conn)) is not None and not transport.is_closing():
                transport.resume_reading()
        for child in self._children:
            child.resume_output()

    async def wait_sessions(self, timeout: float) -> None:
        pending = [c.done for c in self._children if not c.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for child in list(self._children):
            child.close()

    async def close_connections(self, timeout: float, *, abort: bool = False) -> None:
        """Close every connection (with abort, drop it: no disconnect message, as when a machine dies)."""
        conns = list(self.connections)
        for conn in conns:
            if abort:
                conn.abort()
            else:
                conn.close()
        if conns:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in conns]
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
