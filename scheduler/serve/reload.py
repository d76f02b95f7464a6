"""A changed config applied to a running scheduler: `ftconsole config reload` (the API's `reload` op, admins only)
and SIGHUP (`systemctl reload ftconsole`); docs/operations.md, "Changing the config while it runs".

The file is read and validated first, and compared with the config in use (`config_change`, pure). Nothing changes
unless all of it can be applied: an invalid file, a key that is set up once at start (`RESTART_KEYS`), a node
removed (or moved to another address) while runs hold GPUs there, or another `scheduler.run_as` while any run does
(`busy_problems`) is refused with every reason, and the scheduler goes on as it was.

How a change is applied (`Reloader`): the control loop stops at the end of its tick, a scheduler is built anew
from the new config on the same store, SSH connections and API socket, and its loop starts: the runs are read
back from their nodes as after a restart, nothing on the nodes is touched, and nothing is placed before the new
loop's first probe sweep has read every node (a node just added has no probe: it takes no job before one). The
API answers throughout: a request is served by the old scheduler until the new one is in place, one in flight
finishes there. The notifications and the Alertmanager sync restart only when their keys changed; the metrics
endpoint stays up and reads whichever scheduler is current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ftconsole.scheduler.errors import ConfigError, Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import ClusterConfig, LoadedConfig, Node, load_config
from ftconsole.scheduler.spec.nodesets import expand_nodeset

if TYPE_CHECKING:  # the CLI imports the pure part (`reload_lines`) without the scheduler's machinery
    from ftconsole.scheduler.decide.jobs import Run
    from ftconsole.scheduler.jobops import Scheduler
    from ftconsole.scheduler.nodeops import ClusterService

log = logging.getLogger("ftconsole.daemon")

Loc = tuple[Any, ...]

_AFTER_RESTART = (
    "restart the scheduler to apply it (`systemctl restart ftconsole`: the jobs keep running on their nodes)"
)
# key (a dotted prefix) -> why a change of it needs a restart: what `serve` sets up once, at its start
RESTART_KEYS: dict[str, str] = {
    "state_dir": "the scheduler holds its lock and keeps its store and API socket there from its start",
    "state": "the store (and, with two head nodes, the lease) is opened once, at start",
    "api.socket": "the API socket is bound at start",
    "api.group": "the API socket and state_dir are given to this group at start",
    "metrics": "the metrics endpoint's listener is bound at start",
    "ssh": "the SSH connections to the nodes are opened with these settings at start and kept open",
}
# keys whose change restarts the notifications and the Alertmanager sync (the sync sends with notify's settings)
OUTWARD_KEYS = ("notify", "alertmanager")
# keys refused while runs hold GPUs (`busy_problems`), as are a node removed or moved while it runs jobs
BUSY_KEYS: frozenset[Loc] = frozenset({("scheduler", "run_as")})


@dataclass(frozen=True)
class ConfigChange:
    """What a new config changes against the one in use: nodes by name, every other key by its path."""

    nodes_added: tuple[str, ...] = ()
    nodes_removed: tuple[str, ...] = ()
    nodes_changed: tuple[str, ...] = ()  # the same name with another host, port, user, pool or labels
    moved: tuple[str, ...] = ()  # those of nodes_changed with another host, port or user
    keys: tuple[Loc, ...] = ()  # key paths outside `nodes`, as in the file: ("probes", "thresholds", "gpu_temp_fail")

    @property
    def empty(self) -> bool:
        return not (self.nodes_added or self.nodes_removed or self.nodes_changed or self.keys)

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(yamlfile.dotted(k) for k in self.keys)

    def touches(self, prefixes: Sequence[str]) -> bool:
        """Whether a changed key is one of `prefixes` (dotted) or under one."""
        return any(_under(name, p) for name in self.key_names for p in prefixes)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".") or name.startswith(prefix + "[")


_MISSING = object()


def _changed_keys(old: Any, new: Any, loc: Loc = ()) -> list[Loc]:
    """The paths where two dumped configs differ: into mappings key by key, a list or a value as a whole."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[Loc] = []
        for key in [*old, *(k for k in new if k not in old)]:
            out += _changed_keys(old.get(key, _MISSING), new.get(key, _MISSING), (*loc, key))
        return out
    return [] if old == new else [loc]


def _node_fields(node: Node) -> tuple[Any, ...]:
    return (node.host, node.port, node.user, node.pool, sorted(node.labels.items()))


