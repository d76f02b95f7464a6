"""Container runtimes of real sshd test nodes, probed over SSH and shown by `nodes --json` and `nodes NODE`.

The nodes' PATH is set by the python the agent runs with (`ssh.python`, a wrapper script): node01 has a
folder of fake runtimes (apptainer with nvidia-container-cli, docker without a daemon), node02 has none. The
fakes make the test hold whatever this machine has installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.integration.test_probe_sshd import ftconsole
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
FAKES = {
    "apptainer": '#!/bin/sh\necho "apptainer version 1.3.4"\n',
    "nvidia-container-cli": "#!/bin/sh\nexit 0\n",
    "docker": f"#!/bin/sh\ncase \"$1\" in\n  --version) echo 'Docker version 28.2.2, build e6534b4' ;;\n"
    f"  info) echo '{NO_DAEMON}' >&2; exit 1 ;;\nesac\n",
}


def python_with_path(root: Path) -> Path:
    """A python3 whose PATH is node01's folder of fake runtimes, or an empty folder on any other node."""
    fakes, empty = root / "fake-runtimes", root / "empty-bin"
    fakes.mkdir()
    empty.mkdir()
    for name, text in FAKES.items():
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    script = root / "python-with-path"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$FTCONSOLE_LAB_NODE" = node01 ]; then PATH={fakes}; else PATH={empty}; fi\n'
        f'export PATH\nexec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_nodes_show_their_container_runtimes(sshd_cluster, tmp_path: Path) -> None:
    cluster: SshdCluster = sshd_cluster(2)
    config = cluster.write_config(tmp_path / "cluster.yaml", ssh={"python": str(python_with_path(tmp_path))})

    probe = ftconsole("probe", "--json", config=config)
    assert probe.returncode == 0, probe.stdout + probe.stderr

    listed = ftconsole("nodes", "--json", config=config)
    assert listed.returncode == 0, listed.stderr
    facts = {n["name"]: n["facts"] for n in json.loads(listed.stdout)}
    # docker finds the toolkit (nvidia-container-cli), but without its daemon it gives no GPUs
    assert facts["node01"]["runtimes"] == [
        {"name": "docker", "path": str(tmp_path / "fake-runtimes" / "docker"), "version": "28.2.2", "usable": False,
         "problem": f"daemon not reachable: {NO_DAEMON}", "gpus": False, "gpus_via": ["--gpus (toolkit)"]},
        {"name": "apptainer", "path": str(tmp_path / "fake-runtimes" / "apptainer"), "version": "1.3.4",
         "usable": True, "problem": None, "gpus": True, "gpus_via": ["--nv"]},
    ]  # fmt: skip
    assert facts["node02"]["runtimes"] == []

    shown = ftconsole("nodes", "node01", config=config)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-3:] == [
        "node01:",
        f"  container runtime docker 28.2.2: daemon not reachable: {NO_DAEMON}",
        "  container runtime apptainer 1.3.4, GPUs: --nv",
    ]
    other = ftconsole("nodes", "node02", config=config)
    assert other.stdout.splitlines()[-2:] == ["node02:", "  container runtimes: none found"]
