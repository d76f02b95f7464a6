"""The core runs without the UI: scheduler/ and probes/ never import textual."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(namespace: str, package: str) -> list[str]:
    return [f"{namespace}.{package}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / package)]) if m.name != "agent"]


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