def config_change(old: ClusterConfig, new: ClusterConfig) -> ConfigChange:
    """What `new` changes against `old` (pure): nodes added, removed and changed, and the other keys changed."""
    before = {n.name: n for n in old.node_list()}
    after = {n.name: n for n in new.node_list()}
    changed = [name for name in after if name in before and _node_fields(after[name]) != _node_fields(before[name])]
    moved = [name for name in changed if _node_fields(after[name])[:3] != _node_fields(before[name])[:3]]
    keys = _changed_keys(old.model_dump(mode="json", exclude={"nodes"}), new.model_dump(mode="json", exclude={"nodes"}))
    return ConfigChange(
        nodes_added=tuple(name for name in after if name not in before),
        nodes_removed=tuple(name for name in before if name not in after),
        nodes_changed=tuple(changed),
        moved=tuple(moved),
        keys=tuple(keys),
    )


def restart_problems(change: ConfigChange) -> list[tuple[Loc, str]]:
    """(key path, why) for each changed key that only a restart applies."""
    out = []
    for loc, name in zip(change.keys, change.key_names, strict=True):
        for prefix, why in RESTART_KEYS.items():
            if _under(name, prefix):
                out.append((loc, f"changing it needs a restart ({why}); {_AFTER_RESTART}"))
                break
    return out


def busy_problems(change: ConfigChange, new: ClusterConfig, held: Sequence[Run]) -> list[tuple[Loc, str]]:
    """(key path, why) for each node removed, or moved to another address, while runs hold GPUs there: their runs
    would be lost (a node that left the config) or read where they do not run; and for a new `scheduler.run_as`
    while any run does: runs are read as the account they were started as."""
    jobs: dict[str, set[int]] = {}
    for run in held:
        jobs.setdefault(run.node, set()).add(run.job)
    out: list[tuple[Loc, str]] = []
    if held and ("scheduler", "run_as") in change.keys:
        everyone = {run.job for run in held}
        out.append((("scheduler", "run_as"), f"changed while {_jobs(everyone)} run: their runs are read as the "
                    "account they were started as; let them end (or stop them), then reload"))  # fmt: skip
    for name in change.nodes_removed:
        if name in jobs:
            out.append((("nodes",), f"node {name} is removed but runs {_jobs(jobs[name])}: drain it (`ftconsole drain "
                        f"{name} --reason ...`), let its jobs end or stop them, then reload"))  # fmt: skip
    for name in change.moved:
        if name in jobs:
            out.append((_group_of(new, name, "host"), f"node {name} has another host, port or user but runs "
                        f"{_jobs(jobs[name])}: they are read where they were started; drain it, let its jobs end or "
                        "stop them, then reload"))  # fmt: skip
    return out


def _jobs(ids: set[int]) -> str:
    listed = sorted(ids)
    shown = ", ".join(map(str, listed[:10])) + (f" and {len(listed) - 10} more" if len(listed) > 10 else "")
    return f"job{'s' if len(listed) > 1 else ''} {shown}"


def _group_of(config: ClusterConfig, name: str, key: str) -> Loc:
    for i, group in enumerate(config.nodes):
        if name in expand_nodeset(group.name):
            return ("nodes", i, key)
    return ("nodes",)


@dataclass(frozen=True)
class ReloadResult:
    """The answer of a reload: applied (or nothing to apply), or refused with every problem, nothing changed."""

    file: str
    applied: bool
    change: ConfigChange = ConfigChange()
    problems: tuple[Problem, ...] = ()
    paused_s: float | None = None  # how long the control loop stood still for the change (None: it did not stop)

    def to_json(self) -> dict[str, Any]:
        c = self.change
        return {
            "file": self.file,
            "applied": self.applied,
            "changed": self.applied and not c.empty,
            "nodes_added": list(c.nodes_added),
            "nodes_removed": list(c.nodes_removed),
            "nodes_changed": list(c.nodes_changed),
            "keys_changed": list(c.key_names),
            "problems": [{"file": p.file, "line": p.line, "key": p.path, "message": p.message} for p in self.problems],
            "paused_s": None if self.paused_s is None else round(self.paused_s, 3),
        }


