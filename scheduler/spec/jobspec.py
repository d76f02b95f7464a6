"""The job spec: what a user submits (a YAML file), validated with pydantic; unknown keys are errors.

`load_jobspec` / `parse_jobspec` raise `ConfigError` with every problem at once, each naming the file, the
line and the key path. Checks of one key live on the models; checks that span several keys (seed 003's
rules: node names not together with driver version or pool, fault restart and checkpoint resume mutually
exclusive, ...) live in `cross_problems`, which works on the raw YAML data so that they are reported even
when other keys are invalid, and which the model also runs, so a `JobSpec` built from JSON obeys them too.
`SUBMIT_CHECKS` refuse at submit what would only fail later, when the job is planned or started (a
tensorflow job without a worker, a workdir relative to wherever SSH logs in); a spec read back from the store
(`JobSpec.from_stored`) skips them, so that a job accepted before they existed does not make the store
unreadable.

The command of a job (and of each batch task) is run directly, as an argument vector, not by a shell:
`scheduler.command.check_command` rejects what only a shell would understand and says how to write it.

Pure code: the only I/O is reading the YAML file in `load_jobspec`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from ftconsole.scheduler.errors import ConfigError, Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.command import MPI_LAUNCHERS, check_command
from ftconsole.scheduler.spec.config import PositiveDuration
from ftconsole.scheduler.spec.containers import Image, Mounts, container_problems, image_mode_problems
from ftconsole.scheduler.spec.dataprep import DataPrep, data_prep_problems, first_node_launcher, program_name
from ftconsole.scheduler.spec.detectspec import (
    HANG_OFF,
    HANG_WINDOW_S,
    HangAction,
    Performance,
    Progress,
    hang_detect_value,
    hang_env_problems,
    hang_minutes,
    performance_problems,
    progress_off,
)
from ftconsole.scheduler.spec.faultspec import FaultTolerance, fault_problems
from ftconsole.scheduler.spec.launchspec import Launcher, deepspeed_env_problems, torchrun_problems
from ftconsole.scheduler.spec.nodesets import MAX_NODESET, expand_nodeset
from ftconsole.scheduler.spec.specbase import Loc, Text
from ftconsole.scheduler.spec.specbase import Strict as _Strict
from ftconsole.scheduler.spec.specbase import as_int as _int
from ftconsole.scheduler.spec.specbase import given as _given
from ftconsole.scheduler.spec.specbase import mapping as _mapping
from ftconsole.scheduler.spec.specbase import not_blank as _not_blank
from ftconsole.scheduler.spec.specbase import unique as _unique

_STORED = "stored"  # validation context key: the spec is read back from the store (see `JobSpec.from_stored`)

# -- enums -------------------------------------------------------------------------------------------------


class JobMode(StrEnum):
    """How the ranks of a job are started (see the launcher)."""

    SINGLE = "single"
    PYTORCH = "pytorch"
    PYTORCH_DEEPSPEED = "pytorch-deepspeed"
    HOROVOD = "horovod"
    MPICH = "mpich"
    TENSORFLOW = "tensorflow"


class Priority(StrEnum):
    """Queue priority; the scheduler allows `very-urgent` to admins only."""

    NORMAL = "normal"
    URGENT = "urgent"
    VERY_URGENT = "very-urgent"


class Access(StrEnum):
    """What other users may do with the job."""

    READ_WRITE = "read-write"
    READ_ONLY = "read-only"
    NONE = "none"


class JobType(StrEnum):
    """A regular job runs `command`; a batch job runs each of its `tasks`."""

    REGULAR = "regular"
    BATCH = "batch"


def _valid_command(value: str) -> str:
    problem = check_command(value)
    if problem is not None:
        raise ValueError(problem)
    return value.strip()


# -- field types -------------------------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLOTS", "CUDA_VISIBLE_DEVICES"}
    | {"TF_CONFIG", "OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE"}
)
"""Variables the launcher sets for each rank; a job may not set them (nor any FT_ variable)."""


def _valid_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"invalid name {value!r}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


# The most nodes `node_names` may name in a new job (issue 26): a job pins a few nodes, and the set is expanded
# each time the job is planned; a spec read back from the store keeps the config's bound (MAX_NODESET).
MAX_NODE_NAMES = 10_000


def _valid_nodeset(value: str, info: ValidationInfo) -> str:
    stored = isinstance(info.context, Mapping) and info.context.get(_STORED) is True
    expand_nodeset(value, limit=MAX_NODESET if stored else MAX_NODE_NAMES)
    return value


def _version_text(value: Any) -> Any:
    """Driver versions are text; YAML reads `535` as a number (fine) and `550.50` as a float (ambiguous)."""
    if isinstance(value, float):
        raise ValueError(f"write the version in quotes ('{value}'): YAML reads it as a number")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _env_value(value: Any) -> Any:
    """`OMP_NUM_THREADS: 4` is fine: numbers become text; booleans are ambiguous (`yes`, `on`) and refused."""
    if isinstance(value, bool):
        raise ValueError("write the value in quotes: YAML reads it as a boolean")
    if isinstance(value, int | float):
        return str(value)
    return value


def _home_not_null(value: Any) -> Any:
    """YAML reads a bare `~` as null, not as the home folder: say so rather than "not a valid string"."""
    if value is None:
        raise ValueError("YAML reads a bare ~ as null: write '~' in quotes, or leave workdir out (the default is ~)")
    return value


def _sub_folder(value: str) -> str:
    path = PurePosixPath(value)
    if value.startswith(("/", "~")):
        raise ValueError(f"{value!r} must be a sub-folder, relative to the job's output folder")
    if ".." in path.parts:
        raise ValueError(f"{value!r} must stay inside the job's output folder: '..' is not allowed")
    if str(path) == ".":
        raise ValueError("name a sub-folder of the job's output folder, not the folder itself")
    return value


Name = Annotated[str, AfterValidator(_valid_name)]
Command = Annotated[str, AfterValidator(_valid_command)]
NodeSetExpr = Annotated[str, AfterValidator(_valid_nodeset)]
Version = Annotated[str, BeforeValidator(_version_text), AfterValidator(_not_blank)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]
SubFolder = Annotated[str, AfterValidator(_not_blank), AfterValidator(_sub_folder)]


# -- models ------------------------------------------------------------------------------------------------


class Task(_Strict):
    """One task of a batch job: its own command, writing into its own sub-folder of the job's output."""

    name: Name
    command: Command
    output: SubFolder

    def argv(self) -> list[str]:
        return shlex.split(self.command)


