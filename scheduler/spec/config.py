"""The cluster config: a YAML file validated with pydantic; unknown keys are errors.

Every problem names the file, the key path and the line. `load_config` raises `ConfigError` with all the
problems it found at once; `ftconsole config check` prints them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ftconsole.scheduler.errors import ConfigError, Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.containers import ContainerSettings, PoolContainers
from ftconsole.scheduler.spec.nodesets import expand_nodeset
from ftconsole.scheduler.spec.nodetestspec import NodeTests as NodeTests

# the outward channels (metrics, notify, alertmanager) live in spec/outward.py; callers import them from here
from ftconsole.scheduler.spec.outward import AlertmanagerSettings as AlertmanagerSettings
from ftconsole.scheduler.spec.outward import MetricsSettings as MetricsSettings
from ftconsole.scheduler.spec.outward import NotifySettings as NotifySettings
from ftconsole.scheduler.spec.outward import parse_listen as parse_listen
from ftconsole.scheduler.spec.repairspec import RepairSettings as RepairSettings

# what teams sharing the cluster set (fair share, quotas) lives in spec/sharingspec.py; callers import it from here
from ftconsole.scheduler.spec.sharingspec import FairShare as FairShare
from ftconsole.scheduler.spec.sharingspec import QuotaLimits as QuotaLimits
from ftconsole.scheduler.spec.sharingspec import QuotaSettings as QuotaSettings
from ftconsole.scheduler.spec.sharingspec import UserLimits as UserLimits

# the value types live in spec/values.py; the config's callers import them from here as before
from ftconsole.scheduler.spec.statespec import LEASE_S as LEASE_S
from ftconsole.scheduler.spec.statespec import StateSettings as StateSettings
from ftconsole.scheduler.spec.thresholds import WARN_FAIL, warn_fail_problem
from ftconsole.scheduler.spec.thresholds import PartialThresholds as PartialThresholds
from ftconsole.scheduler.spec.thresholds import Thresholds as Thresholds
from ftconsole.scheduler.spec.topologyspec import TopologySettings, tree_problems
from ftconsole.scheduler.spec.values import Duration as Duration
from ftconsole.scheduler.spec.values import OutputLimit as OutputLimit
from ftconsole.scheduler.spec.values import PositiveDuration as PositiveDuration
from ftconsole.scheduler.spec.values import RetentionDuration as RetentionDuration
from ftconsole.scheduler.spec.values import check_address as check_address
from ftconsole.scheduler.spec.values import check_no_user
from ftconsole.scheduler.spec.values import format_duration as format_duration
from ftconsole.scheduler.spec.values import parse_duration as parse_duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Loc = tuple[Any, ...]  # a key path: (key, key, index, ...)


DEFAULT_CONFIG_PATHS = (
    "./ftconsole.yaml",
    "~/.config/ftconsole/cluster.yaml",
    "/etc/ftconsole/cluster.yaml",
)


class SSHSettings(_Strict):
    user: str | None = None  # default: ~/.ssh/config's User, else the local user
    port: int | None = Field(None, ge=1, le=65535)  # default: ~/.ssh/config's Port, else 22
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    config_file: str | None = "~/.ssh/config"
    connect_timeout: PositiveDuration = 10.0
    command_timeout: PositiveDuration = 60.0
    keepalive_interval: Duration = 15.0
    max_parallel: int = Field(64, ge=1, le=4096)
    python: str = "python3"


class ProbeSettings(_Strict):
    interval: Duration = 60.0
    timeout: Duration = 30.0
    cache_dir: str = "/cache"
    dns_names: list[str] = []
    recover_after: int = Field(2, ge=1, le=100)
    thresholds: Thresholds = Thresholds()
    # an isolated node whose last N probes in a row passed every check is resumed by the scheduler; None: only
    # an operator's `ftconsole resume` lifts an isolation
    isolation_recover_after: int | None = Field(None, ge=1, le=1000)
    # a node with at least flaky_faults faults within flaky_window is flaky: an alert, a mark, no auto-resume
    flaky_faults: int = Field(3, ge=1, le=1000)
    flaky_window: PositiveDuration = 24 * 3600.0
    # an idle node in service runs its node tests (node_tests) this often, when nothing is queued; None: never
    burn_in_interval: PositiveDuration | None = None


class PoolSettings(_Strict):
    description: str = ""
    schedule_degraded: bool = False
    thresholds: PartialThresholds = PartialThresholds()
    containers: PoolContainers | None = None  # its own container runtime (else the cluster's containers.runtime)
    node_tests: NodeTests | None = None  # its own node tests, in place of the cluster's node_tests (issue 42)


class NodeSpecSettings(_Strict):
    """A named node spec that jobs ask for with `spec:` / `specs:` (seed 003)."""

    gpus_per_node: int = Field(ge=1, le=64)
    gpu_model: str | None = None
    pool: str | None = None
    description: str = ""


class SchedulerSettings(_Strict):
    """The control loop and how runs are started and stopped on nodes."""

    tick: PositiveDuration = 2.0  # how often run states are read and queued jobs placed
    stop_grace: Duration = 30.0  # SIGTERM to a run's process group, then SIGKILL after this (seed 003)
    # a node the loop waits this long for (its run reads, starts and stops unanswered) is given up: its runs
    # are lost and their jobs end (docs/configuration.md says why 10 s)
    node_timeout: PositiveDuration = 10.0
    # the folders of ended runs are removed from the nodes this long after they ended; 0 or off: kept forever
    run_retention: RetentionDuration = 3 * 86400.0
    # run folders on the nodes: <run_root>/<cluster id>/<job>/<attempt>/<rank>; "~" is the home of the account
    # a job runs as, "{user}" its name
    run_root: str = "~/.ftconsole/runs"
    # whom a job's processes run as on the nodes: the account named like the user who submitted it (the
    # SSH account switches to it: as root, or through sudo), or the SSH account itself (single-user clusters)
    run_as: Literal["submitter", "ssh_user"] = "submitter"
    # run_as: ssh_user with api.group set and a root SSH account lets every member of that group run commands
    # as root on every node: refused unless this states that it is meant
    accept_group_as_root: bool = False
    urgent_cap: int | None = Field(None, ge=0)  # urgent jobs (running + queued) per project; None: no cap
    # how much non-admins may add to a job's max_runtime with `extend`, in all (docs/configuration.md)
    max_extend: Duration = 24 * 3600.0
    # a job queued again after a hardware fault that waits longer than this ends `error` (seed 000: 30 minutes)
    queue_timeout: PositiveDuration = 30 * 60.0
    # one long-lived supervisor per node and user answers the loop's commands and pushes a rank's exit at once
    # (docs/configuration.md, "Node channels"); off: a Python start on the node per command, as before
    node_channel: bool = True
    # within a priority level, jobs of projects and users under their share first (absent: first come, first
    # served); docs/configuration.md, "Fair share"
    fairshare: FairShare | None = None
    # a preemptible job runs at least this long before a job of a higher level may preempt it (docs/jobs.md)
    preempt_min_runtime: Duration = 10 * 60.0
    # how many queued jobs each placement pass considers, in queue order, past those a quota, an array's limit or a
    # dependency holds back (Slurm's default_queue_depth); the others wait for a later pass (docs/configuration.md)
    queue_depth: int = Field(500, ge=1, le=100_000)
    # the most each rank's output.log keeps on its node (its oldest output is dropped past it), for jobs that do not
    # set their own output_limit; a job may ask for less, only an admin's for more; 0 or off: no limit (docs/jobs.md)
    output_limit: OutputLimit = 1 << 30
    # allocations (`ftconsole alloc`) end once idle this long, unless they ask for their own: no step running, no
    # typing in a shell of theirs, their GPUs under idle_util_pct (docs/jobs.md, "Idle allocations"); 0 or off: never
    idle_timeout: RetentionDuration = 0.0
    # the longest idle_timeout a job may ask for (an allocation without one gets it where idle_timeout is off), and
    # allocations may not turn it off; 0 or off: no bound
    max_idle_timeout: RetentionDuration = 0.0
    idle_util_pct: float = Field(10.0, ge=0, le=100)  # a GPU at or over this utilisation is at work
    # how long before an idle allocation ends its user is warned (a line in its shells, an alert, an event)
    idle_warning: Duration = 5 * 60.0

    @model_validator(mode="after")
    def _idle_within_max(self) -> SchedulerSettings:
        if self.max_idle_timeout and self.idle_timeout > self.max_idle_timeout:
            idle, most = format_duration(self.idle_timeout), format_duration(self.max_idle_timeout)
            raise ValueError(f"idle_timeout ({idle}) is over max_idle_timeout ({most})")
        return self


class DebugSettings(_Strict):
    """The kept debugging environment (seed 003): after a job fails, its last attempt's run folders stay on its
    nodes at least this long (a job's own `debug.retention`, at most `max_retention`), and with the job's
    `debug.hold_nodes` its GPUs stay held for that time, at most `max_hold` (0: no job may hold any)."""

    retention: PositiveDuration = 4 * 3600.0
    max_retention: PositiveDuration = 7 * 86400.0
    max_hold: Duration = 4 * 3600.0

    @model_validator(mode="after")
    def _retention_within_max(self) -> DebugSettings:
        if self.retention > self.max_retention:
            raise ValueError(
                f"retention ({format_duration(self.retention)}) is over max_retention "
                f"({format_duration(self.max_retention)})"
            )
        return self


class HistorySettings(_Strict):
    """How long the store keeps what has ended, like Slurm's PurgeJobAfter and PurgeEventAfter: older records are
    pruned in small batches while `serve` runs (docs/operations.md, "History"); 0 or off: kept for ever. Usage and
    goodput keep their per-day sums, so reports over any span still work."""

    # ended jobs, with their attempts, runs, evidence, events and alerts, this long after they ended
    jobs: RetentionDuration = 365 * 86400.0
    # node events and resolved node alerts, this long after they happened
    events: RetentionDuration = 365 * 86400.0


def _data_root(value: str) -> str:
    if "\0" in value or not (value.startswith("/") or value.startswith("~/")) or ".." in value.split("/"):
        raise ValueError(f"{value!r}: give an absolute folder (as /local) or one starting with ~/, without '..'")
    if value.rstrip("/") in ("", "~"):
        raise ValueError(f"{value!r} is the whole file system or a home folder: name the node-local storage itself")
    return value.rstrip("/")


class DataPrepSettings(_Strict):
    """Data preparation (seed 003, docs/jobs.md): the node-local fast storage that jobs' `data_prep` may copy data
    sets into (none: no job may), and how long a prepared data set is kept after its last use (0 or off: until
    removed by hand); see `scheduler.spec.dataprep`."""

    roots: list[Annotated[str, AfterValidator(_data_root)]] = []
    retention: RetentionDuration = 7 * 86400.0
    # how long a rank waits for another data_prep's copy of the same folder (its lock), then fails saying who
    # holds it; on a shared home the other nodes' ranks wait for one copy: give it the time your largest copy takes
    lock_wait: PositiveDuration = 3600.0


class ApiSettings(_Strict):
    """The local API socket that `ftconsole serve` (or the console) serves and the CLI calls."""

    socket: str | None = None  # default: <state_dir>/ftconsole.sock
    group: str | None = None  # group that may connect (mode 0660); default: the scheduler's own group


class NodeGroup(_Strict):
    name: str
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    pool: str = "default"
    labels: dict[str, str] = {}

    @field_validator("host")
    @classmethod
    def _addresses(cls, host: str | None) -> str | None:
        if host is not None:
            for address in expand_nodeset(check_no_user(host)):  # '@' first: a node set reads it as a group
                check_address(address)
        return host

    @model_validator(mode="after")
    def _expressions(self) -> NodeGroup:
        if self.host is None:
            check_no_user(self.name, "name")
        names = expand_nodeset(self.name)
        if self.host is None:  # the name is the address
            for name in names:
                check_address(name, key="name (the address when no host is given)")
        if self.host is not None:
            hosts = expand_nodeset(self.host)
            if len(hosts) != len(names):
                raise ValueError(
                    f"host expands to {len(hosts)} host(s) but name expands to {len(names)} node(s); "
                    "they are paired in order, so the counts must match"
                )
        return self


def _local_user() -> str:
    """Whom ssh logs in as when no user is configured (short of ~/.ssh/config's User): the local user."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _few(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


@dataclass(frozen=True)
class Node:
    """One node of the cluster, with its group's settings resolved."""

    name: str
    host: str
    port: int | None
    user: str | None
    pool: str
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


class ProjectSettings(_Strict):
    """A project jobs may name (`project:`): who may submit to it; the urgent cap counts per project."""

    members: list[str] | None = None  # None: any user


class ClusterConfig(_Strict):
    state_dir: str = "~/.local/state/ftconsole"
    state: StateSettings | None = None  # the store on PostgreSQL; None: SQLite in state_dir
    ssh: SSHSettings = SSHSettings()
    nodes: list[NodeGroup] = []
    pools: dict[str, PoolSettings] = {}
    admins: list[str] = []
    # declared projects; without any, a job's project is a label: the urgent cap, fair share and quotas count per
    # user, and nothing is kept for a project (issue 40)
    projects: dict[str, ProjectSettings] = {}
    # limits per project and per user (absent: none; given, a user's queued jobs are 10,000 unless set otherwise)
    quotas: QuotaSettings | None = None
    specs: dict[str, NodeSpecSettings] = {}
    probes: ProbeSettings = ProbeSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    api: ApiSettings = ApiSettings()
    metrics: MetricsSettings | None = None  # Prometheus endpoint of `serve`; None: off
    notify: NotifySettings = NotifySettings()  # where new alerts are sent; no target: nowhere
    alertmanager: AlertmanagerSettings | None = None  # a Prometheus Alertmanager kept in sync with the alerts
    debug: DebugSettings = DebugSettings()  # how long a failed job's environment is kept (seed 003)
    history: HistorySettings = HistorySettings()  # how long ended jobs and old events are kept in the store
    data_prep: DataPrepSettings = DataPrepSettings()  # node-local storage for jobs' data sets (seed 003)
    containers: ContainerSettings = ContainerSettings()  # the runtime jobs with `image` run in (issue 17)
    node_tests: NodeTests = NodeTests()  # what a node passes under load before it returns to service (issue 42)
    repair: RepairSettings = RepairSettings()  # how an isolated node is brought back: reset, reboot, test
    topology: TopologySettings | None = None  # the switches the nodes hang under; placement uses the fewest

    def cross_problems(self, groups: Sequence[tuple[int, NodeGroup]] | None = None) -> list[tuple[Loc, str]]:
        """Problems that span several keys, as (key path, message); pydantic checks each key alone. `groups`: the
        node groups with their places in the file, where some are left out (invalid); default: all of them."""
        out: list[tuple[Loc, str]] = []
        seen: dict[str, int] = {}
        for i, group in enumerate(self.nodes) if groups is None else groups:
            for name in expand_nodeset(group.name):
                if name in seen:
                    out.append((("nodes", i, "name"), f"node {name} is already defined in nodes[{seen[name]}]"))
                else:
                    seen[name] = i
            if self.pools and group.pool not in self.pools:
                out.append(
                    (
                        ("nodes", i, "pool"),
                        f"pool {group.pool!r} is not defined under pools (defined: {', '.join(sorted(self.pools))})",
                    )
                )
        for name, spec in self.specs.items():
            if spec.pool is not None and self.pools and spec.pool not in self.pools:
                out.append((("specs", name, "pool"), f"pool {spec.pool!r} is not defined under pools"))
        for admin in self.admins:
            if not admin or any(c.isspace() for c in admin):
                out.append((("admins",), f"invalid user name {admin!r}"))
        return (
            out + self._threshold_problems() + self._project_problems() + self._run_as_problems()
            + self._history_problems() + self._node_test_problems() + tree_problems(self.topology, seen)
        )  # fmt: skip

    def _node_test_problems(self) -> list[tuple[Loc, str]]:
        tested = self.node_tests.any or any(p.node_tests is not None and p.node_tests.any for p in self.pools.values())
        if self.probes.burn_in_interval is not None and not tested:
            return [(("probes", "burn_in_interval"), "burn-in runs the node tests: name one under node_tests")]
        return []

    def _history_problems(self) -> list[tuple[Loc, str]]:
        """history.jobs keeps the jobs that the quotas' GPU-hours and the kept debugging environments still need."""
        keep = self.history.jobs
        if not keep:
            return []
        out: list[tuple[Loc, str]] = []
        if self.quotas is not None and keep < self.quotas.period:
            out.append((("history", "jobs"), f"{format_duration(keep)} is shorter than quotas.period "
                        f"({format_duration(self.quotas.period)}): the GPU-hours quotas count over it would forget "
                        "the jobs pruned before it ends"))  # fmt: skip
        if keep < self.debug.max_retention:
            out.append((("history", "jobs"), f"{format_duration(keep)} is shorter than debug.max_retention "
                        f"({format_duration(self.debug.max_retention)}): a failed job would leave the store while its "
                        "debugging environment is kept"))  # fmt: skip
        return out

    def _threshold_problems(self) -> list[tuple[Loc, str]]:
        """A pool's thresholds over the cluster's: each warn level still below its fail level (the models check
        each part alone)."""
        out: list[tuple[Loc, str]] = []
        for name, pool in self.pools.items():
            given = pool.thresholds.model_dump(exclude_none=True)
            merged = self.thresholds_for(name).model_dump()
            for warn, fail in WARN_FAIL:
                if warn_fail_problem(merged, fail) is None or (warn in given) == (fail in given):  # both: the model's
                    continue
                mine, other, side = (warn, fail, "below") if warn in given else (fail, warn, "above")
                out.append((("pools", name, "thresholds", mine),
                            f"this pool's {mine} ({merged[mine]:g}) is not {side} probes.thresholds.{other} "
                            f"({merged[other]:g}): a node warns before it fails"))  # fmt: skip
        return out

    def _project_problems(self) -> list[tuple[Loc, str]]:
        """Fair-share shares and project quotas name declared projects only; without any declared, they are
        refused: keyed on a label anyone may write, they would hold no one (issue 40)."""
        fair = self.scheduler.fairshare
        named: list[tuple[str, ...]] = []
        named += [("scheduler", "fairshare", "shares", n) for n in sorted(fair.shares)] if fair is not None else []
        named += [("quotas", "projects", n) for n in sorted(self.quotas.projects)] if self.quotas is not None else []
        if self.projects:
            undeclared = [w for w in named if w[-1] not in self.projects]
            return [(w, f"project {w[-1]!r} is not declared under projects") for w in undeclared]
        if self.quotas is not None and self.quotas.default_project is not None:
            named.append(("quotas", "default_project"))
        why = ("no projects are declared (projects:): a job's project is then a label anyone may write, and fair share "
               "and quotas count per user; declare the projects, or leave this out")  # fmt: skip
        return [(where, why) for where in named]

    def _run_as_problems(self) -> list[tuple[Loc, str]]:
        s = self.scheduler
        if s.run_as == "submitter":
            if not (s.run_root.startswith("~/") or "{user}" in s.run_root):
                return [
                    (
                        ("scheduler", "run_root"),
                        f"{s.run_root!r} would be one folder for the runs of every user, and jobs run as their "
                        "submitter (scheduler.run_as: submitter): start it with '~/' (each user's home) or put "
                        "'{user}' in it (for example /scratch/{user}/ftconsole-runs)",
                    )
                ]
            return []
        root = sorted({n.name for n in self.node_list() if (n.user or _local_user()) == "root"})
        if self.api.group is None or not root or s.accept_group_as_root:
            return []
        return [
            (
                ("scheduler", "run_as"),
                f"run_as: ssh_user runs every job as the SSH account, which is root on {_few(root)}, and api.group "
                f"{self.api.group!r} lets its members submit: any member of that group could run commands as root "
                "on every node. Use run_as: submitter (jobs run as the user who submitted them), or set "
                "scheduler.accept_group_as_root: true to state that this is meant",
            )
        ]

    # -- derived views -------------------------------------------------------------------------------------

    def node_list(self) -> list[Node]:
        out = []
        for group in self.nodes:
            names = expand_nodeset(group.name)
            hosts = expand_nodeset(group.host) if group.host is not None else names
            for name, host in zip(names, hosts, strict=True):
                out.append(
                    Node(
                        name=name,
                        host=host,
                        port=group.port or self.ssh.port,
                        user=group.user or self.ssh.user,
                        pool=group.pool,
                        labels=dict(group.labels),
                    )
                )
        return out

    def runtime_for(self, pool: str) -> str:
        """The container runtime of a pool's nodes: the pool's own, else `containers.runtime` (auto: any)."""
        settings = self.pools.get(pool)
        own = settings.containers if settings is not None else None
        return own.runtime if own is not None else self.containers.runtime

    def node_tests_for(self, pool: str) -> NodeTests:
        """The node tests of a pool's nodes: the pool's own (as a whole), else `node_tests`."""
        settings = self.pools.get(pool)
        own = settings.node_tests if settings is not None else None
        return own if own is not None else self.node_tests

    def thresholds_for(self, pool: str) -> Thresholds:
        base = self.probes.thresholds
        settings = self.pools.get(pool)
        if settings is None:
            return base
        overrides = settings.thresholds.model_dump(exclude_none=True)
        return base.model_copy(update=overrides)


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and the file it came from (relative paths in it are relative to that file)."""

    cluster: ClusterConfig
    file: Path

    def resolve(self, value: str | None) -> Path | None:
        if value is None:
            return None
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (self.file.parent / p)

    @property
    def state_dir(self) -> Path:
        resolved = self.resolve(self.cluster.state_dir)
        assert resolved is not None
        return resolved

    @property
    def socket_path(self) -> Path:
        return self.resolve(self.cluster.api.socket) or self.state_dir / "ftconsole.sock"


def find_config(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("FTCONSOLE_CONFIG")
    if env:
        return Path(env)
    for candidate in DEFAULT_CONFIG_PATHS:
        p = Path(os.path.expanduser(candidate))
        if p.is_file():
            return p
    raise ConfigError(
        [
            Problem(
                "<config>",
                None,
                "",
                "no cluster config found: pass --config FILE, set FTCONSOLE_CONFIG, or create one of "
                + ", ".join(DEFAULT_CONFIG_PATHS)
                + " (`ftconsole config example` prints an annotated one); for the local lab cluster run "
                "`ftconsole lab up`",
            )
        ]
    )


def _alone(key: str, value: Any) -> Any:
    """The value of top-level `key` validated alone; a section's (a model's) without its faulted keys, where that
    is all that is wrong with it. ValidationError where it does not validate."""
    try:
        return getattr(ClusterConfig.model_validate({key: value}), key)
    except ValidationError as exc:
        faulted = {err["loc"][1] for err in exc.errors() if len(err["loc"]) > 1}
        section = isinstance(ClusterConfig.model_fields[key].default, BaseModel)  # not a map of named entries
        if not section or not faulted or not isinstance(value, Mapping):
            raise
        rest = {k: v for k, v in value.items() if k not in faulted}
        return getattr(ClusterConfig.model_validate({key: rest}), key)


def _salvage(data: Any) -> tuple[ClusterConfig, list[tuple[int, NodeGroup]]]:
    """What of an invalid config validates: each top-level key that does alone (the others at their defaults; a
    section less its faulted keys), and the node groups that do, with their places in the file; so that the checks
    across keys, and `config check`'s of this host, still run: every problem is reported in one run."""
    fields: dict[str, Any] = {}
    groups: list[tuple[int, NodeGroup]] = []
    for key, value in data.items() if isinstance(data, Mapping) else ():
        if key == "nodes" and isinstance(value, list):
            for i, item in enumerate(value):
                with contextlib.suppress(ValidationError):
                    groups.append((i, NodeGroup.model_validate(item)))
            fields["nodes"] = [group for _, group in groups]
        elif isinstance(key, str) and key in ClusterConfig.model_fields:
            with contextlib.suppress(ValidationError):
                fields[key] = _alone(key, value)
    try:
        return ClusterConfig.model_validate(fields), groups
    except ValidationError:  # keys that hold alone and not together: the checks across keys see the defaults
        return ClusterConfig(), []


def config_problems(
    data: Any, marks: yamlfile.Marks, file: str
) -> tuple[ClusterConfig | None, ClusterConfig, list[Problem]]:
    """Validate a config's data: (the config, or None when invalid; what of it validates, for checks that go on;
    every problem of its keys and across its keys, in the order of their lines)."""
    try:
        cluster: ClusterConfig | None = yamlfile.validate(ClusterConfig, data, file, marks)
        problems: list[Problem] = []
    except ConfigError as exc:
        cluster, problems = None, exc.problems
    if cluster is not None:
        best, groups = cluster, list(enumerate(cluster.nodes))
    elif isinstance(data, Mapping):
        best, groups = _salvage(yamlfile.empty_as_default(ClusterConfig, data))
    else:
        best, groups = ClusterConfig(), []
    faulted = {p.path for p in problems}
    for loc, msg in best.cross_problems(groups):
        if yamlfile.dotted(loc) not in faulted:
            problems.append(Problem(file, yamlfile.line_of(marks, loc), yamlfile.dotted(loc), msg))
    return (cluster if not problems else None), best, sort_problems(problems)


def sort_problems(problems: list[Problem]) -> list[Problem]:
    """By line (those without one first: the file's own), each once."""
    return sorted(dict.fromkeys(problems), key=lambda p: (p.line or 0, p.path))


def load_config(path: Path) -> LoadedConfig:
    """The config at `path`; ConfigError with every problem of its YAML, its keys and across its keys, at once.
    What this host has (its groups, files and folders) is `config check`'s (spec/configcheck.py): a config that
    points at files not made yet still loads."""
    data, marks, problems = yamlfile.load_all(path)
    cluster, _, more = config_problems(data, marks, str(path))
    if problems or cluster is None:
        raise ConfigError(merge_problems(problems, more))
    return LoadedConfig(cluster=cluster, file=path.resolve())


def merge_problems(first: list[Problem], then: list[Problem]) -> list[Problem]:
    """`first` (the YAML's own: a duplicate key, a bad value) and those of `then` about other keys, by line."""
    keys = [p.path for p in first if p.path]
    inside = tuple(k + "." for k in keys) + tuple(k + "[" for k in keys)
    return sort_problems(first + [p for p in then if p.path not in keys and not p.path.startswith(inside)])
