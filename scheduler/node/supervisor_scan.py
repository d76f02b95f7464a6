"""What the run supervisor reads from output.log and /proc: node side, standard library only, Python 3.8.

output.log's mtime and size (the progress heartbeat), the scan of its new lines for a job's patterns (bounded
in bytes and CPU), the last line a failing step wrote, and the /proc/<pid>/io counters of a running step's
process group (the hang detector's sign of life). Bundled into the supervisor script (`scheduler/node/bundle.py`):
it imports only the standard library and the other bundled modules (lines marked "# bundled", dropped from the
bundle).
"""

import glob
import os
import signal
from typing import Any, Dict  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.proc import _stat  # bundled
from ftconsole.scheduler.node.supervisor_container import container_pids  # bundled
from ftconsole.scheduler.node.supervisor_output import _output_chunk  # bundled

IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")
HYBRID_CIDS = "ft-*-p*.cid"  # in a run folder: the containers container.py started for MPI processes
SCAN_BYTES = 256 * 1024  # at most this much of output.log (its end) is scanned per read
SCAN_MATCHES = 64  # the last matches kept per pattern
SCAN_BUDGET_S = 1.0  # CPU for all the patterns of one read: a pattern that takes longer is reported, not waited for


def _with_output(run_dir, status):
    """The status with output.log's mtime and size (a run that prints is making progress)."""
    try:
        st = os.stat(os.path.join(run_dir, "output.log"))
    except OSError:
        return status
    return dict(status, output_mtime=st.st_mtime, output_size=st.st_size)


class _ScanTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _ScanTimeout()


def _scan(run_dir, ask):
    """Matches of a job's patterns (`ask["patterns"]`: name -> regex) in output.log's complete lines after
    byte `ask["from"]` (at most SCAN_BYTES from its end): {"to": the offset scanned to, "matches": name ->
    the last SCAN_MATCHES matches' named groups (and "line": the line, cut to 300 characters)}."""
    import re

    path = os.path.join(run_dir, "output.log")
    try:  # in offsets of the whole output, what its output_limit dropped counted (supervisor_output.py)
        got = _output_chunk(path, ask.get("from") or 0, SCAN_BYTES, wait=1.0, last=SCAN_BYTES)
    except OSError as exc:
        return {"error": "cannot read output.log: %s" % exc.strerror}
    if got is None:  # being cut: scanned from there next time
        return {"to": ask.get("from") or 0, "matches": {}}
    start, data, _ = got
    end = data.rfind(b"\n") + 1
    out = {"to": start + end, "matches": {}}  # type: Dict[str, Any]
    lines = data[:end].decode("utf-8", "replace").splitlines()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, SCAN_BUDGET_S)
    try:
        for name, regex in (ask.get("patterns") or {}).items():
            found = []
            compiled = re.compile(regex)
            for line in lines:
                m = compiled.search(line)
                if m is not None:
                    found.append(dict(m.groupdict(), line=line[:300]))
            out["matches"][name] = found[-SCAN_MATCHES:]
    except _ScanTimeout:
        out["error"] = "the patterns took more than %gs over %d bytes: simplify them" % (SCAN_BUDGET_S, end)
    except re.error as exc:
        out["error"] = "bad pattern: %s" % exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return out


def _io(pids):
    """The sum of /proc/<pid>/io's counters over `pids` (None when none could be read: another user's, or
    gone): the hang detector's sign of life, any change of it being one."""
    total, seen = 0, False
    for pid in pids:
        try:
            with open("/proc/%d/io" % pid) as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in IO_FIELDS:
                        total += int(value)
            seen = True
        except (OSError, ValueError):
            continue
    return total if seen else None


def _with_io(status, groups, cgroups, run_dir=None):
    """A running run's status with `io`: the I/O counters of its step's process group (see `_io`), and of its
    containers' processes: its step's container, and those container.py started on this node for the MPI
    processes of the hybrid model (their id files in `run_dir`, HYBRID_CIDS). `cgroups`: see container_pids."""
    pgid = status.get("pgid")
    if status.get("state") != "running" or not pgid or pgid not in groups:
        return status
    leader = _stat(pgid)
    if leader is not None and leader[2] != status.get("pid_start"):
        return status  # the pgid is another group's now
    pids = list(groups[pgid])
    cidfiles = [(status.get("container") or {}).get("cidfile")]
    cidfiles += sorted(glob.glob(os.path.join(glob.escape(run_dir), HYBRID_CIDS))) if run_dir else []
    for cidfile in cidfiles:
        if cidfile:
            pids += container_pids(cidfile, cgroups)  # the client's group holds only the client
    io = _io(pids)
    return status if io is None else dict(status, io=io)


def _last_line(path, since, limit=4096):
    """The last non-empty line written to `path` after offset `since` (at most `limit` bytes back), or None."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(since if since <= end else 0, end - limit))  # past the end: the log was cut since
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else None
