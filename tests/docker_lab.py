"""Real Docker for the integration tests: a private daemon, the podman lab's tiny image and simulated GPUs.

The fixture ``docker_lab`` (session scope) gives a :class:`DockerLab`:

- a private ``dockerd`` of its own (Debian's docker.io, as root), everything of it in the lab's folder
  (``/tmp/ftdock-XXXX``, short: the daemon's and containerd's unix sockets live there): its data root, exec root,
  pid file, socket, log and an empty ``daemon.json`` (the machine's /etc/docker/daemon.json is not read).
  ``--storage-driver=vfs`` (no overlay mounts to leave behind), ``--iptables=false --ip6tables=false
  --bridge=none`` (the jobs use ``--network host``; the machine's firewall and links are never touched). The
  daemon starts its own containerd, under the exec root. ``env`` (``DOCKER_HOST``, and ``DOCKER_CONFIG``: an
  empty client folder of the lab) points every docker command of the lab, and of the nodes through
  ``python_wrapper``, at it.
- simulated GPUs: the daemon is started with ``--add-runtime nvidia=<runc>``, so ``docker info`` lists a runtime
  named "nvidia" (the probe then says docker can give GPUs, by "nvidia runtime") and the scheduler's
  ``--runtime nvidia --env NVIDIA_VISIBLE_DEVICES=<indexes>`` starts the container under plain runc: the
  variable is set, no device is added, as the podman lab's CDI spec only sets variables.
- ``image`` (``localhost/ftlab:1``): ``docker import`` of the podman lab's root file system (``rootfs_tar``:
  ``/etc/ftlab-image`` holds ``marker``); programs come from the host through ``host_mounts`` (read-only binds
  of /usr /lib /lib64 /bin and the repo's Python). Nothing is pulled.
- ``ulimits``: the podman lab's (the current limits, capped): the test machine's root may not raise a limit.

Teardown removes every container, stops the daemon (SIGTERM, a bounded wait, then SIGKILL), kills what is left
of its containerd and shims, unmounts what is left under the folder (the daemon leaves its ``exec/netns/default``
nsfs mounted) and removes it; it raises if anything was left. A session killed before its teardown leaves a
folder (maybe a running daemon) that the next session's fixture closes.

Needs root, dockerd, containerd, runc and a docker client (``apt-get install docker.io``); skips where one is
missing. Every subprocess has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.podman_lab import (
    CDI_HOLDER,
    IMAGE,
    IMAGE_MARKER,
    _holder_alive,
    _mounts_under,
    _pids_naming,
    _start_time,
    lab_host_mounts,
    lab_ulimits,
    python_wrapper,
    rootfs_tar,
    run_client,
    run_options,
)

LAB_PARENT, LAB_PREFIX = "/tmp", "ftdock-"  # each lab's folder: /tmp/ftdock-XXXX (not ftlab-: podman's sweep)
LAB_OWNER = "owner"  # in it: "pid starttime token" of the session that made it
RUNC_PATHS = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc")
GPU_RUNTIME = "nvidia"  # what the probe looks for in `docker info`'s Runtimes

TIMEOUT = 60.0  # one docker command
START_TIMEOUT = 60.0  # the daemon answers `docker info`
INFO_TIMEOUT = 5.0  # one `docker info` while waiting for it
STOP_TIMEOUT = 30.0  # the daemon gone after SIGTERM (it stops containerd first)
KILL_TIMEOUT = 5.0  # a SIGKILLed process gone
LEFTOVER_TIMEOUT = 5.0  # shims of removed containers exit on their own
UMOUNT_TIMEOUT = 10.0


class DockerLabError(RuntimeError):
    """The lab could not be set up or torn down; the message says what docker or the machine said."""


def _runc() -> str | None:
    return next((p for p in RUNC_PATHS if os.access(p, os.X_OK)), None) or shutil.which("runc")


def docker_missing() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the docker lab runs as root (it starts a private dockerd)"
    for program in ("dockerd", "containerd", "docker"):
        if shutil.which(program) is None:
            return f"{program} not installed; apt-get install docker.io"
    if _runc() is None:
        return "runc not installed; apt-get install runc"
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it is dead, only not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _pids_in_cgroups(ids: list[str]) -> list[int]:
    """Processes whose cgroup names one of the container `ids` (docker's cgroup is /docker/<id>)."""
    if not ids:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                text = (entry / "cgroup").read_text()
                if any(cid in text for cid in ids):
                    found.append(int(entry.name))
    return found


class DockerLab:
    """A private dockerd with the lab image; :meth:`close` stops it and removes all of it."""

    def __init__(self, root: Path | None = None) -> None:
        """A new lab; or, given the `root` of a lab whose session was killed, that lab, to close it."""
        self.root = root or Path(tempfile.mkdtemp(prefix=LAB_PREFIX, dir=LAB_PARENT))
        self.token = os.urandom(4).hex()
        self.socket = self.root / "docker.sock"
        self.data_root = self.root / "root"
        self.exec_root = self.root / "exec"
        self.pidfile = self.root / "dockerd.pid"
        self.log = self.root / "dockerd.log"
        self.image = IMAGE
        self.marker = IMAGE_MARKER
        self.env = {"DOCKER_HOST": f"unix://{self.socket}", "DOCKER_CONFIG": str(self.root / "client")}
        self.ulimits = lab_ulimits()
        self.host_mounts = lab_host_mounts()
        self.start_seconds = 0.0
        self.import_seconds = 0.0
        self._daemon: subprocess.Popen[bytes] | None = None
        self._daemon_pid: int | None = None
        self._checked = False  # the daemon answering on the socket is the lab's own: teardown may empty it
        if root is not None:
            self._adopt()
            return
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(DockerLabError):
                self.close()
            raise

    # -- start ---------------------------------------------------------------------------------------------------

    def _start(self) -> None:
        (self.root / LAB_OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())} {self.token}\n")
        (self.root / "client").mkdir()
        (self.root / "daemon.json").write_text("{}\n")
        argv = [
            "dockerd",
            "--config-file", str(self.root / "daemon.json"),
            "--data-root", str(self.data_root),
            "--exec-root", str(self.exec_root),
            "--pidfile", str(self.pidfile),
            "-H", self.env["DOCKER_HOST"],
            "--iptables=false", "--ip6tables=false", "--bridge=none",
            "--storage-driver=vfs",
            "--add-runtime", f"{GPU_RUNTIME}={_runc()}",
        ]  # fmt: skip
        started = time.monotonic()
        with open(self.log, "ab") as log:
            # its own session: a ^C to pytest does not stop the daemon before the teardown has emptied it
            self._daemon = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self._daemon_pid = self._daemon.pid
        self._wait_for_daemon(started + START_TIMEOUT)
        self.start_seconds = time.monotonic() - started
        self._check_daemon()
        (self.root / "rootfs.tar").write_bytes(rootfs_tar())
        started = time.monotonic()
        self.docker("import", str(self.root / "rootfs.tar"), self.image)
        self.import_seconds = time.monotonic() - started

    def _log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def _wait_for_daemon(self, deadline: float) -> None:
        while True:
            if self._daemon is not None and self._daemon.poll() is not None:
                raise DockerLabError(f"dockerd exited {self._daemon.returncode} at its start:\n{self._log_tail()}")
            with contextlib.suppress(DockerLabError):
                if self.docker("info", "--format", "{{.ID}}", timeout=INFO_TIMEOUT).stdout.strip():
                    return
            if time.monotonic() > deadline:
                raise DockerLabError(f"dockerd did not answer in {START_TIMEOUT:.0f} s:\n{self._log_tail()}")
            time.sleep(0.1)

    def _check_daemon(self) -> None:
        """The daemon on the socket is the lab's (its data root) and has the "nvidia" runtime."""
        info = self.docker("info", "--format", "{{json .DockerRootDir}}|{{json .Runtimes}}", timeout=INFO_TIMEOUT)
        root, _, runtimes = info.stdout.strip().partition("|")
        if json.loads(root) != str(self.data_root):
            raise DockerLabError(f"the daemon on {self.socket} is not the lab's: its data root is {root}")
        self._checked = True  # from here on, teardown may remove whatever the daemon holds
        if GPU_RUNTIME not in (json.loads(runtimes or "{}") or {}):
            raise DockerLabError(f"dockerd ignored --add-runtime {GPU_RUNTIME}: its runtimes are {runtimes}")

    def _adopt(self) -> None:
        """A killed session's lab: its daemon, if it still runs, is emptied and stopped by close()."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pidfile.read_text().strip())
            if str(self.root) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                self._daemon_pid = pid
        if self._daemon_pid is not None:
            with contextlib.suppress(DockerLabError, ValueError):
                self._check_daemon()

    # -- use -----------------------------------------------------------------------------------------------------

    def docker(
        self, *args: str, check: bool = True, timeout: float = TIMEOUT, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker client against the lab's daemon; raises DockerLabError on failure when `check`."""
        return run_client(["docker", *args], self.env, DockerLabError, timeout=timeout, check=check, input=input)

    def run_options(self, mounts: list[dict[str, Any]] | None = None) -> list[str]:
        """``docker run`` options every lab container needs: the ulimits, and binds (default ``host_mounts``)."""
        return run_options(self.ulimits, self.host_mounts if mounts is None else mounts)

    def python_wrapper(self, root: Path) -> Path:
        """The lab's ``ssh.python`` (see podman_lab.python_wrapper): the nodes' docker client reaches the lab's
        daemon."""
        return python_wrapper(root / "python-docker-lab", self.env)

    def containers(self, prefix: str = "") -> list[str]:
        """Names of the daemon's containers, running or not, that start with `prefix`."""
        names = self.docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
        return [n for n in names if n.startswith(prefix)]

    # -- teardown ------------------------------------------------------------------------------------------------

    def _container_ids(self) -> list[str]:
        folder = self.data_root / "containers"
        with contextlib.suppress(OSError):
            return [p.name for p in folder.iterdir() if len(p.name) == 64]
        return []

    def close(self) -> None:
        """Remove the containers, stop the daemon and what it started, remove the folder; raise what is left."""
        problems: list[str] = []
        ids = self._container_ids()
        if self._checked:
            try:
                if names := self.containers():  # all of them: the daemon is the lab's own
                    self.docker("rm", "--force", *names, timeout=2 * TIMEOUT)
                if remaining := self.containers():
                    problems.append(f"containers left: {remaining}")
            except DockerLabError as exc:
                problems.append(str(exc))
        problems += self._stop_daemon()
        # a daemon killed before it removed its containers leaves their shims and processes: kill those
        if killed := _pids_in_cgroups(ids):
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _wait_gone(killed, KILL_TIMEOUT)
            problems.append(f"processes {killed} of the lab's containers still ran after teardown (killed)")
        stray = _wait_gone(_pids_naming(str(self.root)), LEFTOVER_TIMEOUT)
        for pid in stray:  # containerd, shims
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            problems.append(f"process {pid} of the lab still ran after teardown (killed)")
        if survivors := _wait_gone(stray, KILL_TIMEOUT):
            problems.append(f"processes {survivors} survived SIGKILL")
        for point in reversed(_mounts_under(self.root)):  # exec/netns/default (nsfs), whatever else is left
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=UMOUNT_TIMEOUT, check=False)
        if left_mounts := _mounts_under(self.root):
            problems.append(f"mounts left under {self.root}: {left_mounts}; the folder is kept")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        if problems:
            raise DockerLabError("docker lab teardown: " + "; ".join(problems))

    def _stop_daemon(self) -> list[str]:
        pid = self._daemon_pid
        if pid is None or not _alive(pid):
            return []
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        problems = []
        if self._daemon is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._daemon.wait(STOP_TIMEOUT)
        else:
            _wait_gone([pid], STOP_TIMEOUT)
        if _alive(pid):
            problems.append(f"dockerd {pid} still ran {STOP_TIMEOUT:.0f} s after SIGTERM (killed)")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if self._daemon is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._daemon.wait(KILL_TIMEOUT)
            elif _wait_gone([pid], KILL_TIMEOUT):
                problems.append(f"dockerd {pid} survived SIGKILL")
        return problems


def sweep_stale_labs() -> list[Path]:
    """Close the labs of sessions that were killed before their teardown (their folder's owner is dead): the
    daemon and its containers, the folder. Returns their folders."""
    swept = []
    for owner in Path(LAB_PARENT).glob(f"{LAB_PREFIX}*/{LAB_OWNER}"):
        with contextlib.suppress(OSError):
            if _holder_alive(CDI_HOLDER + owner.read_text().strip()):
                continue
            with contextlib.suppress(DockerLabError):
                DockerLab(owner.parent).close()
            swept.append(owner.parent)
    return swept


@pytest.fixture(name="docker_lab", scope="session")
def docker_lab_fixture() -> Iterator[DockerLab]:
    """Fixture ``docker_lab``: a :class:`DockerLab` for the session, removed at its end. Skips where dockerd,
    containerd, runc, the docker client or root is missing. (Named apart from the fixture so that importing it
    does not clash with the test arguments: ``from tests.docker_lab import docker_lab_fixture``.)"""
    if reason := docker_missing():
        pytest.skip(reason)
    sweep_stale_labs()
    try:
        lab = DockerLab()
    except DockerLabError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield lab
    finally:
        lab.close()
