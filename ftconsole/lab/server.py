"""The lab as a background process: `lab_up`, `lab_status`, `lab_fault` and `lab_down` around
`python -m ftconsole.lab serve`.

`lab_up` starts the server detached and waits for lab.json and every node's port; `lab_status` reads lab.json
and checks the ports; `lab_fault` sends a request to the server's control socket, lab.sock (`control`);
`lab_down` sends SIGTERM to the pid in lab.json (or lab.lock) and kills whatever of its nodes is left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ftconsole.lab import control
from ftconsole.lab.cluster import LabCluster
from ftconsole.lab.control import ControlServer
from ftconsole.lab.faults import Fault, FaultReport
from ftconsole.lab.files import _PACKAGE_ROOT, LabPaths, _write_atomic, default_layout_path
from ftconsole.lab.layout import load_layout
from ftconsole.lab.plan import plan_nodes
from ftconsole.lab.processes import PidLock, _cmdline, _signal_all, kill_lab_processes, pid_alive
from ftconsole.lab.records import LabInfo, LabNodeInfo
from ftconsole.scheduler.errors import LabError, UsageError

log = logging.getLogger("ftconsole.lab")


def _read_info(paths: LabPaths) -> LabInfo | None:
    try:
        return LabInfo.from_json(json.loads(paths.info.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(f"{paths.info} is unreadable: {exc}") from exc


def _is_lab_server(pid: int) -> bool:
    return pid_alive(pid) and (b"ftconsole.lab" in _cmdline(pid) or not Path("/proc/self").exists())


def _port_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """The port accepts TCP and sends an SSH banner (so its event loop is alive)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _check_ports(nodes: Sequence[LabNodeInfo]) -> tuple[LabNodeInfo, ...]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(nodes)))) as pool:
        ups = list(pool.map(lambda n: _port_answers(n.host, n.port), nodes))
    return tuple(replace(n, up=up) for n, up in zip(nodes, ups, strict=True))


def lab_status(lab_dir: Path | str | None = None) -> LabInfo | None:
    """The running background lab (each node's `up`: its port answers with an SSH banner), or None."""
    paths = LabPaths.of(lab_dir)
    info = _read_info(paths)
    if info is None or not _is_lab_server(info.pid):
        return None
    return replace(info, nodes=_check_ports(info.nodes))


def _log_tail(path: Path, offset: int, lines: int = 12) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail) if tail else "(log is empty)"


def _spawn_server(paths: LabPaths, layout_path: Path | None, nodes: int | None, shared_home: bool | None) -> int:
    """Start `python -m ftconsole.lab serve` detached (new session), its output appended to lab.log."""
    argv = [sys.executable, "-P", "-m", "ftconsole.lab", "serve", "--dir", str(paths.root)]
    if layout_path is not None:
        argv += ["--layout", str(layout_path)]
    if nodes is not None:
        argv += ["--nodes", str(nodes)]
    if shared_home is not None:
        argv.append("--shared-home" if shared_home else "--no-shared-home")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)
    log_fd = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(log_fd)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_pid(pid: int, timeout: float) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL and wait a little more."""
    _signal_all([pid], signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        _signal_all([pid], signal.SIGKILL)
        if not _wait_gone(pid, 5.0):
            raise LabError(f"lab server pid {pid} does not stop")


def lab_up(
    lab_dir: Path | str | None = None,
    layout_path: Path | str | None = None,
    nodes: int | None = None,
    timeout: float = 30.0,
    *,
    shared_home: bool | None = None,
) -> LabInfo:
    """Start the lab in the background (idempotent) and return it once every node answers.

    `shared_home`, when not None, replaces the layout's: True gives every node the same HOME, <lab>/home."""
    paths = LabPaths.of(lab_dir)
    running = lab_status(paths.root)
    if running is not None:
        if nodes is not None and nodes != len(running.nodes):
            raise LabError(
                f"the lab in {paths.root} runs {len(running.nodes)} nodes, not {nodes}; "
                "stop it first (ftconsole lab down)"
            )
        if shared_home is not None and shared_home != running.shared_home:
            homes = "one home shared by its nodes" if running.shared_home else "a home per node"
            raise LabError(f"the lab in {paths.root} runs with {homes}; stop it first (ftconsole lab down)")
        return running
    layout = Path(layout_path).expanduser().resolve() if layout_path is not None else default_layout_path()
    plan_nodes(load_layout(layout), nodes)  # bad layouts and node counts fail here, naming file and line
    paths.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths.info.unlink(missing_ok=True)  # stale: its server is gone
    offset = paths.log.stat().st_size if paths.log.exists() else 0
    pid = _spawn_server(paths, layout, nodes, shared_home)
    try:
        return _wait_started(paths, pid, offset, timeout)
    except BaseException:
        with contextlib.suppress(LabError):
            _stop_pid(pid, 5.0)
        with contextlib.suppress(LabError):
            kill_lab_processes(paths.root)
        raise


