"""The other Python interpreters of this machine that node-side scripts must run on (Python 3.8: the oldest a node
may have)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

TIMEOUT_S = 30.0


def python38() -> str | None:
    """A working Python 3.8 interpreter on this machine, if any (on PATH, or one pyenv installed)."""
    candidates = [shutil.which("python3.8"), *glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == "(3, 8)":
            return candidate
    return None
