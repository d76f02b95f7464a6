"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.config import load_config
from ftconsole.scheduler.ssh import SSHPool
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