JobId = Annotated[int, Field(ge=1, strict=True)]


class After(_Strict):
    """The jobs this one waits for (Slurm's --dependency): `ok` to succeed (afterok), `any` to end whatever its
    end (afterany), `failed` to end without succeeding (afternotok). See decide/dependencies.py."""

    ok: Annotated[list[JobId], AfterValidator(_unique)] = Field(default_factory=list)
    any: Annotated[list[JobId], AfterValidator(_unique)] = Field(default_factory=list)
    failed: Annotated[list[JobId], AfterValidator(_unique)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_one(self) -> After:
        if not (self.ok or self.any or self.failed):
            raise ValueError("name at least one job under ok, any or failed")
        return self

    def as_map(self) -> dict[str, list[int]]:
        return {"ok": self.ok, "any": self.any, "failed": self.failed}


class Hooks(_Strict):
    """Lifecycle scripts run on the job's first node before it starts and after it ends."""

    before: Text | None = None
    after: Text | None = None


LAUNCHER_MODES: dict[str, tuple[JobMode, str]] = {
    "torchrun_max_restarts": (JobMode.PYTORCH, "torchrun's --max_restarts"),
    "torchrun_monitor_interval": (JobMode.PYTORCH, "torchrun's --monitor_interval"),
    "hydra_iface": (JobMode.MPICH, "HYDRA_IFACE, the network interface of MPICH's hydra"),
}
"""Each key of `launcher:`: the mode it is for, and what it sets."""


class Debug(_Strict):
    """The kept debugging environment of a job that fails (seed 003): its last attempt's run folders stay on
    its nodes for `retention` (default: the cluster's `debug.retention`), and with `hold_nodes` its GPUs stay
    held for that time, so that `ftconsole shell` finds the nodes as the job left them."""

    retention: PositiveDuration | None = None
    hold_nodes: bool = False
    # modes pytorch and pytorch-deepspeed without an image: the ranks keep torch's flight recorder trace of their
    # last collectives and serve it to `ftconsole debug` (default: on there; false: off). Refused elsewhere.
    torch_trace: bool | None = None


class GpuRequest(NamedTuple):
    """One candidate resource request: a named spec (resolved by the scheduler) or a GPU count per node."""

    spec: str | None
    gpus_per_node: int | None


_RESOURCE_KEYS = ("gpus_per_node", "spec", "specs")


class JobSpec(_Strict):
    """A job as submitted. `spec` / `specs` name node specs of the cluster config: only their format is
    checked here; the scheduler resolves them (the first of `specs` that can start wins)."""

    name: Name
    mode: JobMode = JobMode.SINGLE
    type: JobType = JobType.REGULAR
    nodes: int = Field(1, ge=1, strict=True)
    gpus_per_node: int | None = Field(None, ge=0, le=64)
    spec: Name | None = None
    specs: Annotated[list[Name], AfterValidator(_unique)] | None = Field(None, min_length=1)
    node_names: NodeSetExpr | None = None
    driver_version: Version | None = None
    pool: Text | None = None
    gpu_model: Text | None = None
    ps_count: int | None = Field(None, ge=0)
    command: Command | None = None
    tasks: list[Task] | None = Field(None, min_length=1)
    workdir: Annotated[Text, BeforeValidator(_home_not_null)] = "~"
    env: dict[str, EnvValue] = Field(default_factory=dict)
    priority: Priority = Priority.NORMAL
    project: Name = "default"
    max_runtime: PositiveDuration | None = None
    # the hang window (seed 001): default HANG_WINDOW_S, or MA_HANG_DETECT_TIME (minutes) in env; `off`: none
    hang_detect: Annotated[float, BeforeValidator(hang_detect_value)] | None = None
    hang_action: HangAction = HangAction.ALERT  # what a suspected hang leads to
    notify: bool = False  # job alerts go to the config's notify targets (seed 003's "notify me")
    progress: Annotated[Progress, BeforeValidator(progress_off)] = Progress()  # stragglers (seed 001)
    performance: Performance | None = None  # slow iterations (seed 003)
    access: Access = Access.NONE
    output: Text | None = None
    hooks: Hooks = Hooks()
    launcher: Launcher | None = None
    fault_tolerance: FaultTolerance = FaultTolerance()
    data_prep: DataPrep | None = None  # data sets copied to node-local storage first (seed 003)
    debug: Debug = Debug()  # what stays after a failure, for `ftconsole shell`
    image: Image | None = None  # the container image each rank runs in (issue 17)
    mounts: Mounts | None = None  # folders of the node the container sees
    after: After | None = None  # the jobs it waits for (issue 30: Slurm's --dependency)

    @model_validator(mode="before")
    @classmethod
    def _default_gpus(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and all(data.get(key) is None for key in _RESOURCE_KEYS):
            return {**data, "gpus_per_node": 1}
        return data

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> JobSpec:
        stored = isinstance(info.context, Mapping) and info.context.get(_STORED) is True
        problems = cross_problems(self.model_dump(mode="json", exclude_none=True), stored=stored)
        if problems:
            raise ValueError("; ".join(f"{yamlfile.dotted(loc)}: {msg}" for loc, msg in problems))
        return self

    # -- derived views -------------------------------------------------------------------------------------

    @property
    def torch_trace(self) -> bool:
        """Whether the ranks keep and serve torch's flight recorder trace (`debug.torch_trace`)."""
        on = self.mode.value in TRACE_MODES and self.image is None
        return on and self.debug.torch_trace is not False

    @property
    def hang_window(self) -> float | None:
        """How long without I/O before the job is suspected hung (None: never): `hang_detect`, else
        MA_HANG_DETECT_TIME in its env (minutes), else HANG_WINDOW_S."""
        if self.hang_detect is not None:
            return None if self.hang_detect == HANG_OFF else self.hang_detect
        try:
            minutes = hang_minutes({k: str(v) for k, v in self.env.items()})
        except ValueError:  # refused at submit since; a job stored before keeps the default
            minutes = None
        return HANG_WINDOW_S if minutes is None else minutes * 60

    @property
    def gpu_request(self) -> list[GpuRequest]:
        """The candidate requests in order of preference: the named specs, or one GPU count."""
        if self.specs is not None:
            return [GpuRequest(spec, None) for spec in self.specs]
        if self.spec is not None:
            return [GpuRequest(self.spec, None)]
        return [GpuRequest(None, self.gpus_per_node)]

    def argv(self) -> list[str]:
        """The command as an argument vector; a batch job has none (see `tasks[i].argv()`)."""
        if self.command is None:
            raise ValueError(f"job {self.name} is a batch job: it has no command of its own, only tasks")
        return shlex.split(self.command)

    def node_list(self) -> list[str]:
        """The expanded `node_names`, or [] when the scheduler picks the nodes."""
        return expand_nodeset(self.node_names) if self.node_names else []

    @property
    def elastic_range(self) -> tuple[int, int] | None:
        """(min_nodes, max_nodes) of an elastic job, `max_nodes` defaulting to `nodes`; None when not elastic."""
        elastic = self.fault_tolerance.elastic
        if elastic is None:
            return None
        return elastic.min_nodes, elastic.max_nodes or self.nodes

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data (durations in seconds) that `from_json` turns back into an equal spec."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec from JSON, with every check of a new submission."""
        return cls.model_validate(data)

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec read back from the store: as `from_json`, less the `SUBMIT_CHECKS`, which were added after
        specs were first stored; a job accepted before them still loads (and fails alone if it cannot launch)."""
        return cls.model_validate(data, context={_STORED: True})


# -- checks across keys ------------------------------------------------------------------------------------


def _mode(data: Mapping[str, Any]) -> JobMode | None:
    """The job's mode, or None when the value is invalid (the model reports that)."""
    value = data.get("mode", JobMode.SINGLE.value)
    return JobMode(value) if value in [m.value for m in JobMode] else None


def _job_type(data: Mapping[str, Any]) -> JobType | None:
    value = data.get("type", JobType.REGULAR.value)
    return JobType(value) if value in [t.value for t in JobType] else None


def _resource_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    given = [key for key in data if key in _RESOURCE_KEYS and _given(data, key)]
    return [((key,), f"give only one of gpus_per_node, spec, specs: {given[0]} is given already") for key in given[1:]]


def _placement_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    if not _given(data, "node_names"):
        return []
    out: list[tuple[Loc, str]] = [
        (("node_names",), f"node_names cannot be combined with {key}: the named nodes are used as they are")
        for key in ("driver_version", "pool")
        if _given(data, key)
    ]
    nodes = _int(data.get("nodes", 1))
    try:
        named = len(expand_nodeset(str(data["node_names"]), limit=MAX_NODE_NAMES))
    except ValueError:
        return out  # the model reports the invalid expression
    if nodes is not None and named < nodes:
        out.append((("node_names",), f"node_names names {named} node(s) but the job needs nodes: {nodes}"))
    return out


def _mode_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    mode = _mode(data)
    if mode is None:
        return []
    out: list[tuple[Loc, str]] = []
    nodes = _int(data.get("nodes", 1))
    if mode is JobMode.SINGLE and nodes is not None and nodes != 1:
        out.append((("nodes",), "mode single runs on one node: set nodes: 1 or choose a distributed mode"))
    if _given(data, "ps_count") and mode is not JobMode.TENSORFLOW:
        out.append((("ps_count",), f"ps_count (parameter servers) is only for mode tensorflow, not {mode}"))
    launcher = _mapping(data.get("launcher"))
    for key, (wanted, what) in LAUNCHER_MODES.items():
        if _given(launcher, key) and mode is not wanted:
            out.append((("launcher", key), f"{key} ({what}) is only for mode {wanted}, not {mode}"))
    if mode is JobMode.MPICH and _given(launcher, "hydra_iface") and "HYDRA_IFACE" in _mapping(data.get("env")):
        out.append((("env", "HYDRA_IFACE"), "HYDRA_IFACE is set by launcher.hydra_iface: give the interface once"))
    return out


def _task_problems(tasks: list[Any]) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    names: dict[str, int] = {}
    folders: dict[str, int] = {}
    for i, task in enumerate(tasks):
        task = _mapping(task)
        name, output = task.get("name"), task.get("output")
        if isinstance(name, str):
            if name in names:
                out.append((("tasks", i, "name"), f"duplicate task name {name!r} (also tasks[{names[name]}])"))
            names.setdefault(name, i)
        if isinstance(output, str) and output.strip():
            folder = str(PurePosixPath(output))
            if folder in folders:
                out.append(
                    (("tasks", i, "output"), f"output folder {folder!r} is used by tasks[{folders[folder]}] already")
                )
            folders.setdefault(folder, i)
    return out


def _type_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    job_type = _job_type(data)
    if job_type is JobType.BATCH:
        out: list[tuple[Loc, str]] = []
        if _given(data, "command"):
            out.append((("command",), "a batch job runs its tasks' commands: move this command into tasks"))
        if not _given(data, "tasks"):
            out.append((("type",), "a batch job needs tasks: a list of {name, command, output}"))
        tasks = data.get("tasks")
        return out + (_task_problems(tasks) if isinstance(tasks, list) else [])
    if job_type is JobType.REGULAR:
        if _given(data, "tasks"):
            return [(("tasks",), "tasks are for type: batch; a regular job runs command")]
        if not _given(data, "command"):
            return [(("command",), "command is required (unless type: batch)")]
    return []


def _env_problem(key: str) -> str | None:
    if not _ENV_NAME.match(key):
        return f"invalid variable name {key!r}: use letters, digits and '_', not starting with a digit"
    if key.startswith("FT_"):
        return "FT_ variables are reserved for ftconsole"
    if key in RESERVED_ENV:
        return f"{key} is set by the launcher (from nodes, GPUs and mode); remove it"
    return None


def _env_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    for key in _mapping(data.get("env")):
        problem = _env_problem(key) if isinstance(key, str) else None
        if problem is not None:
            out.append((("env", key), problem))
    return out


# -- what would fail only when the job is planned or started ---------------------------------------------------


def _ps_count_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The launcher makes the first ps_count nodes parameter servers and the others workers: one must be left."""
    ps = _int(data.get("ps_count"))
    if _mode(data) is not JobMode.TENSORFLOW or ps is None or ps < 1:
        return []
    nodes = _int(data.get("nodes", 1))
    if nodes is not None and ps >= nodes:
        return [
            (
                ("ps_count",),
                f"ps_count ({ps}) must be fewer than nodes ({nodes}): the first ps_count nodes run parameter "
                "servers, and at least one node must run a worker",
            )
        ]
    low = _int(_mapping(_mapping(data.get("fault_tolerance")).get("elastic")).get("min_nodes"))
    if low is not None and ps >= low:
        return [
            (
                ("ps_count",),
                f"ps_count ({ps}) must be fewer than fault_tolerance.elastic.min_nodes ({low}): the job may run "
                f"on {low} node(s), and at least one node must run a worker",
            )
        ]
    return []


def _workdir_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The supervisor expands a leading `~/` with the node's HOME; anything else relative would be resolved
    against wherever the SSH login starts."""
    workdir = data.get("workdir")
    if not isinstance(workdir, str) or not workdir.strip():
        return []  # the model reports it
    if workdir.startswith("/") or workdir == "~" or workdir.startswith("~/"):
        return []
    return [
        (
            ("workdir",),
            f"must be an absolute path (as /data/me/project) or start with ~/ (your home folder on the node), "
            f"not {workdir!r}: a relative path would depend on where SSH logs in",
        )
    ]


def _nul_problems(value: Any, loc: Loc = ()) -> list[tuple[Loc, str]]:
    """NUL characters (YAML's "\\0") in any text: no argument, variable or path can hold one."""
    if isinstance(value, str):
        if "\0" not in value:
            return []
        return [(loc, "contains a NUL character (\\0), which no command, variable or path can hold")]
    if isinstance(value, Mapping):
        return [p for key, item in value.items() for p in _nul_problems(item, (*loc, key))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _nul_problems(item, (*loc, i))]
    return []


def _image_mode_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    commands: list[tuple[Loc, Any]] = [(("command",), data.get("command"))]
    tasks = data.get("tasks")
    commands += [(("tasks", i, "command"), _mapping(t).get("command")) for i, t in enumerate(tasks or [])]
    own = [(loc, name) for loc, command in commands if (name := program_name(command)) in MPI_LAUNCHERS]
    return image_mode_problems(data, first_node_launcher(data), own)


Check = Callable[[Mapping[str, Any]], list[tuple[Loc, str]]]


TRACE_MODES = ("pytorch", "pytorch-deepspeed")


def _torch_trace_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    debug = data.get("debug")
    if not isinstance(debug, Mapping) or debug.get("torch_trace") is not True:
        return []
    if data.get("mode", "single") not in TRACE_MODES or data.get("image") is not None:
        return [(("debug", "torch_trace"), "torch's trace is kept in modes pytorch and pytorch-deepspeed without "
                 "an image only")]  # fmt: skip
    return []


CROSS_CHECKS: tuple[Check, ...] = (
    _resource_problems,
    _placement_problems,
    _mode_problems,
    _type_problems,
    _env_problems,
    fault_problems,
    performance_problems,
    container_problems,
)
"""Rules of the spec itself: every stored spec obeys them."""


SUBMIT_CHECKS: tuple[Check, ...] = (
    hang_env_problems,
    _ps_count_problems,
    _workdir_problems,
    _nul_problems,
    deepspeed_env_problems,
    torchrun_problems,
    data_prep_problems,
    _image_mode_problems,
    _torch_trace_problems,
)
"""What the launcher or the supervisor would refuse later, from the spec alone; run on new specs only."""


def cross_problems(data: Any, *, stored: bool = False) -> list[tuple[Loc, str]]:
    """Problems that span several keys, as (key path, message), from raw (unvalidated) job data.

    Values of the wrong type are skipped here: the model reports them. `stored`: a spec read back from the
    store, which skips `SUBMIT_CHECKS`.
    """
    if not isinstance(data, Mapping):
        return []
    checks = CROSS_CHECKS if stored else CROSS_CHECKS + SUBMIT_CHECKS
    return [problem for check in checks for problem in check(data)]


# -- loading -----------------------------------------------------------------------------------------------


def _related(a: str, b: str) -> bool:
    """Whether key paths `a` and `b` are the same key or one lies inside the other."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((short + ".", short + "["))


def _merge(problems: list[Problem], data: Any, file: str, marks: yamlfile.Marks) -> list[Problem]:
    """The model's problems plus the cross-key ones, without repeating a key the model already faulted."""
    by_key = [p for p in problems if p.path]
    cross = [
        Problem(file, yamlfile.line_of(marks, loc), yamlfile.dotted(loc), msg)
        for loc, msg in cross_problems(data)
        if not any(_related(yamlfile.dotted(loc), p.path) for p in by_key)
    ]
    # A problem without a key is either the top level's or the model's own cross check, which `cross` restates.
    top = [p for p in problems if not p.path] if not cross else []
    return sorted([*by_key, *cross, *top], key=lambda p: p.line or 0)


def _build(data: Any, file: str, marks: yamlfile.Marks) -> JobSpec:
    try:
        return yamlfile.validate(JobSpec, data, file, marks)
    except ConfigError as exc:
        raise ConfigError(_merge(exc.problems, data, file, marks)) from exc


def parse_jobspec(text: str, file: str = "<job>") -> JobSpec:
    """Parse and validate job YAML; raise ConfigError naming file, line and key of every problem."""
    data, marks = yamlfile.parse(text, file)
    return _build(data, file, marks)


def load_jobspec(path: str | Path) -> JobSpec:
    """Read, parse and validate a job file; raise ConfigError naming file, line and key of every problem."""
    path = Path(path)
    data, marks = yamlfile.load(path)
    return _build(data, str(path), marks)
