"""Shared fixtures. Tests never see the developer's own config, lab or ssh settings."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd_cluster import sshd_cluster_fixture  # noqa: F401  (provides the `sshd_cluster` fixture)


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("FTCONSOLE_CONFIG", raising=False)
    monkeypatch.setenv("FTCONSOLE_LAB_DIR", str(tmp_path_factory.mktemp("lab-default")))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    # pytest-xdist's workers set COLUMNS=80 and LINES=24, which Rich and Textual take for the terminal's size: a
    # console started in a real terminal (tmux) would draw 80 columns whatever its window
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    yield


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: Unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The order's seed again at the end, beside the failures: `make test SEED=N` runs that order again."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and getattr(config.option, "randomly_reorganize", True):
        terminalreporter.write_line(
            f"test order: seed {seed} (make test SEED={seed}, or pytest -p randomly "
            f"--randomly-seed={seed}, runs it again)"
        )
