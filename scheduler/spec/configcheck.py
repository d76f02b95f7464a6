"""`ftconsole config check`: every problem of a cluster config in one run, sorted by line.

`load_config`, which every command and the scheduler run, refuses what is wrong with the values themselves
(their types and ranges, and what spans several keys). This adds what only this host can tell, and what would
fail later, when the scheduler starts or first reaches a node:

- `state_dir` is a folder this user may write, or one it may make;
- the API socket's path fits a Unix socket (107 bytes) and its folder can be written or made;
- `api.group` is a group of this host;
- `ssh.identity_file` is a file this user may read; `ssh.config_file`, where it exists, too;
- `ssh.known_hosts` exists and can be read; with `host_key_policy: accept-new` one that does not exist yet is
  fine (it is made at the first connection, and `config check` notes it), with `strict` it is a problem, as
  every node's key would be unknown;
- the config names at least one node.

A key whose section already has a problem is not looked at on this host: its value is not known.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftconsole.scheduler.errors import Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import LoadedConfig, config_problems, merge_problems, sort_problems

Loc = tuple[Any, ...]

# the longest path of a Unix socket: sun_path is 108 bytes, with the closing NUL (unix(7))
MAX_SOCKET_PATH = 107


@dataclass
class Checked:
    """What `config check` found: the config as far as it validates (`loaded`), every problem by line, and
    notes (what is fine, but worth knowing: a file made later)."""

    file: Path
    loaded: LoadedConfig
    marks: yamlfile.Marks
    problems: list[Problem]
    notes: list[str] = field(default_factory=list)


def check_config(path: Path) -> Checked:
    """Every problem of the config at `path`: its YAML, its keys, across its keys, and on this host. ConfigError
    only where nothing past it can be read (a YAML syntax error, a file that cannot be read)."""
    data, marks, problems = yamlfile.load_all(path)
    _, best, more = config_problems(data, marks, str(path))
    problems = merge_problems(problems, more)
    loaded = LoadedConfig(cluster=best, file=path.resolve())
    faulted = [p.path for p in problems if p.path]
    found, notes = host_problems(loaded)
    for loc, message in found:
        if not any(_related(yamlfile.dotted(loc), key) for key in faulted):  # its value is not known
            problems.append(Problem(str(path), yamlfile.line_of(marks, loc), yamlfile.dotted(loc), message))
    if not best.nodes and not any(_related("nodes", key) for key in faulted):
        line = yamlfile.line_of(marks, ("nodes",)) if ("nodes",) in marks else 1
        problems.append(Problem(str(path), line, "nodes", "no nodes: list at least one node group (name, host)"))
    return Checked(path, loaded, marks, sort_problems(problems), notes)


def _related(a: str, b: str) -> bool:
    """Whether key paths `a` and `b` are the same key or one lies inside the other."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((short + ".", short + "["))


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _folder_problem(folder: Path, what: str) -> str | None:
    """Why this user cannot keep files in `folder` (one that exists, or the nearest that does, where it would be
    made), or None."""
    if folder.exists():
        if not folder.is_dir():
            return f"{what} {folder} is not a folder"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{what} {folder} is not writable by {_user()}"
        return None
    above = next((p for p in folder.parents if p.exists()), None)
    if above is None or not above.is_dir():
        return f"{what} {folder} cannot be made: {above} is not a folder"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"{what} {folder} cannot be made: {above} is not writable by {_user()}"
    return None


def _readable_problem(file: Path, what: str) -> str | None:
    if not file.exists():
        return f"{what} {file} does not exist"
    if file.is_dir():
        return f"{what} {file} is a folder, not a file"
    if not os.access(file, os.R_OK):
        return f"{what} {file} cannot be read by {_user()}"
    return None


def host_problems(loaded: LoadedConfig) -> tuple[list[tuple[Loc, str]], list[str]]:
    """What this host says of the config: (key path, problem) each, and notes."""
    out: list[tuple[Loc, str]] = []
    notes: list[str] = []
    cluster = loaded.cluster
    why = _folder_problem(loaded.state_dir, "state_dir")
    if why is not None:
        out.append((("state_dir",), f"{why}: the scheduler keeps its store, lock and logs there"))
    out += _socket_problems(loaded)
    group = cluster.api.group
    if group is not None:
        try:
            grp.getgrnam(group)
        except KeyError:
            out.append((("api", "group"), f"no group {group!r} on this host (`getent group {group}` finds none): "
                        f"create it, or name a group that exists"))  # fmt: skip
    ssh = cluster.ssh
    identity = loaded.resolve(ssh.identity_file)
    if identity is not None:
        why = _readable_problem(identity, "the key file")
        if why is not None:
            out.append((("ssh", "identity_file"), f"{why}: no node could be logged in to with it"))
    config_file = loaded.resolve(ssh.config_file)
    if config_file is not None and config_file.exists():  # one that does not exist is none (ssh_files)
        why = _readable_problem(config_file, "the ssh config")
        if why is not None:
            out.append((("ssh", "config_file"), why))
    reboot = cluster.repair.reboot
    if isinstance(reboot, list) and shutil.which(reboot[0]) is None:
        out.append((("repair", "reboot"), f"{reboot[0]!r} is not a program on this host's PATH: the head node runs "
                    "the reboot command (give its full path, or install it)"))  # fmt: skip
    known, known_notes = _known_hosts(loaded)
    return out + known, notes + known_notes


def _socket_problems(loaded: LoadedConfig) -> list[tuple[Loc, str]]:
    socket = loaded.socket_path
    given = loaded.cluster.api.socket is not None
    loc: Loc = ("api", "socket") if given else ("state_dir",)
    size = len(os.fsencode(str(socket)))
    out: list[tuple[Loc, str]] = []
    if size > MAX_SOCKET_PATH:
        fix = "set api.socket to a shorter path" + ("" if given else " (or choose a shorter state_dir)")
        out.append((loc, f"the API socket {socket} is {size} bytes long, over the {MAX_SOCKET_PATH} bytes a Unix "
                         f"socket's path may have: {fix}, such as /run/ftconsole/ftconsole.sock"))  # fmt: skip
    if given:
        why = _folder_problem(socket.parent, "the API socket's folder")
        if why is not None:
            out.append((loc, why))
    return out


def _known_hosts(loaded: LoadedConfig) -> tuple[list[tuple[Loc, str]], list[str]]:
    ssh = loaded.cluster.ssh
    known = loaded.resolve(ssh.known_hosts)
    assert known is not None
    loc: Loc = ("ssh", "known_hosts")
    if known.exists():
        why = _readable_problem(known, "known_hosts")
        return ([(loc, why)] if why is not None else []), []
    if ssh.host_key_policy == "strict":
        return [
            (
                loc,
                f"known_hosts {known} does not exist, and with host_key_policy strict a node whose key is not in it "
                f"is refused: every node would be. Fill it (ssh-keyscan -H HOST >> {known}), or set "
                "ssh.host_key_policy: accept-new to record each node's key at its first connection",
            )
        ], []
    why = _folder_problem(known.parent, "known_hosts's folder")
    if why is not None:
        return [(loc, f"{why}: known_hosts {known} is made there at the first connection (accept-new)")], []
    return [], [f"known_hosts {known} does not exist yet: it is made at the first connection, with each node's key "
                "as first seen (host_key_policy accept-new)"]  # fmt: skip
