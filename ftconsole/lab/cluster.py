"""The lab in this process (`LabCluster`): starts its nodes, writes the client files, injects faults into
nodes and heals them, stops and kills it all."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncssh
import yaml

from ftconsole.lab.clusterconfig import check_cluster_config, render_cluster_config
from ftconsole.lab.faults import Fault, FaultKind, FaultReport, NodeState, plural
from ftconsole.lab.files import LabPaths, _write_atomic, default_layout_path
from ftconsole.lab.gpus import ecc_counts, with_ecc_error, without_ecc_errors
from ftconsole.lab.keys import _load_or_create_key, _public_line
from ftconsole.lab.layout import LabLayout, load_layout
from ftconsole.lab.node import LabNode
from ftconsole.lab.plan import LAB_HOST, plan_nodes
from ftconsole.lab.processes import (
    KILL_GRACE_S,
    STOP_TIMEOUT_S,
    PidLock,
    _raise_nofile_limit,
    _signal_all,
    find_lab_processes,
)
from ftconsole.lab.records import LabInfo, LabNodeInfo
from ftconsole.lab.session import reset_session_signals
from ftconsole.scheduler.errors import LabError, NotFound, UsageError
from ftconsole.scheduler.node.proc import start_time
from ftconsole.scheduler.ssh.transport import local_user

log = logging.getLogger("ftconsole.lab")


class LabCluster:
    """The lab in this process: ``async with LabCluster(lab_dir, layout, nodes=N) as lab: ...``.

    `layout` is a LabLayout, a layout file, or None for the default (config/lab.yaml or the built-in one);
    `nodes` replaces the layout's nodes by N nodes named lab01.. in the layout's proportions; `shared_home`,
    when not None, replaces the layout's `shared_home` (True: every node's HOME is <lab>/home).
    """

    def __init__(
        self,
        lab_dir: Path | str | None = None,
        layout: LabLayout | Path | str | None = None,
        nodes: int | None = None,
        *,
        shared_home: bool | None = None,
    ) -> None:
        self.paths = LabPaths.of(lab_dir)
        self.layout_path = (
            None if isinstance(layout, LabLayout) else (Path(layout) if layout else default_layout_path())
        )
        self.layout = layout if isinstance(layout, LabLayout) else load_layout(self.layout_path)
        self.shared_home = self.layout.shared_home if shared_home is None else shared_home
        self.nodes = tuple(
            LabNode(spec, self.paths, self.layout.driver_version, shared_home=self.shared_home)
            for spec in plan_nodes(self.layout, nodes)
        )
        self.started = ""
        self.user = local_user()
        self._lock = PidLock(self.paths.lock)
        self._authorized: asyncssh.SSHAuthorizedKeys | None = None
        self._running = False
        self._faults = asyncio.Lock()  # one fault at a time: each reads and changes a node's state

    async def __aenter__(self) -> LabCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def lab_dir(self) -> Path:
        return self.paths.root

    @property
    def config_path(self) -> Path:
        return self.paths.cluster_config

    def node(self, name: str) -> LabNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabError(f"no node {name} in the lab")

    async def start(self) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock.acquire()
        try:
            _raise_nofile_limit()
            reset_session_signals()
            self._authorized = authorized = self._prepare()
            await self._listen(authorized)
            self._write_client_files()
        except BaseException:
            await self._shutdown()
            self._lock.release()
            raise
        self.started = datetime.now(UTC).isoformat(timespec="seconds")
        self._running = True
        homes = f"one home shared by all, {self.paths.shared_home}" if self.shared_home else "a home each"
        log.info("lab up: %d nodes in %s (%s)", len(self.nodes), self.lab_dir, homes)

    def _prepare(self) -> asyncssh.SSHAuthorizedKeys:
        self.paths.state_dir.mkdir(exist_ok=True)
        pub = self.paths.client_key.with_name("id_ed25519.pub")
        client = _load_or_create_key(self.paths.client_key, public=pub)
        if not pub.is_file() or pub.read_text().split()[:2] != _public_line(client).split():
            _write_atomic(pub, _public_line(client) + " ftconsole-lab\n")
        for node in self.nodes:
            node.prepare()
        return asyncssh.import_authorized_keys(_public_line(client) + "\n")

    def _wanted_ports(self) -> list[int]:
        if self.layout.base_port is not None:
            last = self.layout.base_port + len(self.nodes) - 1
            if last > 65535:
                raise LabError(f"base_port {self.layout.base_port} + {len(self.nodes)} nodes passes port 65535")
            return [self.layout.base_port + i for i in range(len(self.nodes))]
        try:
            previous = json.loads(self.paths.ports.read_text())
        except (OSError, ValueError):
            previous = {}
        return [int(previous.get(n.name, 0)) if isinstance(previous, dict) else 0 for n in self.nodes]

    async def _listen(self, authorized: asyncssh.SSHAuthorizedKeys) -> None:
        fixed = self.layout.base_port is not None

        async def one(node: LabNode, port: int) -> None:
            try:
                await node.start(authorized, port)
            except OSError as exc:
                if fixed or port == 0:
                    raise LabError(f"{node.name}: cannot listen on {LAB_HOST}:{port}: {exc.strerror or exc}") from exc
                await node.start(authorized, 0)  # the previous port is taken now

        results = await asyncio.gather(
            *(one(n, p) for n, p in zip(self.nodes, self._wanted_ports(), strict=True)), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    def _write_client_files(self) -> None:
        lines = [f"[{n.host}]:{n.port} {_public_line(n.host_key)}" for n in self.nodes]
        _write_atomic(self.paths.known_hosts, "\n".join(lines) + "\n")
        _write_atomic(self.paths.ports, json.dumps({n.name: n.port for n in self.nodes}) + "\n")
        config = render_cluster_config(self.layout, [(n.spec, n.port) for n in self.nodes], self.paths, self.user)
        check_cluster_config(config, str(self.paths.cluster_config))
        header = (
            "# The ftconsole lab cluster: generated by `ftconsole lab up` (ftconsole/lab/) from the lab layout\n"
            f"# {self.layout_path or '<built-in lab layout>'}; rewritten at every start of the lab.\n"
        )
        _write_atomic(self.paths.cluster_config, header + yaml.safe_dump(config, sort_keys=False, width=110))

    async def stop(self) -> None:
        """Stop listening, kill every process of every node, close the connections, release the lock."""
        if not self._running:
            return
        self._running = False
        try:
            await self._shutdown()
        finally:
            self._lock.release()
            log.info("lab stopped")

    async def _shutdown(self) -> None:
        await asyncio.gather(*(n.close_listener() for n in self.nodes))
        for n in self.nodes:
            n.resume_io()  # a hung node's sessions: to see their processes end
        await self._kill_processes()
        await asyncio.gather(*(n.wait_sessions(2.0) for n in self.nodes))
        await asyncio.gather(*(n.close_connections(2.0) for n in self.nodes))

    async def _kill_processes(self, node: LabNode | None = None, *, crash: bool = False) -> list[int]:
        """SIGTERM the sessions' process groups and every process of the lab (or of one node); then SIGKILL.

        With crash=True, SIGKILL at once: on a machine that dies nothing gets to clean up. The pids found."""
        nodes = [node] if node is not None else list(self.nodes)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        term_until = time.monotonic() + KILL_GRACE_S
        sig = signal.SIGKILL if crash else signal.SIGTERM
        killed: set[int] = set()
        while True:
            for n in nodes:
                n.signal_sessions(sig)
            found = find_lab_processes(self.lab_dir, node.name if node is not None else None)
            killed.update(found)
            _signal_all(found, sig)
            if sig == signal.SIGTERM:  # a stopped process (a hung node's) takes its SIGTERM when continued
                for n in nodes:
                    n.signal_sessions(signal.SIGCONT)
                _signal_all(found, signal.SIGCONT)
            if not found and not any(n.processes for n in nodes):
                return sorted(killed)
            if time.monotonic() > deadline:
                log.warning("lab processes still running after %gs: %s", STOP_TIMEOUT_S, found)
                return sorted(killed)
            if time.monotonic() > term_until:
                sig = signal.SIGKILL
            await asyncio.sleep(0.05)

    async def stop_node(self, name: str, *, kill: bool = False) -> None:
        """Take one node off the network: its SSH server stops and its connections drop.

        Commands of open sessions get SIGHUP; detached processes (run supervisors) keep running, as on a node
        that became unreachable. With kill=True every process of the node is killed too (a crashed node).
        """
        node = self.node(name)
        await node.close_listener()
        await node.close_connections(2.0)
        if kill:
            await self._kill_processes(node)
            await node.wait_sessions(2.0)

    async def start_node(self, name: str) -> None:
        """Bring a stopped node back on its port, with its host key (a hung one: serve it again)."""
        node = self.node(name)
        if node.state is NodeState.HUNG:
            await node.thaw()
        if node.listening:
            return
        assert self._authorized is not None, "start() first"
        try:
            await node.start(self._authorized, node.port)
        except OSError as exc:
            raise LabError(f"{name}: cannot listen on {node.host}:{node.port} again: {exc.strerror or exc}") from exc

    # -- faults ------------------------------------------------------------------------------------------------

    async def fault(self, name: str, fault: Fault) -> FaultReport:
        """Inject `fault` into node `name` (or heal it) and say what was done; see `ftconsole.lab.faults`.

        NotFound for an unknown node, UsageError for a GPU it does not have, LabError when the node's state
        does not allow it (a dead node cannot hang)."""
        if not self._running:
            raise LabError("the lab is not running")
        node = self._fault_node(name)
        async with self._faults:
            if fault.kind is FaultKind.KILL:
                return await self._kill(node, fault)
            if fault.kind is FaultKind.HANG:
                return await self._hang(node, fault)
            if fault.kind is FaultKind.GPU_ECC:
                assert fault.gpu is not None
                return self._gpu_ecc(node, fault, fault.gpu)
            if fault.kind is FaultKind.REBOOT:
                return await self._reboot(node, fault)
            return await self._heal(node, fault)

    def _fault_node(self, name: str) -> LabNode:
        for node in self.nodes:
            if node.name == name:
                return node
        names = [n.name for n in self.nodes]
        known = f"{names[0]} to {names[-1]}" if len(names) > 1 else names[0]
        raise NotFound(f"no node {name!r} in the lab in {self.lab_dir} (its nodes: {known})")

    def _report(self, node: LabNode, fault: Fault, message: str, processes: list[int] | None = None) -> FaultReport:
        log.info("fault %s on %s: %s", fault, node.name, message)
        try:
            ecc = ecc_counts(node.gpus())
        except (OSError, ValueError, KeyError, TypeError):
            ecc = ()
        return FaultReport(node.name, fault, node.state, message, tuple(sorted(processes or ())), ecc)

    async def _kill(self, node: LabNode, fault: Fault) -> FaultReport:
        was, dropped, sessions = node.state, len(node.connections), node.processes
        await node.close_listener()
        await node.close_connections(2.0, abort=True)
        node.resume_io()  # a frozen session would not see its process end
        killed = set(sessions) | set(await self._kill_processes(node, crash=True))
        node.stopped.clear()
        await node.wait_sessions(2.0)
        server = (
            "its SSH server was down already"
            if was is NodeState.DOWN
            else f"SSH server on {node.host}:{node.port} stopped ({plural(dropped, 'connection')} dropped, "
            "new ones refused)"
        )
        message = f"{node.name} killed: {server}, {plural(len(killed), 'process')} killed"
        return self._report(node, fault, message, sorted(killed))

    async def _hang(self, node: LabNode, fault: Fault) -> FaultReport:
        if node.state is NodeState.DOWN:
            raise LabError(f"{node.name} is down: a dead node cannot hang (heal it first: --heal)")
        held = len(node.connections)
        node.freeze()
        stopped = await self._stop_processes(node)
        message = (
            f"{node.name} hung: SSH server on {node.host}:{node.port} frozen "
            f"({plural(held, 'connection')} held open, nothing answers), {plural(len(stopped), 'process')} stopped"
        )
        return self._report(node, fault, message, stopped)

    async def _stop_processes(self, node: LabNode) -> list[int]:
        """SIGSTOP the node's sessions and every process started through it, until no new one turns up."""
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            node.signal_sessions(signal.SIGSTOP)
            found = [p for p in node.processes + find_lab_processes(self.lab_dir, node.name) if p not in node.stopped]
            for pid in found:
                node.stopped[pid] = start_time(pid)
            _signal_all(found, signal.SIGSTOP)
            if not found or time.monotonic() > deadline:
                return sorted(node.stopped)
            await asyncio.sleep(0.02)  # what they forked meanwhile

    def _gpu_ecc(self, node: LabNode, fault: Fault, gpu: int) -> FaultReport:
        try:
            data = node.gpus()
            count = len(data["gpus"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LabError(f"{node.name}: cannot read {node.gpus_path}: {exc}") from exc
        if not 0 <= gpu < count:
            has = f"{count} GPUs (0-{count - 1})" if count > 1 else "1 GPU (0)" if count else "no GPUs"
            raise UsageError(f"{node.name} has {has}: no GPU {gpu}")
        changed = with_ecc_error(data, gpu)
        node.write_gpus(changed)
        before, after = data["gpus"][gpu].get("ecc_uncorrectable") or 0, changed["gpus"][gpu]["ecc_uncorrectable"]
        message = (
            f"{node.name} GPU {gpu}: uncorrectable ECC errors {before} -> {after} in {node.gpus_path.name}; "
            "its next probe reads the node unhealthy"
        )
        return self._report(node, fault, message)

    async def _reboot(self, node: LabNode, fault: Fault) -> FaultReport:
        """As a reboot: the node dies (its processes too), comes back with a new boot id and no ECC errors (the
        volatile counts a reboot clears), and its SSH server answers again."""
        killed = (await self._kill(node, fault)).processes
        try:
            data = node.gpus()
            node.write_gpus({**without_ecc_errors(data), "boot_id": str(uuid.uuid4())})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LabError(f"{node.name}: cannot read {node.gpus_path}: {exc}") from exc
        await self._listen_again(node)
        message = (
            f"{node.name} rebooted: {plural(len(killed), 'process')} killed, a new boot id, SSH server on "
            f"{node.host}:{node.port} back up"
        )
        return self._report(node, fault, message, list(killed))

    async def _listen_again(self, node: LabNode) -> None:
        """The node's SSH server on its own port again, with its host key."""
        assert self._authorized is not None
        try:
            await node.start(self._authorized, node.port)
        except OSError as exc:
            why = exc.strerror or exc
            raise LabError(f"{node.name}: cannot listen on {node.host}:{node.port} again: {why}") from exc

    async def _heal(self, node: LabNode, fault: Fault) -> FaultReport:
        done = []
        if node.state is NodeState.HUNG:
            node.signal_sessions(signal.SIGCONT)
        continued = [pid for pid, started in node.stopped.items() if started == start_time(pid)]
        _signal_all(continued, signal.SIGCONT)  # only what the hang stopped, and is still that process
        node.stopped.clear()
        if node.state is NodeState.HUNG:
            await node.thaw()
            done.append(f"SSH server on {node.host}:{node.port} answering again")
        elif node.state is NodeState.DOWN:
            await self._listen_again(node)
            done.append(f"SSH server on {node.host}:{node.port} back up")
        if continued:
            done.append(f"{plural(len(continued), 'process')} continued")
        try:
            data = node.gpus()
            errors = sum(ecc_counts(data))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LabError(f"{node.name}: cannot read {node.gpus_path}: {exc}") from exc
        if errors:
            node.write_gpus(without_ecc_errors(data))
            done.append(f"{plural(errors, 'uncorrectable ECC error')} cleared")
        message = f"{node.name} healed: {', '.join(done)}" if done else f"{node.name} was healthy: nothing to heal"
        return self._report(node, fault, message, continued)

    def info(self) -> LabInfo:
        nodes = tuple(
            LabNodeInfo(
                n.name, n.host, n.port, n.spec.pool, n.spec.gpus, n.spec.gpu_model, up=n.listening, state=n.state.value
            )
            for n in self.nodes
        )
        layout = str(self.layout_path) if self.layout_path else None
        return LabInfo(self.lab_dir, os.getpid(), self.started, nodes, layout, shared_home=self.shared_home)

    def connect_options(self, name: str) -> dict[str, Any]:
        """Keyword arguments for asyncssh.connect to one node, verifying its host key."""
        node = self.node(name)
        return {
            "host": node.host,
            "port": node.port,
            "username": self.user,
            "known_hosts": str(self.paths.known_hosts),
            "client_keys": [str(self.paths.client_key)],
            "agent_path": None,
            "config": [],
        }
