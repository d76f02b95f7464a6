"""A process of this node, proven rather than inferred: node side, standard library only, Python 3.8.

A process is its pid with its start time (field 22 of /proc/<pid>/stat, clock ticks since boot) in this boot
(the boot id), never a bare pid: pids are reused and nodes reboot. The one copy of these helpers, bundled into
each node-side program that needs them (the run supervisor, the container entry, the data copy, the probe
agent) and imported by the lab. Bundled (`bundle.py`): it imports only the standard library.
"""

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id(path=BOOT_ID):
    """This boot's id (`path`: the file under another root's /proc), or None where it cannot be read."""
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _pid(value):
    """`value` is a pid (a positive int; a status file is its user's, who may write anything in it)."""
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
    """The start time of process `pid` (clock ticks since boot), or None when there is none."""
    stat = _stat(pid)
    return None if stat is None else stat[2]


def _alive(pid, started, boot=None):
    """The process `pid` started at `started` (clock ticks) in this boot (`boot`, when given), not a zombie."""
    if not _pid(pid) or not _ticks(started) or (boot is not None and boot != boot_id()):
        return False
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[0] != "Z"