def _wait_started(paths: LabPaths, pid: int, log_offset: int, timeout: float) -> LabInfo:
    deadline = time.monotonic() + timeout
    while True:
        if not pid_alive(pid):
            tail = _log_tail(paths.log, log_offset)
            raise LabError(f"lab server exited during start-up; see {paths.log}:\n{tail}")
        with contextlib.suppress(LabError):
            info = _read_info(paths)
            if info is not None and info.pid == pid:
                checked = replace(info, nodes=_check_ports(info.nodes))
                if checked.all_up:
                    return checked
        if time.monotonic() > deadline:
            tail = _log_tail(paths.log, log_offset)
            raise LabError(f"lab server did not start within {timeout:g}s; see {paths.log}:\n{tail}")
        time.sleep(0.05)


def lab_down(lab_dir: Path | str | None = None, timeout: float = 10.0) -> bool:
    """Stop the background lab and make sure no process of its nodes is left; whether anything ran."""
    paths = LabPaths.of(lab_dir)
    try:
        info = _read_info(paths)
    except LabError:
        info = None
    pid = info.pid if info is not None else PidLock(paths.lock).owner()
    if pid == os.getpid():
        raise LabError("this process serves the lab itself; stop its LabCluster instead")
    ran = False
    if pid is not None and _is_lab_server(pid):
        ran = True
        _stop_pid(pid, timeout)
    ran = kill_lab_processes(paths.root, timeout) > 0 or ran
    paths.info.unlink(missing_ok=True)
    paths.control.unlink(missing_ok=True)
    return ran


FAULT_TIMEOUT_S = 60.0  # a kill waits for the node's processes to go: STOP_TIMEOUT_S and a little more


def lab_fault(lab_dir: Path | str | None, node: str, fault: Fault, timeout: float = FAULT_TIMEOUT_S) -> FaultReport:
    """Inject `fault` into `node` of the background lab (or heal it) through its control socket; what was done.

    LabError when no lab runs there; NotFound for an unknown node; UsageError for a GPU the node lacks."""
    paths = LabPaths.of(lab_dir)
    info = _read_info(paths)
    if info is None or not _is_lab_server(info.pid):
        raise LabError(f"no lab is running in {paths.root}; start it with `ftconsole lab up`")
    try:
        result = control.call(paths.control, {"op": "fault", "node": node, "fault": fault.to_json()}, timeout)
    except control.NoAnswer as exc:
        if not _is_lab_server(info.pid):
            raise LabError(f"the lab in {paths.root} (pid {info.pid}) stopped meanwhile") from exc
        hint = ""
        if isinstance(exc.__cause__, FileNotFoundError):  # a server of a version without faults
            hint = "; restart the lab (ftconsole lab down; ftconsole lab up) to inject faults into it"
        raise LabError(f"the lab server (pid {info.pid}, log {paths.log}): {exc}{hint}") from exc
    try:
        return FaultReport.from_json(result)
    except (KeyError, TypeError, ValueError) as exc:
        raise LabError(f"the lab server sent an unreadable fault report: {result!r}") from exc


async def serve(
    lab_dir: Path | str | None, layout: Path | str | None, nodes: int | None, shared_home: bool | None = None
) -> None:
    """Run the lab until SIGTERM or SIGINT, with lab.json written while it serves."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set if sig != signal.SIGHUP else (lambda: None))
    try:
        async with LabCluster(lab_dir, layout, nodes, shared_home=shared_home) as lab:

            def write_info() -> None:
                _write_atomic(lab.paths.info, json.dumps(lab.info().to_json(), indent=1) + "\n")

            async def handle(op: str, request: dict[str, Any]) -> Any:
                if op != "fault":
                    raise UsageError(f"unknown op {op!r} (the lab serves: fault)")
                if not isinstance(request.get("node"), str):
                    raise UsageError("bad request: fault needs a node name")
                report = await lab.fault(request["node"], Fault.from_json(request.get("fault")))
                write_info()  # the nodes' states, for lab status
                return report.to_json()

            async with ControlServer(lab.paths.control, handle):
                write_info()  # last: lab_up takes the lab for started once lab.json is there
                log.info("serving %d nodes (pid %d); config %s", len(lab.nodes), os.getpid(), lab.config_path)
                try:
                    await stop.wait()
                finally:
                    lab.paths.info.unlink(missing_ok=True)
                    log.info("stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
