"""The run supervisor's retention: node side, standard library only, Python 3.8.

`prune` removes the attempt folders of <run_root>/<cluster> that have ended longer than the retention ago and
that the scheduler does not keep (see "Retention" in supervisor.py); a status read runs it first. Bundled into
the supervisor script (`scheduler/node/bundle.py`): it imports only the standard library and the other bundled
modules (lines marked "# bundled", dropped from the bundle).
"""

import contextlib
import os
import shutil
import time
from typing import Dict, List, Optional  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.supervisor_files import CLAIM, STATUS, _expand, _read_status, _read_text  # bundled
from ftconsole.scheduler.node.supervisor_liveness import _any_alive, _observe, _process_groups  # bundled

ENDED = ("exited", "failed", "lost")
# attempt folders removed by one prune at most: the prune rides on the node's status read, the scheduler's
# heartbeat of the node, which must answer within node_timeout; what is left goes on the next prune
MAX_PRUNED = 100


def _plain(name):
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def prune(spec, node=None):
    """Remove the attempt folders of <run_root>/<cluster> that may go (see "Retention"); their names. `node`:
    the node asked about; a rank started for another (a shared home) counts by what its status.json says."""
    retention = float(spec["retention"])
    cluster = spec["cluster"]
    if not _plain(cluster):
        raise ValueError("not a cluster id: %r" % (cluster,))
    if retention <= 0:
        return []
    run_root = _expand(spec["run_root"])
    root = os.path.join(run_root, cluster)
    if os.path.islink(root) or not os.path.isdir(root):
        return []
    real_root = os.path.realpath(root)
    if os.path.dirname(real_root) != os.path.realpath(run_root):
        raise ValueError("%s is not a folder of the run root %s" % (root, run_root))
    keep = set(spec.get("keep") or ())
    tokens = set(spec.get("tokens") or ())
    cutoff = time.time() - retention
    groups = None  # type: Optional[Dict[int, List[int]]]
    removed = []
    for job in sorted(os.listdir(root)):
        job_dir = os.path.join(root, job)
        if not _plain(job) or os.path.islink(job_dir) or not os.path.isdir(job_dir):
            continue
        for attempt in sorted(os.listdir(job_dir)):
            name = "%s/%s" % (job, attempt)
            attempt_dir = os.path.join(job_dir, attempt)
            if name in keep or not _plain(attempt) or os.path.islink(attempt_dir) or not os.path.isdir(attempt_dir):
                continue
            if groups is None:
                groups = _process_groups()
            if not _expired(attempt_dir, cutoff, tokens, groups, node):
                continue
            if os.path.dirname(os.path.dirname(os.path.realpath(attempt_dir))) != real_root:
                continue  # never reached through a link: only the run root's own folders go
            shutil.rmtree(attempt_dir)
            removed.append(name)
            if len(removed) >= MAX_PRUNED:
                return removed
        if not any(k.split("/", 1)[0] == job for k in keep):
            with contextlib.suppress(OSError):
                os.rmdir(job_dir)  # only when empty: a job none of whose attempts is left
    return removed


def _expired(attempt_dir, cutoff, tokens, groups, node=None):
    """Every rank of the attempt folder ended before `cutoff`, none is alive, none is a current token's. A
    rank started for another node than `node` has ended only when its status.json records the end: its
    processes are that node's, which this one cannot see (or, sharing a kernel, must not judge)."""
    for rank in os.listdir(attempt_dir):
        run_dir = os.path.join(attempt_dir, rank)
        if os.path.islink(run_dir) or not os.path.isdir(run_dir):
            if os.lstat(run_dir).st_mtime >= cutoff:
                return False
            continue
        if _read_text(os.path.join(run_dir, CLAIM)) in tokens:
            return False
        status_path = os.path.join(run_dir, STATUS)
        status = _read_status(status_path)[0]
        if status is None:  # nothing was started in it (a rank mpirun starts), or its status is unreadable (its
            # user may write anything there; the scheduler reads it lost): judged by its last change
            if _last_change(run_dir) >= cutoff:
                return False
            continue
        if status.get("token") in tokens:
            return False
        if node is not None and status.get("node") not in (None, node):
            seen = status  # another node's: as it recorded itself
        else:
            seen = _observe(status, status_path)
            if _any_alive(status, groups):
                return False
        if seen.get("state") not in ENDED:
            return False
        ended = seen.get("ended")
        if not isinstance(ended, (int, float)):
            ended = os.stat(status_path).st_mtime
        if ended >= cutoff:
            return False
    return True


def _last_change(folder):
    times = [os.lstat(folder).st_mtime]
    for entry in os.listdir(folder):
        with contextlib.suppress(OSError):
            times.append(os.lstat(os.path.join(folder, entry)).st_mtime)
    return max(times)
