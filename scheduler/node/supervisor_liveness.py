"""The run supervisor's process identity and liveness: node side, standard library only, Python 3.8.

A process is the pid with its start time in this boot (`proc.py`), never a bare pid; a run's process group,
and its status.json read with what is true now: "lost" or "orphaned" when its supervisor is gone (see
"Liveness" in supervisor.py). Bundled into the supervisor script (`scheduler/node/bundle.py`): it imports only the
standard library and the other bundled modules (lines marked "# bundled", dropped from the bundle).
"""

import os
from typing import Dict, List  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.proc import _alive, _pid, _stat, _ticks, boot_id  # bundled
from ftconsole.scheduler.node.supervisor_container import container_running  # bundled
from ftconsole.scheduler.node.supervisor_files import _checked_status, _read_status, _unreadable  # bundled


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
