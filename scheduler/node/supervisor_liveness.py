"""The run supervisor's process identity and liveness: node side, standard library only, Python 3.8.

A process is the pid with its start time (field 22 of /proc/<pid>/stat) in this boot (the boot id), never a
bare pid; a run's status.json read with what is true now: "lost" or "orphaned" when its supervisor is gone (see
"Liveness" in supervisor.py). Bundled into the supervisor script (`scheduler/node/bundle.py`): it imports only the
standard library and the other bundled modules (lines marked "# bundled", dropped from the bundle).
"""

import os
from typing import Dict, List  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.supervisor_container import container_running  # bundled
from ftconsole.scheduler.node.supervisor_files import _checked_status, _read_status, _unreadable  # bundled

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id():
    try:
        with open(BOOT_ID) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _pid(value):
    """`value` is a pid (a positive int; status.json is its user's, who may write anything in it)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _ticks(value):
    """`value` is a process start time (clock ticks since boot: a positive int, below 2**62)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 62


def _stat(pid):
    """(state, pgrp, start time in clock ticks since boot) of a process, or None when there is none."""
    if not _pid(pid):
        return None
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid):
    stat = _stat(pid)
    return None if stat is None else stat[2]


def _alive(pid, started, boot=None):
    """The process `pid` started at `started` (clock ticks) in this boot, and not a zombie."""
    if not _pid(pid) or not _ticks(started) or (boot is not None and boot != boot_id()):
        return False
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[0] != "Z"


def _alive_legacy(pid):
    if not _pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(pid)
    return stat is None or stat[0] != "Z"


def _group(pgid, leader_start, boot):
    """Pids of the live processes of the step's process group `pgid` (leader started at `leader_start`).

    A pgid is not reused while any process of the group lives, so the group is ours when its leader (pid ==
    pgid) is gone or is the very process we started; never in another boot."""
    if not _pid(pgid) or not _ticks(leader_start) or boot != boot_id():
        return []
    leader = _stat(pgid)
    if leader is not None and leader[2] != leader_start:
        return []  # the pid was reused: another process group
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                out.append(int(entry))
    return sorted(out)


def _process_groups():
    """pgid -> pids of the live (not zombie) processes of this node now: one look at /proc for a whole prune."""
    out = {}  # type: Dict[int, List[int]]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                out.setdefault(stat[1], []).append(int(entry))
    return out


def _any_alive(status, groups):
    """The run's supervisor or a process of its step's group still runs (as `_group`, from one /proc scan). Of a
    status that is unreadable (`_checked_status`) nothing is known to run: nothing of it is ever acted on."""
    status, problem = _checked_status(status)
    if problem is not None:
        return False
    boot = status.get("boot_id")
    if boot is not None and boot != boot_id():
        return False  # another boot: nothing of it survived
    if "supervisor_start" not in status:
        return _alive_legacy(status.get("supervisor_pid")) or bool(status.get("pgid") in groups)
    if _alive(status.get("supervisor_pid"), status.get("supervisor_start"), boot):
        return True
    pgid = status.get("pgid")
    if not pgid or pgid not in groups:
        return False
    leader = _stat(pgid)
    return leader is None or leader[2] == status.get("pid_start")


def _observe(status, path):
    """The status with what is true now: "lost" or "orphaned" when its supervisor is gone (see Liveness).

    The supervisor writes its end before it exits, so once it is seen gone, status.json is read again: a run
    that ended between the first read and the look at its supervisor reads as ended, never as lost. A status that
    is unreadable (not the types and ranges the supervisor writes: `_checked_status`) reads lost, and nothing of
    it is looked at."""
    status, problem = _checked_status(status)
    if problem is not None:
        return _unreadable(problem)
    if status.get("state") not in ("starting", "running"):
        return status
    if "supervisor_start" not in status:  # written by an earlier ftconsole: the pid is all there is
        if _alive_legacy(status.get("supervisor_pid")):
            return status
        return _ended(path) or dict(status, state="lost")
    boot = status.get("boot_id")
    if boot != boot_id():
        return dict(status, state="lost", error="the node rebooted since the run started")
    if _alive(status.get("supervisor_pid"), status.get("supervisor_start"), boot):
        return status
    ended = _ended(path)
    if ended is not None:
        return ended
    left = _group(status.get("pgid"), status.get("pid_start"), boot)
    if left:
        return dict(status, state="orphaned", orphans=left, error="its supervisor died; its processes still run")
    if status.get("container") and container_running(status["container"]):
        return dict(status, state="orphaned", orphans=[], error="its supervisor died; its container still runs")
    return dict(status, state="lost", error="its supervisor died without recording an end")


def _ended(path):
    """status.json read again, if it now records an end (or lost, when it is unreadable now)."""
    again, problem = _read_status(path)
    if problem is not None:
        return _unreadable(problem)
    return again if again is not None and again.get("state") not in ("starting", "running") else None
