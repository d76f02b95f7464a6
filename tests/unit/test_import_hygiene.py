"""The core runs without the UI: scheduler/ and probes/ never import textual."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(namespace: str, package: str) -> list[str]:
    """Every module of the package, its folders' too (the probe agent left out: it runs as a script)."""
    found = pkgutil.walk_packages([str(ROOT / package)], prefix=f"{namespace}.{package}.")
    return [m.name for m in found if not m.name.endswith(".agent")]


def test_core_imports_without_textual() -> None:
    names = modules("ftconsole", "scheduler") + modules("ftconsole", "probes")
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
    assert "ftconsole.scheduler.nodeops" in names and "ftconsole.probes.health" in names
    assert "ftconsole.scheduler.decide.placement" in names and "ftconsole.scheduler.serve.daemon" in names


# what a command that talks to a running scheduler does without (the job spec's models, SSH, the store's engines,
# the scheduler's rules): importing them took `ftconsole jobs --json` from 0.47 s to 0.88 s (docs/benchmarks.md)
NOT_FOR_EVERY_COMMAND = (
    "asyncssh",
    "aiosqlite",
    "asyncpg",
    "textual",
    "ftconsole.scheduler.spec.jobspec",
    "ftconsole.scheduler.rules",
    "ftconsole.scheduler.store.db",
    "ftconsole.scheduler.ssh.transport",
)


def test_the_command_line_starts_without_the_scheduler() -> None:
    code = "import sys, ftconsole.cli\nprint('\\n'.join(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "ftconsole.scheduler.spec.config" in loaded and "ftconsole.scheduler.serve.client" in loaded
    assert [m for m in NOT_FOR_EVERY_COMMAND if m in loaded] == []
