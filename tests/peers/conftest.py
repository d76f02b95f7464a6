"""The real-launcher suite (`make test-peers`): collected only when tests/peers is named on the command line.

The main suite (`make test`, plain `pytest`) walks tests/ and must not need the peer environment
(.venv-peers: torch, DeepSpeed, TensorFlow) nor Debian's openmpi-bin, mpich and pdsh, so every file here is
ignored unless this folder, or something in it, is among pytest's arguments.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _named(config: pytest.Config) -> bool:
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if not _named(config) else None
