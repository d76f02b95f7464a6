"""What a run leaves running on its node, and its end: node side, standard library only, Python 3.8.

A job's processes that its run's process group does not hold: a shell opened in the run's environment (`ftconsole
shell`, an allocation's shell) and what it started with `nohup` or `&`, the ranks a launcher on another node started
here over SSH (DeepSpeed's runner through pdsh, mpirun's orted), what the rank's own processes left behind. They are
told by the run's FT_JOB_ID and FT_ATTEMPT in their environment and by the node's end of their SSH session
(SSH_CONNECTION, which a process keeps when it is left to init; in the lab, the node's name too), so that where nodes
share a kernel another node's are never among them. The run's supervisor ends its own node's as the run ends
(`end_leftovers`); the scheduler asks the other nodes of an attempt once it has ended (supervisor action `leftovers`,
`stop_leftovers`). Everything here acts as the account it runs as: only that user's processes.

Bundled into the supervisor script (`scheduler/node/bundle.py`).
"""

import contextlib
import os
import signal
import time
from typing import Dict, List  # noqa: F401  (used in type comments: this file runs on Python 3.8)

from ftconsole.scheduler.node.supervisor_evidence import LAB_NODE, _all, _environs, _owned_by, _proc  # bundled

LEFTOVER_GRACE_S = 5.0  # after SIGTERM, how long what a run left behind has before SIGKILL


def _server(connection):
    """The node's end of an SSH session (`SSH_CONNECTION`'s address and port), or None."""
    parts = (connection or "").split()
    return " ".join(parts[2:4]) if len(parts) == 4 else None


def leftovers(want):
    """The processes of this account that carry each of `want`'s values in their environment (a run's FT_JOB_ID and
    FT_ATTEMPT: a shell opened in the run's env and what it left running, ranks a launcher started here over SSH,
    what the run's own processes left behind) and came in through this node's SSH server (SSH_CONNECTION, which a
    process keeps when it is left to init; in the lab, the node's name too), with their descendants: {pid: start}.
    None where this process does not know the node's SSH server (no SSH_CONNECTION: sudo's reset environment):
    where nodes share a kernel (the lab), another node's processes are never among them."""
    here = _server(os.environ.get("SSH_CONNECTION"))
    if not want or here is None:
        return None
    wanted = dict(want)
    if os.environ.get(LAB_NODE):
        wanted[LAB_NODE] = os.environ[LAB_NODE]
    needles = [("%s=%s" % (k, v)).encode("utf-8") for k, v in sorted(wanted.items())]
    table, uid, me = _all(), os.getuid(), os.getpid()
    seeds = [pid for pid, env in _environs(uid, table)
             if pid != me and all(n in env for n in needles) and _server_in(env) == here]  # fmt: skip
    children = {}  # type: Dict[int, List[int]]
    for seen in table.values():
        children.setdefault(seen["ppid"], []).append(seen["pid"])
    found, todo = set(seeds), list(seeds)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child != me and _owned_by(child, uid):
                found.add(child)
                todo.append(child)
    return {pid: table[pid]["start"] for pid in found}


def signal_leftovers(victims, sig):
    """Send `sig` to each of `victims` ({pid: start}) that is still the same process (not a pid reused since)."""
    for pid, start in victims.items():
        if _lives(pid, start):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def end_leftovers(want, grace=LEFTOVER_GRACE_S):
    """When a run ends (its supervisor): SIGTERM to its `leftovers`, SIGKILL to what is left of them after `grace`
    seconds. How many there were."""
    victims = leftovers(want) or {}
    signal_leftovers(victims, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_lives(p, s) for p, s in victims.items()):
        if time.monotonic() >= deadline:
            signal_leftovers(victims, signal.SIGKILL)
            break
        time.sleep(0.05)
    return len(victims)


def stop_leftovers(params):
    """Action `leftovers` {env, signal}: `signal` (SIGTERM, or SIGKILL once the stop's grace period is over) to the
    `leftovers` of an attempt (env: its FT_JOB_ID and FT_ATTEMPT) on this node, at once: {"found": how many, or
    None where this node's SSH server is not known}. The scheduler asks it on the nodes where a launcher on
    another node started the attempt's ranks, once the attempt has ended."""
    victims = leftovers(params.get("env") or {})
    if victims is not None:
        signal_leftovers(victims, signal.SIGKILL if params.get("signal") == "SIGKILL" else signal.SIGTERM)
    return {"found": None if victims is None else len(victims)}


def shell_ttys(params):
    """Action `shells` {env, warn}: the terminals of this account's processes in a run's environment that came in over
    this node's SSH server (an allocation's shells, `leftovers`), each with when it was last typed at (its atime, as
    `w` reads idle times): {"ttys": {path: atime}}, None where this node's SSH server is not known. With `warn`, that
    line is written on each of them first (the idle allocation's warning). Only this account's own terminals."""
    victims = leftovers(params.get("env") or {})
    if victims is None:
        return {"ttys": None}
    ttys = {}  # type: Dict[str, None]
    for pid in victims:
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                path = os.readlink("/proc/%d/fd/%d" % (pid, fd))
                if path.startswith("/dev/pts/") or path.startswith("/dev/tty"):
                    ttys[path] = None
    uid, warn, out = os.getuid(), params.get("warn"), {}
    for path in sorted(ttys):
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid != uid:
                continue
            if warn:
                fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
                try:
                    os.write(fd, ("\r\nftconsole: %s\r\n" % warn).encode("utf-8", "replace"))
                finally:
                    os.close(fd)
            out[path] = os.stat(path).st_atime
    return {"ttys": out}


def _server_in(env):
    """`_server` of the SSH_CONNECTION in a process's environment (a set of NAME=value), or None."""
    for entry in env:
        if entry.startswith(b"SSH_CONNECTION="):
            return _server(entry[len(b"SSH_CONNECTION=") :].decode("utf-8", "replace"))
    return None


def _lives(pid, start):
    """Whether the process `pid` that started at `start` still runs (a zombie has ended)."""
    info = _proc(pid)
    return info is not None and info["start"] == start and info["state"] != "Z"
