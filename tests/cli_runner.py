"""The `ftconsole` command line run as a user runs it: a subprocess with a config, checked exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TIMEOUT = 60


class Cli:
    def __init__(self, config: Path) -> None:
        self.env = {**os.environ, "FTCONSOLE_CONFIG": str(config), "TERM": "dumb"}

    def __call__(self, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        """Run `ftconsole ARGS`; with `check`, assert that exit status."""
        proc = subprocess.run(
            [sys.executable, "-m", "ftconsole.cli", *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if check is not None:
            assert proc.returncode == check, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def until(self, job_id: int, statuses: set[str]) -> dict[str, Any]:
        """`show JOB` once its status is one of `statuses`."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            shown = self.json("show", str(job_id))
            if shown["status"] in statuses:
                return dict(shown)
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} never reached {statuses}")
