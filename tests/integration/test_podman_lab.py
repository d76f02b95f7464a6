"""The podman lab of the container tests (tests/podman_lab.py): its image runs host programs and the repo's
Python through read-only binds, its CDI spec simulates GPUs, and its teardown leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.podman_lab import (
    CDI_DIR,
    CDI_HOLDER,
    CDI_KIND,
    REPO,
    VENVS,
    PodmanLab,
    PodmanLabError,
    _pids_naming,
    acquire_cdi_spec,
    cdi_spec_text,
    podman_lab_fixture,  # noqa: F401  (provides the `podman_lab` fixture)
    release_cdi_spec,
    sweep_stale_labs,
)


def run(lab: PodmanLab, *command: str, options: tuple[str, ...] = (), timeout: float = 60) -> str:
    """`command` in a throwaway lab container (no network); its stdout, or the test fails with podman's stderr."""
    done = lab.podman(
        "run", "--rm", "--network=none", *lab.run_options(), *options, lab.image, *command,
        check=False, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_image_runs_host_programs(podman_lab: PodmanLab) -> None:
    assert run(podman_lab, "cat", "/etc/ftlab-image") == podman_lab.marker
    assert podman_lab.import_seconds < 10


def test_the_repo_python_imports_torch_inside(podman_lab: PodmanLab) -> None:
    with_torch = [
        python
        for venv in VENVS
        if (python := REPO / venv / "bin" / "python").exists()
        and subprocess.run(
            [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"],
            capture_output=True, timeout=30, check=False,
        ).returncode == 0
    ]  # fmt: skip
    if not with_torch:
        pytest.skip(f"torch is in none of {', '.join(VENVS)} (make test-peers installs it in .venv-peers)")
    host = subprocess.run(
        [with_torch[0], "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    inside = run(podman_lab, str(with_torch[0]), "-c", "import torch; print(torch.__version__)", timeout=90)
    assert inside == host.stdout


def test_a_cdi_device_is_a_simulated_gpu(podman_lab: PodmanLab) -> None:
    assert podman_lab.cdi_spec is not None and podman_lab.cdi_spec.parent == CDI_DIR
    env = run(podman_lab, "env", options=("--device", f"{CDI_KIND}=1")).splitlines()
    assert "FTLAB_CDI_GPU_1=1" in env
    assert not [line for line in env if line.startswith("FTLAB_CDI_GPU_0=")]


def test_a_readonly_mount_refuses_a_write(podman_lab: PodmanLab) -> None:
    done = podman_lab.podman(
        "run", "--rm", "--network=none", *podman_lab.run_options(), podman_lab.image,
        "touch", "/usr/ftlab-write-test",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr
    assert not Path("/usr/ftlab-write-test").exists()


def test_the_wrapper_gives_the_nodes_the_lab(podman_lab: PodmanLab, tmp_path: Path) -> None:
    wrapper = podman_lab.python_wrapper(tmp_path)
    code = "import os, subprocess; print(subprocess.run(['podman', 'images', '--format', '{{.Repository}}:{{.Tag}}']"
    code += ", capture_output=True, text=True, timeout=60, check=True).stdout, end='')"
    done = subprocess.run(
        [wrapper, "-c", code], capture_output=True, text=True, timeout=90, check=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert done.stdout.split() == [podman_lab.image]


def test_teardown_leaves_nothing(podman_lab: PodmanLab) -> None:
    """A second lab beside the session's: it joins the session's CDI spec, and its close removes its
    containers (running ones too), its store and folder, and leaves the spec to the session."""
    other = PodmanLab()
    try:
        assert other.cdi_spec == podman_lab.cdi_spec
        other.podman("run", "-d", "--name", "ft-left-running", "--network=none", *other.run_options(),
                     other.image, "sleep", "300")  # fmt: skip
        other.podman("create", "--name", "ft-never-started", *other.run_options(), other.image, "true")
        assert sorted(other.containers("ft-")) == ["ft-left-running", "ft-never-started"]
        assert podman_lab.containers("ft-") == []  # stores apart
    finally:
        other.close()
    assert not other.root.exists()
    assert _pids_naming(str(other.root)) == []
    assert podman_lab.cdi_spec is not None and podman_lab.cdi_spec.exists()
    assert run(podman_lab, "env", options=("--device", f"{CDI_KIND}=7")).count("FTLAB_CDI_GPU_7=1") == 1


ORPHAN = """
import sys, time
from tests.podman_lab import PodmanLab
lab = PodmanLab()
lab.podman("run", "-d", "--name", "ft-orphan", "--network=none", *lab.run_options(), lab.image, "sleep", "300")
print(lab.root, flush=True)
time.sleep(300)
"""


def test_the_lab_of_a_killed_session_is_swept(podman_lab: PodmanLab) -> None:
    """A session killed before its teardown leaves its folder and a running container; the next lab's
    fixture closes them (sweep_stale_labs)."""
    with subprocess.Popen([sys.executable, "-c", ORPHAN], cwd=REPO, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            root = Path(child.stdout.readline().strip())
            assert root.is_dir() and _pids_naming(str(root))  # its conmon
        finally:
            child.kill()
            child.wait(timeout=10)
    assert root in sweep_stale_labs()
    assert not root.exists()
    assert _pids_naming(str(root)) == []
    assert podman_lab.root.exists()  # a live session's lab is not stale


def test_a_real_gpu_spec_is_not_clobbered(tmp_path: Path) -> None:
    """In folders of the test's own (the real /var/run/cdi is shared with other sessions): the lab refuses a
    GPU spec it did not write, and changes nothing."""
    etc, run_dir = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    (etc / "nvidia.yaml").write_text(f"cdiVersion: 0.5.0\nkind: {CDI_KIND}\ndevices: []\n")
    with pytest.raises(PodmanLabError, match=r"nvidia.yaml already defines CDI devices of kind nvidia.com/gpu"):
        acquire_cdi_spec("t1", spec_dir=run_dir, dirs=(etc, run_dir))
    assert list(run_dir.iterdir()) == []


def test_a_stale_lab_spec_is_replaced(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    stale = tmp_path / "ftconsole-lab-1-dead.yaml"
    stale.write_text(cdi_spec_text([f"{CDI_HOLDER}{dead.pid} 1 dead"]))
    spec = acquire_cdi_spec("t1", spec_dir=tmp_path, dirs=(tmp_path,))
    assert not stale.exists() and spec.exists()
    assert acquire_cdi_spec("t2", spec_dir=tmp_path, dirs=(tmp_path,)) == spec  # joined, not a second spec
    release_cdi_spec(spec, "t1")
    assert spec.exists()
    release_cdi_spec(spec, "t2")
    assert list(tmp_path.iterdir()) == []
