"""The cluster config: a YAML file validated with pydantic; unknown keys are errors.

Every problem names the file, the key path and the line. `load_config` raises `ConfigError` with all the
problems it found at once; `ftconsole config check` prints them.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ftconsole.scheduler.errors import ConfigError, Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.containers import ContainerSettings, PoolContainers
from ftconsole.scheduler.spec.nodesets import expand_nodeset

# what teams sharing the cluster set (fair share, quotas) lives in spec/sharingspec.py; callers import it from here
from ftconsole.scheduler.spec.sharingspec import FairShare as FairShare
from ftconsole.scheduler.spec.sharingspec import QuotaLimits as QuotaLimits
from ftconsole.scheduler.spec.sharingspec import QuotaSettings as QuotaSettings
from ftconsole.scheduler.spec.sharingspec import UserLimits as UserLimits

# the value types live in spec/values.py; the config's callers import them from here as before
from ftconsole.scheduler.spec.statespec import LEASE_S as LEASE_S
from ftconsole.scheduler.spec.statespec import StateSettings as StateSettings
from ftconsole.scheduler.spec.values import Duration as Duration
from ftconsole.scheduler.spec.values import PositiveDuration as PositiveDuration
from ftconsole.scheduler.spec.values import RetentionDuration as RetentionDuration
from ftconsole.scheduler.spec.values import check_address as check_address
from ftconsole.scheduler.spec.values import format_duration as format_duration
from ftconsole.scheduler.spec.values import parse_duration as parse_duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class Thresholds(_Strict):
    """Pass conditions of the checks; defaults are seed 000's."""

    disk_root_gb: float = 32.0
    disk_shm_gb: float = 1.0
    disk_cache_gb: float = 32.0
    ulimit_memlock_kb: int = 16000
    ulimit_nofile: int = 1_000_000
    ulimit_stack_kb: int = 8000
    ulimit_nproc: int = 1_000_000
    gpus_expected: int | None = Field(None, ge=0)
    gpu_temp_warn_c: float = 85.0
    gpu_temp_fail_c: float = 95.0
    mem_available_warn_pct: float = 5.0
    load_warn_per_cpu: float = 2.0


class PartialThresholds(_Strict):
    """Per-pool overrides: only the keys given replace the cluster-wide values."""

    disk_root_gb: float | None = None
    disk_shm_gb: float | None = None
    disk_cache_gb: float | None = None
    ulimit_memlock_kb: int | None = None
    ulimit_nofile: int | None = None
    ulimit_stack_kb: int | None = None
    ulimit_nproc: int | None = None
    gpus_expected: int | None = Field(None, ge=0)
    gpu_temp_warn_c: float | None = None
    gpu_temp_fail_c: float | None = None
    mem_available_warn_pct: float | None = None
    load_warn_per_cpu: float | None = None


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


class PoolSettings(_Strict):
    description: str = ""
    schedule_degraded: bool = False
    thresholds: PartialThresholds = PartialThresholds()
    containers: PoolContainers | None = None  # its own container runtime (else the cluster's containers.runtime)


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


_HOST_NAME = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?:\.(?!-)[A-Za-z0-9-]{1,63})*\.?$")


