"""Which sshd test node a rank runs on (imported by the rank programs, run with the peer environment)."""

from __future__ import annotations

import os


def lab_node() -> str:
    """The test node this process runs on: FTCONSOLE_LAB_NODE as the node's sshd set it for the session.

    Read from the process just below the nearest sshd ancestor (a launcher may forward the first node's
    environment, hydra does); a process reparented away from sshd (under the detached run supervisor) has
    it in its own environment.
    """
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        try:
            with open(f"/proc/{ppid}/comm") as fh:
                parent = fh.read().strip()
        except OSError:
            break
        if parent.startswith("sshd"):
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = dict(e.split(b"=", 1) for e in fh.read().split(b"\0") if b"=" in e)
            return env[b"FTCONSOLE_LAB_NODE"].decode()
        pid = ppid
    return os.environ["FTCONSOLE_LAB_NODE"]
