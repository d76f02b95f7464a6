"""Real Podman for the integration tests: a private image store, a tiny image and simulated GPUs.

The fixture ``podman_lab`` (session scope) gives a :class:`PodmanLab`:

- ``conf``: a containers.conf with ``runtime = "runc"`` and ``cgroup_manager = "cgroupfs"`` (the test machines
  have no systemd; CI installs runc, see .ci/run), its events log and temporary files in the lab's folder;
  ``storage_conf``: a storage.conf with the ``vfs`` driver and graphroot/runroot in the lab's folder, so nothing
  lands in the machine's own store and teardown drops all of it. ``env`` names both files (``CONTAINERS_CONF``,
  ``CONTAINERS_STORAGE_CONF``): every podman command of the lab, and of the nodes through ``python_wrapper``,
  runs under it.
- ``image`` (``localhost/ftlab:1``): made by ``podman import`` of a root file system written here, never
  pulled: ``/etc/ftlab-image`` (``IMAGE_MARKER``), a minimal ``/etc/passwd`` and ``/etc/group``, and empty
  mount points ``/usr /lib /lib64 /bin /tmp /root``. Programs come from the host: ``host_mounts`` lists the
  read-only binds that run the host's programs and the repo's Python (its venvs and the interpreter they
  point to) inside it.
- ``ulimits``: ``--ulimit`` values that work here. Each ``podman run`` must name them: podman's defaults raise
  nofile and nproc, and raising a limit needs CAP_SYS_RESOURCE, which the test machine's root lacks ("error
  setting rlimit type 7: operation not permitted"). They are the current limits, capped: podman itself runs
  with nproc at most 32768 here, so a higher nproc fails the same way.
- ``cdi_spec``: a CDI spec in ``/var/run/cdi`` (podman 4.3 reads /etc/cdi and /var/run/cdi and ignores
  ``cdi_spec_dirs``) of kind ``nvidia.com/gpu`` with devices ``0``..``7`` that only set ``FTLAB_CDI_GPU_<n>=1``:
  ``--device nvidia.com/gpu=N`` works with no GPU. Two specs of one kind clash (podman then resolves neither),
  so concurrent sessions share one spec: each adds itself as a holder (a comment line in the spec, under a lock
  on the folder), the last one out removes it, and a spec whose holders are all dead is stale and replaced.
  Another spec of that kind (a real GPU machine's) stops the lab with a clear message.

Needs root, podman and runc (``apt-get install podman runc``); skips where they are missing. Every subprocess
has a timeout; nothing is pulled from a registry.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import resource
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/ftlab:1"
IMAGE_MARKER = "ftconsole podman lab image 1\n"  # the content of /etc/ftlab-image
MOUNT_POINTS = ("usr", "lib", "lib64", "bin", "tmp", "root")  # empty folders of the image
HOST_SYSTEM = ("/usr", "/lib", "/lib64", "/bin")
VENVS = (".venv", ".venv-peers")  # the repo's venvs, where they exist (torch is in .venv-peers)
LAB_PARENT, LAB_PREFIX = "/tmp", "ftlab-"  # each lab's folder: /tmp/ftlab-XXXX
LAB_OWNER = "owner"  # in it: "pid starttime token" of the session that made it

CDI_DIR = Path("/var/run/cdi")
CDI_DIRS = (Path("/etc/cdi"), CDI_DIR)  # where podman 4.3 looks for CDI specs
CDI_KIND = "nvidia.com/gpu"
CDI_GPUS = 8
CDI_PREFIX = "ftconsole-lab-"
CDI_HOLDER = "# ftconsole-lab holder: "  # + "pid starttime token", one line per session holding the spec
CDI_LOCK_TIMEOUT = 30.0

# nofile: the current limit up to 65536; nproc: up to 4096 (podman runs with at most 32768 here); memlock: current
ULIMIT_CAPS: dict[str, tuple[int, int | None]] = {
    "nofile": (resource.RLIMIT_NOFILE, 65536),
    "nproc": (resource.RLIMIT_NPROC, 4096),
    "memlock": (resource.RLIMIT_MEMLOCK, None),
}

TIMEOUT = 60.0  # one podman command
UMOUNT_TIMEOUT = 10.0
CONMON_EXIT_TIMEOUT = 5.0


class PodmanLabError(RuntimeError):
    """The lab could not be set up or torn down; the message says what podman or the machine said."""


def podman_missing() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the podman lab runs as root (rootless podman needs subuid maps and a user session)"
    if shutil.which("podman") is None:
        return "podman not installed; apt-get install podman runc"
    if not any(os.access(p, os.X_OK) for p in ("/usr/bin/runc", "/usr/sbin/runc", "/usr/local/bin/runc")):
        return "runc not installed; apt-get install runc"
    return None


def lab_ulimits() -> dict[str, str]:
    """``--ulimit`` values: the current soft and hard limits, capped (see ULIMIT_CAPS), never above them."""

    def text(value: int, cap: int | None) -> str:
        if cap is not None:
            value = cap if value == resource.RLIM_INFINITY else min(value, cap)
        return "-1" if value == resource.RLIM_INFINITY else str(value)

    limits = {}
    for name, (which, cap) in ULIMIT_CAPS.items():
        soft, hard = resource.getrlimit(which)
        limits[name] = f"{text(soft, cap)}:{text(hard, cap)}"
    return limits


def _venv_prefix(venv: Path) -> Path | None:
    """The real prefix of the interpreter a venv points to (pyvenv.cfg's home is its bin folder)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).resolve().parent
    return None


def lab_host_mounts(repo: Path = REPO) -> list[dict[str, Any]]:
    """Read-only binds for the image: the host's /usr /lib /lib64 /bin, this interpreter's prefix, the repo's
    venvs and their interpreters' prefixes (each at its own path, as the venvs' links and scripts name it)."""
    paths: list[Path] = [Path(p) for p in HOST_SYSTEM if os.path.lexists(p)]
    venvs = [repo / name for name in VENVS if (repo / name / "pyvenv.cfg").is_file()]
    prefixes = [Path(sys.base_prefix).resolve(), *(p for v in venvs if (p := _venv_prefix(v)) is not None)]
    for path in [*prefixes, *venvs]:
        covered = any(path == p or path.is_relative_to(p) for p in paths)
        if not covered and path.is_dir():
            paths.append(path)
    return [{"from": str(p), "to": str(p), "readonly": True} for p in paths]


def rootfs_tar() -> bytes:
    """The image's root file system as a tar: the marker, passwd/group, empty mount points."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, mode: int, data: bytes | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add("etc", 0o755)
        add("etc/ftlab-image", 0o644, IMAGE_MARKER.encode())
        add("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
        add("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")
        for name in MOUNT_POINTS:
            add(name, {"tmp": 0o1777, "root": 0o700}.get(name, 0o755))
    return buf.getvalue()


def _start_time(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat): with the pid, it names the process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _holder_alive(line: str) -> bool:
    pid, start, *_ = [*line[len(CDI_HOLDER) :].split(), "", ""]
    return pid.isdigit() and _start_time(int(pid)) == start


def cdi_spec_text(holders: list[str]) -> str:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": CDI_KIND,
        "devices": [{"name": str(n), "containerEdits": {"env": [f"FTLAB_CDI_GPU_{n}=1"]}} for n in range(CDI_GPUS)],
    }
    head = "# ftconsole test lab (tests/podman_lab.py): simulated GPUs, removed by the last session holding it\n"
    return head + "".join(h + "\n" for h in holders) + yaml.safe_dump(spec, sort_keys=False)


def _spec_kind(path: Path) -> str | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None  # unreadable: podman cannot use it either
    return data.get("kind") if isinstance(data, dict) else None


def _spec_files(dirs: tuple[Path, ...]) -> list[Path]:
    return sorted(p for d in dirs if d.is_dir() for p in d.iterdir() if p.suffix in (".yaml", ".yml", ".json"))


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on the folder itself (no lock file to leave behind), waited for at most 30 s."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + CDI_LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PodmanLabError(f"{folder} stayed locked {CDI_LOCK_TIMEOUT:.0f} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _write_spec(path: Path, holders: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # not *.yaml: podman skips it
    tmp.write_text(cdi_spec_text(holders))
    os.replace(tmp, path)


def _holders(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(CDI_HOLDER)]


def acquire_cdi_spec(token: str, spec_dir: Path = CDI_DIR, dirs: tuple[Path, ...] = CDI_DIRS) -> Path:
    """Join the lab's CDI spec in `spec_dir` (or write it) as holder `token`; returns its path. Refuses, and
    changes nothing, where another spec of kind nvidia.com/gpu is in `dirs`. A lab spec with no live holder
    (its sessions were killed) is removed."""
    me = f"{CDI_HOLDER}{os.getpid()} {_start_time(os.getpid())} {token}"
    with _locked(spec_dir):
        labs: list[Path] = []
        for path in _spec_files(dirs):
            if _spec_kind(path) != CDI_KIND:
                continue
            if path.parent == spec_dir and path.name.startswith(CDI_PREFIX):
                labs.append(path)
                continue
            raise PodmanLabError(
                f"{path} already defines CDI devices of kind {CDI_KIND} (a real GPU machine's?): the podman "
                f"lab's simulated GPUs would clash with them (podman then resolves neither); run the container "
                f"tests where no such spec is installed"
            )
        live = {path: [h for h in _holders(path) if _holder_alive(h)] for path in labs}
        for path in labs:
            if not live[path]:
                path.unlink()  # stale: every session that held it is gone
        held = [path for path in labs if live[path]]
        if len(held) > 1:
            raise PodmanLabError(f"lab CDI specs clash, each held by a live session: {held}")
        ours = held[0] if held else spec_dir / f"{CDI_PREFIX}{os.getpid()}-{token}.yaml"
        _write_spec(ours, [*live.get(ours, []), me])
        return ours


def release_cdi_spec(path: Path, token: str) -> None:
    """Leave the spec; the last live holder removes it."""
    with _locked(path.parent):
        if not path.exists():
            return
        live = [h for h in _holders(path) if _holder_alive(h) and not h.endswith(f" {token}")]
        if live:
            _write_spec(path, live)
        else:
            path.unlink()


def _mounts_under(root: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # octal escapes: \040 for a space
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return found


def _pids_naming(folder: str) -> list[int]:
    """Processes whose command line names a path under `folder` (a lab's: its conmons)."""
    pids = []
    needle = f"{folder.rstrip('/')}/".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def run_client(
    argv: list[str], env: dict[str, str], error: type[Exception], *, timeout: float, check: bool, input: str | None
) -> subprocess.CompletedProcess[str]:
    """A lab's client command (podman, docker) under the lab's `env`; `error` raised on failure when `check`."""
    try:
        done = subprocess.run(
            argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, input=input
        )
    except subprocess.TimeoutExpired as exc:
        raise error(f"{shlex.join(argv)} took over {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        raise error(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def run_options(ulimits: dict[str, str], mounts: list[dict[str, Any]]) -> list[str]:
    """``run`` options every lab container needs: the ulimits, and the binds."""
    options = [f"--ulimit={name}={value}" for name, value in ulimits.items()]
    for m in mounts:
        options += ["-v", f"{m['from']}:{m['to']}" + (":ro" if m.get("readonly") else "")]
    return options


def python_wrapper(script: Path, env: dict[str, str]) -> Path:
    """An executable script that exports `env` and runs this Python: the config's ``ssh.python``, so that what
    the nodes start (probe, supervisor, the runtime's client) talks to the lab. PATH stays the node's."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    script.write_text(f'#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} "$@"\n')
    script.chmod(0o755)
    return script


class PodmanLab:
    """A private podman store with the lab image and the CDI spec; :meth:`close` removes all of it."""

    def __init__(self, root: Path | None = None) -> None:
        """A new lab; or, given the `root` of a lab whose session was killed, that lab, to close it."""
        self.root = root or Path(tempfile.mkdtemp(prefix=LAB_PREFIX, dir=LAB_PARENT))  # short: conmon's sockets
        self.token = secrets.token_hex(4)
        self.conf = self.root / "containers.conf"
        self.storage_conf = self.root / "storage.conf"
        self.graphroot = self.root / "storage"
        self.image = IMAGE
        self.marker = IMAGE_MARKER
        self.env = {"CONTAINERS_CONF": str(self.conf), "CONTAINERS_STORAGE_CONF": str(self.storage_conf)}
        self.ulimits = lab_ulimits()
        self.host_mounts = lab_host_mounts()
        self.cdi_spec: Path | None = None
        self.import_seconds = 0.0
        self._store_checked = False
        if root is not None:
            with contextlib.suppress(PodmanLabError, OSError):
                self._check_store()
            return
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(PodmanLabError):
                self.close()
            raise

    def _check_store(self) -> None:
        info = self.podman("info", "--format", "{{.Store.GraphRoot}}|{{.Host.OCIRuntime.Name}}").stdout.strip()
        if info != f"{self.graphroot}|runc":
            raise PodmanLabError(f"podman ignored the lab's configuration: store|runtime {info!r}")
        self._store_checked = True  # from here on, teardown may remove whatever the store holds

    def _start(self) -> None:
        (self.root / LAB_OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())} {self.token}\n")
        self.conf.write_text(
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{self.root}/events.log"\n'
            f'tmp_dir = "{self.root}/libpod"\n'
            "[network]\n"
            f'network_config_dir = "{self.root}/networks"\n'
        )
        self.storage_conf.write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{self.graphroot}"\nrunroot = "{self.root}/run"\n'
        )
        self._check_store()
        (self.root / "rootfs.tar").write_bytes(rootfs_tar())
        started = time.monotonic()
        self.podman("import", "--quiet", str(self.root / "rootfs.tar"), self.image)
        self.import_seconds = time.monotonic() - started
        self.cdi_spec = acquire_cdi_spec(self.token)

    def podman(
        self, *args: str, timeout: float = TIMEOUT, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run podman under the lab's configuration; raises PodmanLabError on failure when `check`."""
        return run_client(["podman", *args], self.env, PodmanLabError, timeout=timeout, check=check, input=input)

    def run_options(self, mounts: list[dict[str, Any]] | None = None) -> list[str]:
        """``podman run`` options every lab container needs: the ulimits, and binds (default ``host_mounts``)."""
        return run_options(self.ulimits, self.host_mounts if mounts is None else mounts)

    def python_wrapper(self, root: Path) -> Path:
        """The lab's ``ssh.python`` (see `python_wrapper`): the nodes' podman uses the lab's store."""
        return python_wrapper(root / "python-podman-lab", self.env)

    def containers(self, prefix: str = "") -> list[str]:
        """Names of the store's containers, running or not, that start with `prefix`."""
        names = self.podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
        return [n for n in names if n.startswith(prefix)]

    def close(self) -> None:
        """Remove the containers, the image, the CDI spec (if last holder) and the folder; raise what is left."""
        problems: list[str] = []
        if self._store_checked:
            try:
                names = self.containers()
                if names:  # all of them: the store is the lab's own (ft-... and anything else a test made)
                    self.podman("rm", "--force", "--time", "0", *names, timeout=2 * TIMEOUT)
                self.podman("rmi", "--all", "--force")
                if left := self.containers():
                    problems.append(f"containers left: {left}")
            except PodmanLabError as exc:
                problems.append(str(exc))
        if self.cdi_spec is not None:
            try:
                release_cdi_spec(self.cdi_spec, self.token)
            except (PodmanLabError, OSError) as exc:
                problems.append(f"CDI spec {self.cdi_spec}: {exc}")
        deadline = time.monotonic() + CONMON_EXIT_TIMEOUT
        while (pids := _pids_naming(str(self.root))) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:  # conmons of the lab's containers that outlived their removal
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            problems.append(f"process {pid} of the lab still ran after teardown (killed)")
        for point in reversed(_mounts_under(self.root)):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=UMOUNT_TIMEOUT, check=False)
        if left := _mounts_under(self.root):
            problems.append(f"mounts left under {self.root}: {left}; the folder is kept")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        if problems:
            raise PodmanLabError("podman lab teardown: " + "; ".join(problems))


def sweep_stale_labs() -> list[Path]:
    """Close the labs of sessions that were killed before their teardown (their folder's owner is dead):
    containers, store, folder. Returns their folders."""
    swept = []
    for owner in Path(LAB_PARENT).glob(f"{LAB_PREFIX}*/{LAB_OWNER}"):
        with contextlib.suppress(OSError):
            if _holder_alive(CDI_HOLDER + owner.read_text().strip()):
                continue
            with contextlib.suppress(PodmanLabError):
                PodmanLab(owner.parent).close()
            swept.append(owner.parent)
    return swept


@pytest.fixture(name="podman_lab", scope="session")
def podman_lab_fixture() -> Iterator[PodmanLab]:
    """Fixture ``podman_lab``: a :class:`PodmanLab` for the session, removed at its end. Skips where podman,
    runc or root is missing. (Named apart from the fixture so that importing it does not clash with the test
    arguments: ``from tests.podman_lab import podman_lab_fixture``.)"""
    if reason := podman_missing():
        pytest.skip(reason)
    sweep_stale_labs()
    try:
        lab = PodmanLab()
    except PodmanLabError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield lab
    finally:
        lab.close()
