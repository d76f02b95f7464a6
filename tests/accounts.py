"""Real accounts made by a test (useradd) removed after it: its processes killed and waited for, then the account."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path


def live_of(uid: int) -> list[int]:
    """The live processes of `uid` (zombies left out: whoever they were left to reaps them)."""
    out = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
                if state not in ("Z", "X"):
                    out.append(int(entry.name))
    return out


def remove_account(name: str, timeout: float = 30.0) -> None:
    """SIGKILL to the account's processes until none is left (a bounded time), then userdel: a userdel right after
    pkill found processes still there and left the account behind."""
    found = subprocess.run(["id", "-u", name], capture_output=True, text=True)
    if found.returncode != 0:
        return  # never made
    uid, deadline = int(found.stdout), time.monotonic() + timeout
    while live_of(uid):
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        assert time.monotonic() < deadline, f"processes of {name} outlive SIGKILL: {live_of(uid)}"
        time.sleep(0.1)
    done = subprocess.run(["userdel", "--force", name], capture_output=True, text=True)  # even with a zombie left
    assert done.returncode == 0, f"userdel {name}: {done.stderr}"