def parse_listen(value: Any) -> tuple[str, int]:
    """'127.0.0.1:9464', '[::1]:9464' or 'localhost:9464' -> (host, port); ValueError saying what is wrong."""
    hint = "give HOST:PORT, such as 127.0.0.1:9464, [::1]:9464 or 0.0.0.0:9464 (every interface)"
    if not isinstance(value, str):
        raise ValueError(f"{hint}, not {value!r}")
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{hint}, not {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in {value!r} is not an IPv6 address; {hint}") from None
    elif ":" in host:
        raise ValueError(f"{value!r}: put an IPv6 address in brackets, as in [::1]:9464")
    elif not _HOST_NAME.match(host) or (host.replace(".", "").isdigit() and not _ipv4(host)):
        raise ValueError(f"{host!r} in {value!r} is not a host name or IP address; {hint}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} in {value!r} is not a number from 1 to 65535")
    return host, int(port)


def _ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


class MetricsSettings(_Strict):
    """The Prometheus endpoint of `ftconsole serve`: http://<listen>/metrics (docs/operations.md, Metrics)."""

    listen: str  # HOST:PORT to serve on; the metrics section absent: no endpoint

    @field_validator("listen", mode="before")
    @classmethod
    def _listen(cls, value: Any) -> str:
        parse_listen(value)
        return str(value).strip()

    @property
    def address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


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
            for address in expand_nodeset(host):
                check_address(address)
        return host

    @model_validator(mode="after")
    def _expressions(self) -> NodeGroup:
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


def _webhook_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https"):
        got = f"a {parts.scheme!r} URL" if parts.scheme else "no URL scheme"
        raise ValueError(f"the webhook must be an http:// or https:// URL, got {got}")
    if not parts.hostname:
        raise ValueError("the webhook URL names no host (as in https://hooks.example.com/...)")
    return url.strip()


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # a Prometheus label name


class AlertmanagerSettings(_Strict):
    """A Prometheus Alertmanager kept in sync with the alerts (docs/operations.md, Notifications)."""

    url: Annotated[str, AfterValidator(_webhook_url)]  # its base URL, e.g. http://alertmanager:9093
    interval: PositiveDuration = 60.0  # every alert still open is sent again this often (within 2 s of a change)
    labels: dict[str, str] = {}  # added to every alert's labels (cluster: prod, say)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name in labels:
            if not _LABEL_NAME.match(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a label name (letters, digits, '_'; not a digit or __ first)")
        return labels


class NotifySettings(_Strict):
    """Where new alerts are sent (docs/operations.md, Notifications); neither webhook nor command: nowhere."""

    webhook: Annotated[str, AfterValidator(_webhook_url)] | None = None  # a JSON POST of each alert
    headers: dict[str, str] = {}  # sent with the webhook's POST (an Authorization header, say)
    command: list[str] | None = Field(None, min_length=1)  # argv run with the alert JSON on stdin; no shell
    retries: int = Field(3, ge=0, le=10)  # tries after a failed one, 1s, 2s, 4s ... apart
    rate_limit: int = Field(30, ge=1, le=10_000)  # notifications a minute; those over it go out as one
    timeout: PositiveDuration = 10.0  # per try
    jobs: Literal["opted-in", "all"] = "opted-in"  # job alerts of jobs with `notify: true` only, or of all

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not an HTTP header name (letters, digits, '-'; no space or ':')")
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"the value of header {name!r} has a line break or NUL")
        return headers

    @field_validator("command")
    @classmethod
    def _argv(cls, argv: list[str] | None) -> list[str] | None:
        if argv is not None and (not argv[0].strip() or any("\0" in arg for arg in argv)):
            raise ValueError("give the command as a list: [program, arg, ...], the program not empty, no NUL")
        return argv

    @model_validator(mode="after")
    def _headers_need_webhook(self) -> NotifySettings:
        if self.headers and self.webhook is None:
            raise ValueError("headers are sent with the webhook's POST, and no webhook is set")
        return self


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
    data_prep: DataPrepSettings = DataPrepSettings()  # node-local storage for jobs' data sets (seed 003)
    containers: ContainerSettings = ContainerSettings()  # the runtime jobs with `image` run in (issue 17)

    def cross_problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """Problems that span several keys, as (key path, message); pydantic checks each key alone."""
        out: list[tuple[tuple[Any, ...], str]] = []
        seen: dict[str, int] = {}
        for i, group in enumerate(self.nodes):
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
        return out + self._project_problems() + self._run_as_problems()

    def _project_problems(self) -> list[tuple[tuple[Any, ...], str]]:
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

    def _run_as_problems(self) -> list[tuple[tuple[Any, ...], str]]:
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


def check_problems(loaded: LoadedConfig, path: Path) -> list[Problem]:
    """What `config check` refuses beyond `load_config`: a config that loads (a CLI needs only its socket and
    state_dir) but cannot schedule anything. Today: no node at all."""
    if loaded.cluster.nodes:
        return []
    data, marks = yamlfile.load(path)
    line = yamlfile.line_of(marks, ("nodes",)) if isinstance(data, dict) and "nodes" in data else 1
    return [Problem(str(path), line, "nodes", "no nodes: list at least one node group (name, host)")]


def load_config(path: Path) -> LoadedConfig:
    data, marks = yamlfile.load(path)
    cluster = yamlfile.validate(ClusterConfig, data, str(path), marks)
    problems = [
        Problem(str(path), yamlfile.line_of(marks, loc), yamlfile.dotted(loc), msg)
        for loc, msg in cluster.cross_problems()
    ]
    if problems:
        raise ConfigError(problems)
    return LoadedConfig(cluster=cluster, file=path.resolve())