def reload_lines(doc: Mapping[str, Any]) -> list[str]:
    """A reload's answer (`ReloadResult.to_json`) as text: the first line says what happened, each next one what
    changed or why it was refused."""
    file = doc["file"]
    if not doc["applied"]:
        lines = [f"config not reloaded from {file}: nothing was changed"]
        for p in doc["problems"]:
            lines.append("  " + str(Problem(p["file"], p["line"], p["key"] or "", p["message"])))
        return lines
    if not doc["changed"]:
        return [f"config reloaded from {file}: nothing changed"]
    paused = doc.get("paused_s")
    lines = [
        f"config reloaded from {file}" + (f" (the control loop paused {paused:.2f} s)" if paused is not None else "")
    ]
    for key, text in (
        ("nodes_added", "nodes added (probed before they take jobs)"),
        ("nodes_removed", "nodes removed"),
        ("nodes_changed", "nodes changed"),
        ("keys_changed", "keys changed"),
    ):
        if doc[key]:
            lines.append(f"  {text}: {', '.join(doc[key])}")
    return lines


# ================================================================ applying it to a running scheduler


@dataclass
class _Asked:
    """A reload waiting for the loop to stop at the end of its tick."""

    loaded: LoadedConfig
    change: ConfigChange
    problems: Callable[[list[tuple[Loc, str]]], tuple[Problem, ...]]
    since: float = field(default_factory=time.monotonic)
    answer: asyncio.Future[ReloadResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Reloader:
    """The config in use by `serve` and the way to change it: `reload()` from the API or SIGHUP; `run()` drives
    the control loop, one term after another, a reload between two."""

    def __init__(
        self, loaded: LoadedConfig, service: ClusterService, ops: Any, make: Callable[[ClusterService], Scheduler]
    ) -> None:
        self.loaded = loaded
        self.service = service  # of the config in use: each new scheduler is made on it (`make`)
        self.ops = ops  # the API's `Operations`: `ops.scheduler` answers the requests
        self._make = make
        self._lock = asyncio.Lock()  # one reload at a time
        self._term: asyncio.Event | None = None  # set: the running loop stops at the end of its tick; None: none runs
        self._asked: _Asked | None = None
        self._tasks: set[asyncio.Task[ReloadResult]] = set()

    def current(self, scheduler: Scheduler, leadership: Any = None) -> Scheduler:
        """The scheduler a term of the loop runs (a loop runs once: each term has its own): `scheduler`, or a fresh
        one where its loop ran or the config changed since it was made (with two head nodes, `leadership.serve`
        makes each term's from the service it started with); it answers the API from now on."""
        if scheduler.service is not self.service or scheduler.loop.ran:
            scheduler = self._successor(scheduler)
        if leadership is not None:
            scheduler.loop.executor.may_act = leadership.leading
        self.ops.scheduler = scheduler
        return scheduler

    # -- asking -----------------------------------------------------------------------------------------------

    async def reload(self, by: str) -> ReloadResult:
        """Read the config file again and apply it (see the module's docstring). A caller that goes away does not
        stop a reload half way: it finishes, and the next waits for it."""
        task = asyncio.ensure_future(self._reload_once(by))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _reload_once(self, by: str) -> ReloadResult:
        async with self._lock:
            try:
                result = await self._reload()
            except Exception as exc:  # a bug of ours, or the store gone: said to the one who asked, nothing changed
                log.exception("reload failed")
                problem = Problem(str(self.loaded.file), None, "", f"the reload failed: {type(exc).__name__}: {exc}")
                result = ReloadResult(str(self.loaded.file), applied=False, problems=(problem,))
        text = "; ".join(line.strip() for line in reload_lines(result.to_json()))
        if result.applied:
            log.info("%s (asked by %s)", text, by)
        else:
            log.error("%s (asked by %s)", text, by)
        return result

    async def _reload(self) -> ReloadResult:
        path = self.loaded.file
        try:
            new = load_config(path)
        except ConfigError as exc:
            return ReloadResult(str(path), applied=False, problems=tuple(exc.problems))
        change = config_change(self.loaded.cluster, new.cluster)
        problems = _problems_of(new)
        found = restart_problems(change)
        if change.nodes_removed or change.moved or BUSY_KEYS & set(change.keys):
            found += busy_problems(change, new.cluster, await self.service.store.runs(held=True))
        if found:
            return ReloadResult(str(path), applied=False, change=change, problems=problems(found))
        if change.empty:
            return ReloadResult(str(path), applied=True, change=change)
        if self._term is None:  # no loop runs here (a standby): the next term starts with the new config
            self._apply(new, change)
            return ReloadResult(str(path), applied=True, change=change)
        asked = self._asked = _Asked(new, change, problems)
        self._term.set()
        return await asked.answer

    # -- the loop, term after term ----------------------------------------------------------------------------

    async def run(
        self,
        scheduler: Scheduler,
        stop: asyncio.Event,
        *,
        probe: bool = True,
        leadership: Any = None,
        restart_outward: Callable[[LoadedConfig], Awaitable[None]] | None = None,
    ) -> None:
        """Drive the loop until `stop`. A reload ends its term at the end of a tick; the new config is applied
        (or refused, where a removed node took a job meanwhile) and a new term starts at once."""
        scheduler = self.current(scheduler, leadership)
        while True:
            term = self._term = asyncio.Event()
            relay = asyncio.ensure_future(_relay(stop, term))
            try:
                await scheduler.run(term, probe=probe)
            except BaseException:
                self._term = None
                self._refuse_asked("the scheduler stopped before the new config was applied")
                raise
            finally:
                relay.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await relay
            self._term = None
            asked, self._asked = self._asked, None
            if asked is not None:
                await self._switch(asked, None if stop.is_set() else restart_outward)
            if stop.is_set():
                return
            scheduler = self.current(self.ops.scheduler, leadership)  # the new config's, else a fresh one

    async def _switch(self, asked: _Asked, restart_outward: Callable[[LoadedConfig], Awaitable[None]] | None) -> None:
        """With the loop stopped: the node check again (a job may have been placed on a removed node since it was
        asked), then the new config in place; the answer says how long the loop stood still."""
        try:
            change = asked.change
            found = busy_problems(change, asked.loaded.cluster, await self.service.store.runs(held=True))
            if found:
                result = ReloadResult(
                    str(asked.loaded.file), applied=False, change=change, problems=asked.problems(found)
                )
            else:
                self._apply(asked.loaded, change)
                if restart_outward is not None and change.touches(OUTWARD_KEYS):
                    try:
                        await restart_outward(asked.loaded)
                    except Exception:  # the new config is in use all the same: say what does not run
                        log.exception("notifications: cannot start them with the new config")
                paused = time.monotonic() - asked.since
                result = ReloadResult(str(asked.loaded.file), applied=True, change=change, paused_s=paused)
        except Exception as exc:  # a bug of ours: say so to the one who asked, and go on with what is in use
            log.exception("reload failed")
            problem = Problem(str(asked.loaded.file), None, "", f"the reload failed: {type(exc).__name__}: {exc}")
            result = ReloadResult(str(asked.loaded.file), applied=False, change=asked.change, problems=(problem,))
        if not asked.answer.done():
            asked.answer.set_result(result)

    def _apply(self, loaded: LoadedConfig, change: ConfigChange) -> None:
        """The new config in use: a service on it (same store and SSH connections), a scheduler on that answering the
        API. The connections of nodes removed or moved are dropped (a moved one's would reach its old address)."""
        forget = getattr(self.service.transport, "forget", None)
        if forget is not None:
            for name in (*change.nodes_removed, *change.moved):
                forget(name)
        self.loaded, self.service = loaded, self.service.reconfigured(loaded)
        self.ops.scheduler = self._successor(self.ops.scheduler)

    def _successor(self, old: Scheduler) -> Scheduler:
        """A new scheduler on the service in use, which takes over what outlives a term (the steps followed now)."""
        new = self._make(self.service)
        new.steps_book = old.steps_book
        return new

    def _refuse_asked(self, why: str) -> None:
        asked, self._asked = self._asked, None
        if asked is not None and not asked.answer.done():
            problem = Problem(str(asked.loaded.file), None, "", why)
            asked.answer.set_result(ReloadResult(str(asked.loaded.file), applied=False, change=asked.change,
                                                 problems=(problem,)))  # fmt: skip


def _problems_of(loaded: LoadedConfig) -> Callable[[list[tuple[Loc, str]]], tuple[Problem, ...]]:
    """(key path, why) pairs -> Problems with the file and, where the file says, the line (read again for its
    lines: best effort, the file may have changed meanwhile)."""
    file = str(loaded.file)
    try:
        _, marks, _ = yamlfile.load_all(loaded.file)
    except ConfigError:
        marks = {}

    def problems(found: list[tuple[Loc, str]]) -> tuple[Problem, ...]:
        return tuple(Problem(file, yamlfile.line_of(marks, loc), yamlfile.dotted(loc), why) for loc, why in found)

    return problems


async def _relay(stop: asyncio.Event, term: asyncio.Event) -> None:
    await stop.wait()
    term.set()
