"""Fixtures of the integration tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.ssh.transport import SSHPool
from tests.sshd_cluster import SshdCluster


@pytest.fixture
async def node_pool(sshd_cluster: Any, tmp_path: Path) -> AsyncIterator[tuple[SshdCluster, SSHPool, Any]]:
    """One sshd node, an SSH pool to it and its config entry: (cluster, pool, node)."""
    cluster: SshdCluster = sshd_cluster(1)
    loaded = load_config(cluster.write_config(tmp_path / "cluster.yaml"))
    pool = SSHPool.from_config(loaded)
    try:
        yield cluster, pool, loaded.cluster.node_list()[0]
    finally:
        await pool.close()


@pytest.fixture
def shared_run_root() -> Iterator[str]:
    """A run root for jobs of other uids (run_as: submitter): '<a sticky folder like /tmp>/{user}/runs'.

    pytest's tmp_path is private to root, and uid 65534's home does not exist: a job of that user keeps its
    run folders in a folder of its own under one every user may create in, as /scratch/{user} on a cluster."""
    folder = Path(tempfile.mkdtemp(prefix="ftconsole-runs-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield f"{folder}/{{user}}/runs"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
