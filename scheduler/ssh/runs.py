"""Console side of the run supervisor: start, read and stop runs on a node, one SSH command each.

The supervisor (`scheduler/node/supervisor.py` and its `supervisor_*.py` modules, stdlib-only, bundled into one script
by `supervisor_source()`) is sent to `python3 -` with its parameters in a prepended line, as the probe agent is;
`status` reads every run of a node in one round trip. A run is one command, or a sequence of `Step`s (hooks,
batch tasks) that the supervisor runs in turn.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.decide.runstatus import UNREADABLE, NodeRun, RunStatus
from ftconsole.scheduler.decide.steps import Step, user_root
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.node.bundle import python_stdin_script, script
from ftconsole.scheduler.spec.config import Node
from ftconsole.scheduler.ssh import nodecache
from ftconsole.scheduler.ssh.channel import Channels, Followed
from ftconsole.scheduler.ssh.transport import Transport

log = logging.getLogger("ftconsole.scheduler")

SUPERVISOR_PROTOCOL = 2
DEFAULT_RUN_ROOT = "~/.ftconsole/runs"


class SupervisorError(FtError):
    title = "run supervisor"


class NoAccount(SupervisorError):
    """The user a job runs as has no account on a node: the job's trouble there, not the node's. `lacks` says
    what it lacks there ("no account"; NoHome: "no home folder")."""

    title = "no account"

    def __init__(self, node: str, user: str, lacks: str = "no account", detail: str = "") -> None:
        super().__init__(f"user {user} has {lacks} on {node}{detail}")
        self.node = node
        self.user = user
        self.lacks = lacks  # "no account", "no home folder"


class NoHome(NoAccount):
    """The user's account on a node has no home folder it may write in (nobody's /nonexistent, an account made
    without one) while its run folders would be there (scheduler.run_root under "~"): as if it had no account
    there; a run root outside homes with "{user}" in it needs none."""

    title = "no home folder"

    def __init__(self, node: str, user: str, home: str) -> None:
        super().__init__(node, user, "no home folder", f" ({home or 'none set'})")
        self.home = home


class CannotSwitch(SupervisorError):
    """The SSH account may not run commands as the user (neither root nor allowed by sudo)."""

    title = "cannot run as the user"


# nodes (name, host) whose SSH account switches users through sudo -> that account's name: asked once, then sent
# through sudo directly (the name for what a refusal says: "the SSH account deploy may not...")
_THROUGH_SUDO: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Prune:
    """Run retention, sent along with a status read (no round trip of its own): the node removes the folders
    of this cluster's attempts that ended more than `retention` seconds ago (its own clock), but those in
    `keep` ("<job>/<attempt>") or claimed by one of `tokens`, and nothing outside <run_root>/<cluster>."""

    run_root: str
    cluster: str
    retention: float
    keep: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()

    @classmethod
    def keeping(cls, run_root: str, cluster: str, retention: float, current: Iterable[Run]) -> Prune:
        """Keep the attempts of `current` (the store's held runs, any node: each with job, attempt, token)."""
        runs = list(current)
        return cls(
            run_root=run_root,
            cluster=cluster,
            retention=retention,
            keep=tuple(sorted({f"{r.job}/{r.attempt}" for r in runs})),
            tokens=tuple(sorted({r.token for r in runs if r.token})),
        )

    def to_json(self, user: str | None = None) -> dict[str, Any]:
        return {
            "run_root": user_root(self.run_root, user),
            "cluster": self.cluster,
            "retention": self.retention,
            "keep": list(self.keep),
            "tokens": list(self.tokens),
        }


def _pruned(node: Node, doc: dict[str, Any], into: list[str] | None) -> None:
    """What a read's prune removed, appended to `into`; a prune that failed is logged (the read stands)."""
    if "prune_error" in doc:
        log.warning("%s: cannot remove old run folders: %s", node.name, doc["prune_error"])
    if into is not None:
        into.extend(str(p) for p in doc.get("pruned") or ())


def supervisor_source() -> str:
    """supervisor.py and the node-side modules it imports, as one script (see node/bundle.py)."""
    return script("supervisor")


def supervisor_script(params: dict[str, Any]) -> str:
    return python_stdin_script(supervisor_source(), params)


async def _call(
    transport: Transport,
    node: Node,
    python: str,
    params: dict[str, Any],
    timeout: float,
    user: str | None = None,
    *,
    opens: bool = True,
) -> dict[str, Any]:
    """One supervisor action on a node; with `user`, as that account of the node (supervisor.py "Users"):
    switched on the node when the SSH account is root, else through `sudo -n -u USER`. Every action names the
    node it asks: a start records it, and the others act only on that node's runs (supervisor.py "Nodes").
    `opens`: the action may open a node channel (False for one-off actions such as sweeps: a channel that is
    open answers them, else one command does)."""
    params = {**params, "node": node.name}
    if user is not None:
        params = {**params, "user": user}
    key = (node.name, node.host)
    sudo = user is not None and key in _THROUGH_SUDO
    account = _THROUGH_SUDO.get(key, "the SSH account")
    doc = await _answer(transport, node, python, params, timeout, sudo=sudo, account=account, opens=opens)
    if "sudo" in doc and user is not None:
        _THROUGH_SUDO[key] = account = str(doc.get("account"))
        doc = await _answer(transport, node, python, params, timeout, sudo=True, account=account, opens=opens)
    if "no_account" in doc:
        raise NoAccount(node.name, str(doc["no_account"]))
    if "sudo" in doc:
        raise CannotSwitch(f"{node.name}: the SSH account may not run commands as {doc['sudo']}")
    return doc


async def _answer(
    transport: Transport,
    node: Node,
    python: str,
    params: dict[str, Any],
    timeout: float,
    *,
    sudo: bool,
    account: str = "the SSH account",
    opens: bool = True,
) -> dict[str, Any]:
    if isinstance(transport, Channels):
        doc = await transport.ask(node, python, params, timeout, sudo=sudo, opens=opens)
        if doc is not None:
            return _checked(node, params, doc)
    argv = [python, "-"]
    if sudo:
        argv = ["sudo", "-n", "-H", "-u", str(params["user"]), "--", *argv]
    result = await nodecache.run(transport, node, argv, name="supervisor", source=supervisor_source(), params=params,
                                 timeout=timeout)  # fmt: skip
    line = next((ln for ln in reversed(result.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        if sudo:
            _sudo_failed(node, account, str(params["user"]), python, result.stderr)
        raise SupervisorError(f"{node.name}: supervisor printed nothing ({result.describe_failure()})")
    return _checked(node, params, json.loads(line))


def _checked(node: Node, params: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's answer, once it is one of this protocol and no error."""
    if doc.get("supervisor") != SUPERVISOR_PROTOCOL:
        raise SupervisorError(f"{node.name}: unknown supervisor protocol {doc.get('supervisor')!r}")
    if "error" in doc:
        raise SupervisorError(f"{node.name}: {params['action']} failed: {doc['error']}")
    return doc


def _sudo_failed(node: Node, account: str, user: str, python: str, stderr: str) -> None:
    """Why `sudo -n -u USER python3 -` printed nothing: the user is unknown there, or the account may not."""
    said = " ".join(stderr.strip().splitlines()[-2:]) or "nothing"
    if "unknown user" in said:
        raise NoAccount(node.name, user)
    raise CannotSwitch(
        f"{node.name}: jobs run as their submitter (scheduler.run_as: submitter), and the SSH account {account} "
        f"is not root and may not run {python} as {user} through sudo without a password (sudo said: {said}). "
        f"Log in as root, or give the account a sudoers line such as "
        f"'{account} ALL=(ALL,!root) NOPASSWD: {python}' on every node"
    )


async def start_run(
    transport: Transport,
    node: Node,
    *,
    run_dir: str,
    argv: Sequence[str],
    env: dict[str, str],
    workdir: str,
    files: dict[str, bytes] | None = None,
    steps: Sequence[Step] | None = None,
    grace: float = 30.0,
    output_limit: int = 0,
    token: str | None = None,
    user: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> tuple[bool, RunStatus]:
    """Start a detached run; (False, its status) when the run folder already had one (never twice).

    `argv`/`env` are the main command (argv.json, env.json); with `steps`, the run is those steps in turn.
    With `token` the folder is claimed for it first: a folder claimed by another token is refused (state
    `refused`, `error` says why), never adopted. `output_limit`: the most output.log keeps, in bytes (0: no limit).
    """
    params: dict[str, Any] = {
        "action": "start",
        "token": token,
        "run_dir": run_dir,
        "argv": list(argv),
        "env": env,
        "workdir": workdir,
        "files": {name: data.decode("utf-8") for name, data in (files or {}).items()},
        "grace": grace,
        "output_limit": output_limit,
    }
    if steps is not None:
        params["steps"] = [s.to_json() for s in steps]
    doc = await _call(transport, node, python, params, timeout, user)
    if "refused" in doc:
        return False, RunStatus(state="refused", error=str(doc["refused"]), run_dir=doc.get("run_dir"))
    where = doc.get("run_dir") if isinstance(doc.get("run_dir"), str) else None
    status = dataclasses.replace(RunStatus.from_json(doc.get("status")), run_dir=where)
    return doc.get("started") is True, status


async def node_runs(
    transport: Transport,
    node: Node,
    *,
    root: str = DEFAULT_RUN_ROOT,
    prune: Prune | None = None,
    pruned: list[str] | None = None,
    user: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> list[NodeRun]:
    """Every run under `root` on the node (read as `user`, under that user's root). With `prune`, old ended
    attempts' folders are removed first, in the same round trip; their names ("<job>/<attempt>") are
    appended to `pruned`."""
    params: dict[str, Any] = {"action": "status", "root": user_root(root, user)}
    if prune is not None:
        params["prune"] = prune.to_json(user)
    doc = await _call(transport, node, python, params, timeout, user, opens=False)  # a sweep: once in a while
    _pruned(node, doc, pruned)
    return [
        NodeRun(job=r["job"], attempt=r["attempt"], rank=r["rank"], status=RunStatus.from_json(r.get("status")))
        for r in _entries(doc)
        if all(isinstance(r.get(k), str) for k in ("job", "attempt", "rank"))
    ]


def _entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The run entries of a status answer (its "runs"), those that are objects."""
    runs = doc.get("runs")
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


async def prepare_run(
    transport: Transport,
    node: Node,
    *,
    run_dir: str,
    argv: Sequence[str],
    env: dict[str, str],
    files: dict[str, bytes] | None = None,
    user: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> str:
    """Write a run folder without starting anything (a rank that mpirun starts); its absolute path."""
    params = {
        "action": "prepare",
        "run_dir": run_dir,
        "argv": list(argv),
        "env": env,
        "files": {name: data.decode("utf-8") for name, data in (files or {}).items()},
    }
    doc = await _call(transport, node, python, params, timeout, user)
    return str(doc["run_dir"])


async def run_states(
    transport: Transport,
    node: Node,
    run_dirs: Sequence[str],
    *,
    tokens: dict[str, str] | None = None,
    users: Mapping[str, str | None] | None = None,
    prune: Prune | None = None,
    pruned: list[str] | None = None,
    scan: Mapping[str, Any] | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> dict[str, RunStatus]:
    """The status of the given run folders of one node, keyed by run folder as given: one round trip for
    each user they belong to (`users`: run folder -> user; a run read as its user, see `_call`).

    With `tokens` (run folder -> attempt token), a folder claimed by another token reads state `foreign`.
    With `prune`, as `node_runs`, for each of those users. `scan` (run folder -> {"from": offset, "patterns":
    name -> regex}): those runs' output.log is scanned for the patterns (RunStatus.scan).

    One user's runs are that user's alone: when the read of one user's runs fails on the node (its account is
    gone, its supervisor failed) while others' answer, its runs are left out of the answer (unknown this time,
    asked again) and the others' are answered; only when every read fails (the node's trouble) is it raised."""
    out: dict[str, RunStatus] = {}
    groups = _by_user(run_dirs, users)
    answers = await asyncio.gather(
        *(
            _states(transport, node, dirs, user, tokens or {}, prune, python, timeout, scan or {})
            for user, dirs in groups.items()
        ),
        return_exceptions=True,
    )
    failed = [a for a in answers if isinstance(a, BaseException)]
    if failed and (len(failed) == len(answers) or any(not isinstance(a, SupervisorError) for a in failed)):
        raise failed[0]  # the node's trouble (no answer, a transport error), or nothing answered at all
    for (user, dirs), doc in zip(groups.items(), answers, strict=True):
        if isinstance(doc, BaseException):
            log.warning("%s: cannot read the runs of %s: %s", node.name, user or "the SSH account", doc)
            continue
        _pruned(node, doc, pruned)
        given = {r.get("run_dir"): r.get("status") for r in _entries(doc)}
        for run_dir in dirs:
            answered = run_dir in given
            why = UNREADABLE + "the node's answer has none"
            out[run_dir] = RunStatus.from_json(given[run_dir]) if answered else RunStatus(state="lost", error=why)
    return out


async def _states(
    transport: Transport,
    node: Node,
    run_dirs: Sequence[str],
    user: str | None,
    tokens: dict[str, str],
    prune: Prune | None,
    python: str,
    timeout: float,
    scan: Mapping[str, Any],
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "action": "status",
        "run_dirs": list(run_dirs),
        "tokens": {d: tokens[d] for d in run_dirs if d in tokens},
    }
    if any(d in scan for d in run_dirs):
        params["scan"] = {d: scan[d] for d in run_dirs if d in scan}
    if prune is not None:
        params["prune"] = prune.to_json(user)
    return await _call(transport, node, python, params, timeout, user)


def _by_user(run_dirs: Sequence[str], users: Mapping[str, str | None] | None) -> dict[str | None, list[str]]:
    groups: dict[str | None, list[str]] = {}
    for run_dir in run_dirs:
        groups.setdefault((users or {}).get(run_dir), []).append(run_dir)
    return groups


async def prune_runs(
    transport: Transport,
    node: Node,
    prune: Prune,
    *,
    user: str | None = None,
    pruned: list[str] | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> None:
    """Run retention alone, for the runs of `user` (as `node_runs`'s prune)."""
    params = {"action": "status", "run_dirs": [], "prune": prune.to_json(user)}
    _pruned(node, await _call(transport, node, python, params, timeout, user, opens=False), pruned)


async def read_file(
    transport: Transport,
    node: Node,
    path: str,
    *,
    offset: int = 0,
    limit: int,
    tail: int | None = None,
    user: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> tuple[int, bytes] | None:
    """Up to `limit` bytes of a file of a run (as `user`: a run folder is read with its user's rights only)
    from `offset`, or from where its last `tail` lines start: (where the bytes start, bytes); None: no file."""
    params: dict[str, Any] = {"action": "read", "path": path, "offset": offset, "limit": limit, "tail": tail}
    doc = await _call(transport, node, python, params, timeout, user)
    if not doc["exists"]:
        return None
    return int(doc["offset"]), base64.b64decode(doc["data"])


async def follow_file(
    transport: Transport,
    node: Node,
    path: str,
    *,
    offset: int,
    user: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> Followed | None:
    """The file at `path` (as `user`, like `read_file`) pushed from `offset` as it grows, by the node's channel;
    None where there is none (read it by request)."""
    if not isinstance(transport, Channels):
        return None
    params: dict[str, Any] = {"path": path, "offset": offset, "node": node.name}
    if user is not None:
        params["user"] = user
    sudo = user is not None and (node.name, node.host) in _THROUGH_SUDO
    return await transport.follow(node, python, params, timeout, sudo=sudo)


async def run_files(
    transport: Transport, node: Node, run_dir: str, *, user: str | None = None, python: str = "python3",
    timeout: float = 30.0,
) -> dict[str, str | None] | None:  # fmt: skip
    """argv.json, env.json and hostfile of a run folder, read as `user`; None when there is no such folder."""
    doc = await _call(transport, node, python, {"action": "files", "run_dir": run_dir}, timeout, user)
    if doc.get("absent"):
        return None
    return {name: doc.get(name) for name in ("argv.json", "env.json", "hostfile")}


async def account(
    transport: Transport,
    node: Node,
    user: str,
    *,
    needs_home: bool = False,
    python: str = "python3",
    timeout: float = 30.0,
) -> dict[str, Any]:
    """The node's account of `user` ({account, uid, home}), as the runs of that user would meet it: NoAccount
    when there is none, CannotSwitch when the SSH account may not become it, and with `needs_home` (its run
    folders would be in its home) NoHome when it has no home folder it may write in."""
    doc = await _call(transport, node, python, {"action": "account"}, timeout, user)
    if needs_home and doc.get("home_usable") is False:
        raise NoHome(node.name, user, str(doc.get("home") or ""))
    return {k: doc[k] for k in ("account", "uid", "home")}


async def signal_runs(
    transport: Transport,
    node: Node,
    run_dirs: Sequence[str],
    signal: str,
    *,
    tokens: dict[str, str] | None = None,
    users: Mapping[str, str | None] | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> int:
    """Send `signal` (a name) to the current step of each run, each as its user; how many were signalled."""
    count = 0
    for user, dirs in _by_user(run_dirs, users).items():
        params = {
            "action": "signal",
            "run_dirs": dirs,
            "signal": signal,
            "tokens": {d: (tokens or {})[d] for d in dirs if d in (tokens or {})},
        }
        doc = await _call(transport, node, python, params, timeout, user)
        count += sum(1 for a in doc["signalled"] if a.get("signalled"))
    return count


async def signal_leftovers(
    transport: Transport,
    node: Node,
    job: int,
    attempt: int,
    signal: str,
    *,
    user: str | None = None,
    python: str = "python3",
    timeout: float = 30.0,
    step: int | None = None,
) -> int | None:
    """`signal` (SIGTERM or SIGKILL) to what attempt `attempt` of job `job` left on the node (supervisor.py
    "leftovers"), as `user`: how many processes, None where the node cannot tell. With `step`: only that step's
    (`ftconsole run`: FT_STEP in their environment)."""
    env = {"FT_JOB_ID": str(job), "FT_ATTEMPT": str(attempt)} | ({} if step is None else {"FT_STEP": str(step)})
    params = {"action": "leftovers", "env": env, "signal": signal}
    found = (await _call(transport, node, python, params, timeout, user, opens=False)).get("found")
    return None if found is None else int(found)


async def shell_ttys(transport: Transport, node: Node, job: int, attempt: int, *, warn: str | None = None,
                     user: str | None = None, python: str = "python3",
                     timeout: float = 30.0) -> dict[str, float] | None:  # fmt: skip
    """The terminals of a run's shells on the node (supervisor.py "shells") and when each was last typed at, `warn`
    written on them first; None where the node cannot tell."""
    params = {"action": "shells", "env": {"FT_JOB_ID": str(job), "FT_ATTEMPT": str(attempt)}, "warn": warn}
    ttys = (await _call(transport, node, python, params, timeout, user, opens=False)).get("ttys")
    return None if ttys is None else {str(k): float(v) for k, v in ttys.items()}


async def process_evidence(
    transport: Transport,
    node: Node,
    groups: Sequence[dict[str, Any]],
    *,
    sample: float,
    stacks: bool,
    py_spy: dict[str, str] | None = None,
    kernel_since: float | None = None,
    python: str = "python3",
    timeout: float = 30.0,
) -> dict[str, Any]:
    """What the processes of each group ({key, pgid, start, boot}: a rank's step) are doing, as the SSH account
    (supervisor_evidence.py): {"groups": key -> {"processes": [...]} or {"gone": why}, "py_spy": the path used or
    None, "machine", "kernel"}. `py_spy`: where the scheduler's copy would be kept, and its hash (`ssh.pyspy`);
    `kernel_since`: a wall time, for the driver's Xid lines logged since then ("kernel": {"xids", "foreign"} or
    {"error"}; kernel_log.py)."""
    params: dict[str, Any] = {"action": "processes", "groups": list(groups), "sample": sample, "stacks": stacks}
    if py_spy is not None:
        params["py_spy"] = py_spy
    if kernel_since is not None:
        params["kernel_since"] = kernel_since
    doc = await _call(transport, node, python, params, timeout, opens=False)
    found = doc.get("groups")
    by_key = {str(g.get("key")): g for g in found if isinstance(g, dict)} if isinstance(found, list) else {}
    kernel = doc.get("kernel") if isinstance(doc.get("kernel"), dict) else None
    return {"groups": by_key, "py_spy": doc.get("py_spy"), "machine": doc.get("machine"), "kernel": kernel}


async def free_port(transport: Transport, node: Node, *, python: str = "python3", timeout: float = 30.0) -> int:
    """A TCP port free on the node now (for MASTER_PORT); asked as the SSH account, once per launch: through its
    channel where one is open, else by one command (none is opened for it)."""
    doc = await _call(transport, node, python, {"action": "port"}, timeout, opens=False)
    return int(doc["port"])


async def stop_runs(
    transport: Transport,
    node: Node,
    run_dirs: Sequence[str],
    *,
    tokens: dict[str, str] | None = None,
    users: Mapping[str, str | None] | None = None,
    force: bool = False,
    python: str = "python3",
    timeout: float = 30.0,
) -> list[dict[str, Any]]:
    """Stop runs (SIGTERM to their supervisors; `force`: SIGKILL to everything of them), each as its user
    (`users`, as in `run_states`), in the order given. Each answer has `signalled` and `alive` (something of
    the run may still run). Orphaned runs are always killed."""

    async def stop(user: str | None, dirs: list[str]) -> list[dict[str, Any]]:
        params = {
            "action": "stop",
            "run_dirs": dirs,
            "tokens": {d: (tokens or {})[d] for d in dirs if d in (tokens or {})},
            "force": force,
        }
        return list((await _call(transport, node, python, params, timeout, user))["stopped"])

    groups = _by_user(run_dirs, users)
    answers: dict[str, dict[str, Any]] = {}
    for dirs, stopped in zip(
        groups.values(), await asyncio.gather(*(stop(u, d) for u, d in groups.items())), strict=True
    ):
        answers.update(zip(dirs, stopped, strict=True))
    return [answers[d] for d in run_dirs]
