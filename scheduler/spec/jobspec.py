"""The job spec: what a user submits (a YAML file), validated with pydantic; unknown keys are errors.

`load_jobspec` / `parse_jobspec` raise `JobSpecError` (a `ConfigError`) with every problem at once, each naming
the file, the line and the key path. Checks of one key live on the models; checks that span several keys (seed 003's
rules: node names not together with driver version or pool, fault restart and checkpoint resume mutually
exclusive, ...) live in `cross_problems` (jobchecks.py), which works on the raw YAML data so that they are reported even
when other keys are invalid, and which the model also runs, so a `JobSpec` built from JSON obeys them too.
`SUBMIT_CHECKS` refuse at submit what would only fail later, when the job is planned or started (a
tensorflow job without a worker, a workdir relative to wherever SSH logs in); a spec read back from the store
(`JobSpec.from_stored`) skips them, so that a job accepted before they existed does not make the store
unreadable.

A new spec is bounded in bytes and in work before anything else is checked (issue 40, docs/jobs.md "Limits"):
the whole spec as JSON (MAX_SPEC_BYTES), an array's tasks times that (MAX_ARRAY_BYTES), the text of `command`,
the tasks' commands and the hooks (MAX_TEXT_BYTES), `env` (MAX_ENV entries of MAX_ENV_NAME_BYTES and
MAX_TEXT_BYTES), the lists (`after`, `tasks`, `specs`) and `node_names` (nodesets.py). Every check after them is
linear in the spec's size. A spec read back from the store skips these bounds too: it was accepted under the
bounds of its day.

The command of a job (and of each batch task) is run directly, as an argument vector, not by a shell:
`scheduler.command.check_command` rejects what only a shell would understand and says how to write it.

Pure code: the only I/O is reading the YAML file in `load_jobspec`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from ftconsole.scheduler.errors import ConfigError, JobSpecError, Problem
from ftconsole.scheduler.spec import arrayspec, yamlfile
from ftconsole.scheduler.spec.begin import parse_begin
from ftconsole.scheduler.spec.command import check_command
from ftconsole.scheduler.spec.config import OutputLimit, PositiveDuration
from ftconsole.scheduler.spec.containers import Image, Mounts
from ftconsole.scheduler.spec.dataprep import DataPrep
from ftconsole.scheduler.spec.detectspec import (
    HANG_OFF,
    HANG_WINDOW_S,
    HangAction,
    Performance,
    Progress,
    hang_detect_value,
    hang_minutes,
    progress_off,
)
from ftconsole.scheduler.spec.faultspec import FaultTolerance, Preflight
from ftconsole.scheduler.spec.jobchecks import CROSS_CHECKS as CROSS_CHECKS
from ftconsole.scheduler.spec.jobchecks import SUBMIT_CHECKS as SUBMIT_CHECKS
from ftconsole.scheduler.spec.jobchecks import cross_problems as cross_problems
from ftconsole.scheduler.spec.jobkinds import LAUNCHER_MODES as LAUNCHER_MODES
from ftconsole.scheduler.spec.jobkinds import MAX_NODE_NAMES, RESOURCE_KEYS, TRACE_MODES
from ftconsole.scheduler.spec.jobkinds import Access as Access
from ftconsole.scheduler.spec.jobkinds import JobMode as JobMode
from ftconsole.scheduler.spec.jobkinds import JobType as JobType
from ftconsole.scheduler.spec.jobkinds import Priority as Priority
from ftconsole.scheduler.spec.launchspec import Launcher
from ftconsole.scheduler.spec.nodesets import MAX_NODESET, expand_nodeset
from ftconsole.scheduler.spec.specbase import Strict as _Strict
from ftconsole.scheduler.spec.specbase import Text
from ftconsole.scheduler.spec.specbase import not_blank as _not_blank
from ftconsole.scheduler.spec.specbase import unique as _unique
from ftconsole.scheduler.spec.topologyspec import TopologyRequest

_STORED = "stored"  # validation context key: the spec is read back from the store (see `JobSpec.from_stored`)

# -- bounds (issue 40): what one request may cost, checked before anything else ------------------------------

MAX_SPEC_BYTES = 64 * 1024  # the spec as JSON (UTF-8): real ones are 1 to 5 kB
MAX_ARRAY_BYTES = 64 * 1024 * 1024  # an array's tasks x its spec's bytes: each task stores the whole spec
MAX_TEXT_BYTES = 16 * 1024  # `command`, a task's command, a hook, a value of `env` (a longer one: a script)
MAX_ENV = 1_000  # variables in `env`
MAX_ENV_NAME_BYTES = 256  # the name of a variable of `env`
MAX_AFTER = 1_000  # job ids in each of after.ok, after.any, after.failed
MAX_BATCH_TASKS = 1_000  # `tasks` of a batch job
MAX_SPECS = 64  # node specs in `specs`


def _stored(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and info.context.get(_STORED) is True


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def _at_most(most: int, unit: str, hint: str) -> BeforeValidator:
    """A new spec's text of at most `most` bytes, or list of at most `most` entries (`unit`: what they are); the
    value as it is otherwise (a wrong type is the field's own validator's to say)."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if _stored(info):
            return value
        count = _utf8_bytes(value) if isinstance(value, str) else len(value) if isinstance(value, list) else 0
        if count > most:
            raise ValueError(f"{count:,} {unit}, over the limit of {most:,}: {hint}")
        return value

    return BeforeValidator(check)


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _env_bounds(value: Any, info: ValidationInfo) -> Any:
    """`env` of a new spec: at most MAX_ENV variables, each name at most MAX_ENV_NAME_BYTES and each value at most
    MAX_TEXT_BYTES long."""
    if _stored(info) or not isinstance(value, Mapping):
        return value
    if len(value) > MAX_ENV:
        raise ValueError(f"{len(value):,} variables, over the limit of {MAX_ENV:,}: pass the rest in a file")
    for name, text in value.items():
        if isinstance(name, str) and _utf8_bytes(name) > MAX_ENV_NAME_BYTES:
            raise ValueError(
                f"the name {_shown(name)} is {_utf8_bytes(name):,} bytes, over the limit of {MAX_ENV_NAME_BYTES}"
            )
        if isinstance(text, str) and _utf8_bytes(text) > MAX_TEXT_BYTES:
            raise ValueError(
                f"{name}: its value is {_utf8_bytes(text):,} bytes, over the limit of {MAX_TEXT_BYTES:,}: "
                "pass it in a file"
            )
    return value


def _json_bytes(value: Any) -> int:
    """The size of `value` as compact JSON, in UTF-8 bytes (what YAML reads that JSON has not, a date, as text)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):  # a key JSON cannot have (a date): left out, the model refuses it anyway
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str, skipkeys=True)
    return _utf8_bytes(text)


def size_problems(data: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """A new spec's bounds in bytes, from its raw data, before any other check: the whole spec as JSON
    (MAX_SPEC_BYTES, naming the key that takes most of it) and an array's tasks times that (MAX_ARRAY_BYTES)."""
    total = _json_bytes(data)
    if total > MAX_SPEC_BYTES:
        sizes = {key: _json_bytes(value) for key, value in data.items()}
        key = max(sizes, key=lambda k: sizes[k])
        return [
            (
                (key,),
                f"the job spec is {total:,} bytes as JSON, over the limit of {MAX_SPEC_BYTES:,} (64 KiB), and this key "
                f"takes {sizes[key]:,} of them: put large data in files the job reads",
            )
        ]
    array = data.get("array")
    try:
        tasks = len(arrayspec.parse(str(_array_text(array))).indexes) if array is not None else 1
    except ValueError:
        return []  # the field says what is wrong
    if tasks * total > MAX_ARRAY_BYTES:
        return [
            (
                ("array",),
                f"{tasks:,} tasks of a spec of {total:,} bytes (as JSON) are {tasks * total:,} bytes to store, over "
                f"the limit of {MAX_ARRAY_BYTES:,} (64 MiB): each task keeps the whole spec; submit fewer tasks, or "
                "make the spec smaller (large data in files the job reads)",
            )
        ]
    return []


def _valid_command(value: str) -> str:
    problem = check_command(value)
    if problem is not None:
        raise ValueError(problem)
    return value.strip()


# -- field types -------------------------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _valid_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"invalid name {value!r}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _valid_nodeset(value: str, info: ValidationInfo) -> str:
    if _stored(info):  # as it was accepted: at most the config's bound, and of any length
        expand_nodeset(value, limit=MAX_NODESET, text_limit=None)
    else:
        expand_nodeset(value, limit=MAX_NODE_NAMES)
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


def _array_text(value: Any) -> Any:
    """`array: 5` is one task, index 5; `0-99%8` as written (checked by `arrays.parse`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _valid_array(value: str) -> str:
    return str(arrayspec.parse(value))  # the indexes as ranges, so that a stored spec says the same


_RUN_A_SCRIPT = "put it in a script and run that"

Name = Annotated[str, AfterValidator(_valid_name)]
ArrayText = Annotated[str, BeforeValidator(_array_text), AfterValidator(_valid_array)]
Command = Annotated[str, AfterValidator(_valid_command), _at_most(MAX_TEXT_BYTES, "bytes", _RUN_A_SCRIPT)]
HookText = Annotated[Text, _at_most(MAX_TEXT_BYTES, "bytes", _RUN_A_SCRIPT)]
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
JobIds = Annotated[
    list[JobId],
    _at_most(MAX_AFTER, "job ids", "wait for an array (its id stands for all its tasks) or for a job that does"),
    AfterValidator(_unique),
]


class After(_Strict):
    """The jobs this one waits for (Slurm's --dependency): `ok` to succeed (afterok), `any` to end whatever its
    end (afterany), `failed` to end without succeeding (afternotok). See decide/dependencies.py."""

    ok: JobIds = Field(default_factory=list)
    any: JobIds = Field(default_factory=list)
    failed: JobIds = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_one(self) -> After:
        if not (self.ok or self.any or self.failed):
            raise ValueError("name at least one job under ok, any or failed")
        return self

    def as_map(self) -> dict[str, list[int]]:
        return {"ok": self.ok, "any": self.any, "failed": self.failed}


class Hooks(_Strict):
    """Lifecycle scripts run on the job's first node before it starts and after it ends."""

    before: HookText | None = None
    after: HookText | None = None


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


class JobSpec(_Strict):
    """A job as submitted. `spec` / `specs` name node specs of the cluster config: only their format is
    checked here; the scheduler resolves them (the first of `specs` that can start wins)."""

    name: Name
    mode: JobMode = JobMode.SINGLE
    type: JobType = JobType.REGULAR
    nodes: int = Field(1, ge=1, strict=True)
    gpus_per_node: int | None = Field(None, ge=0, le=64)
    spec: Name | None = None
    specs: (
        Annotated[list[Name], _at_most(MAX_SPECS, "specs", "name fewer candidates"), AfterValidator(_unique)] | None
    ) = Field(None, min_length=1)
    node_names: NodeSetExpr | None = None
    driver_version: Version | None = None
    pool: Text | None = None
    gpu_model: Text | None = None
    ps_count: int | None = Field(None, ge=0)
    command: Command | None = None
    tasks: Annotated[list[Task], _at_most(MAX_BATCH_TASKS, "tasks", "split the batch into several jobs")] | None = (
        Field(None, min_length=1)
    )
    workdir: Annotated[Text, BeforeValidator(_home_not_null)] = "~"
    env: Annotated[dict[str, EnvValue], BeforeValidator(_env_bounds)] = Field(default_factory=dict)
    priority: Priority = Priority.NORMAL
    project: Name = "default"
    max_runtime: PositiveDuration | None = None
    # the most each rank's output.log keeps on its node, its oldest output dropped past it (default: the cluster's
    # scheduler.output_limit; over it: admins only); 0 or off: no limit
    output_limit: OutputLimit | None = None
    # the hang window (seed 001): default HANG_WINDOW_S, or MA_HANG_DETECT_TIME (minutes) in env; `off`: none
    hang_detect: Annotated[float, BeforeValidator(hang_detect_value)] | None = None
    hang_action: HangAction = HangAction.ALERT  # what a suspected hang leads to
    # it ends once idle this long: no step running, no typing in a shell in its env, its GPUs under the cluster's
    # scheduler.idle_util_pct (docs/jobs.md, "Idle allocations"); `off`: never (an allocation's default: the cluster's)
    idle_timeout: Annotated[float, BeforeValidator(hang_detect_value)] | None = None
    notify: bool = False  # job alerts go to the config's notify targets (seed 003's "notify me")
    progress: Annotated[Progress, BeforeValidator(progress_off)] = Progress()  # stragglers (seed 001)
    performance: Performance | None = None  # slow iterations (seed 003)
    access: Access = Access.NONE
    output: Text | None = None
    hooks: Hooks = Hooks()
    launcher: Launcher | None = None
    fault_tolerance: FaultTolerance = FaultTolerance()
    preflight: Preflight = Preflight()  # more checks right before a start: `bandwidth`, the fabric between its nodes
    data_prep: DataPrep | None = None  # data sets copied to node-local storage first (seed 003)
    debug: Debug = Debug()  # what stays after a failure, for `ftconsole shell`
    image: Image | None = None  # the container image each rank runs in (issue 17)
    mounts: Mounts | None = None  # folders of the node the container sees
    after: After | None = None  # the jobs it waits for (issue 30: Slurm's --dependency)
    # a job of a higher priority level that cannot start otherwise may stop it (checkpoint signal and grace
    # period first, with checkpoint_resume) and queue it again at the front (docs/jobs.md, "Preemption")
    preemptible: bool = False
    # one submit, one task per index, each a job with FT_ARRAY_INDEX; %N: at most N running at once
    # (docs/jobs.md, "Arrays")
    array: ArrayText | None = None
    # the reservation it runs in: only on its nodes, within its window (docs/jobs.md, "Reservations")
    reservation: Name | None = None
    # its nodes under at most max_switches leaf switches of the cluster's topology, waited for at most `wait` (Slurm's
    # --switches=N@TIME; docs/jobs.md, "Topology")
    topology: TopologyRequest | None = None
    # not placed before this time: a date and time, or + a duration after the submit (Slurm's --begin)
    begin: Annotated[str, BeforeValidator(parse_begin)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_gpus(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and all(data.get(key) is None for key in RESOURCE_KEYS):
            return {**data, "gpus_per_node": 1}
        return data

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any, info: ValidationInfo) -> Any:
        """A new spec's size first (`size_problems`): nothing else is looked at in a spec past it. (Of the "before"
        validators, the last defined runs first.)"""
        if isinstance(data, Mapping) and not _stored(info):
            problems = size_problems(data)
            if problems:
                raise ValueError("; ".join(f"{yamlfile.dotted(loc)}: {msg}" for loc, msg in problems))
        return data

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> JobSpec:
        problems = cross_problems(self.model_dump(mode="json", exclude_none=True), stored=_stored(info))
        if problems:
            raise ValueError("; ".join(f"{yamlfile.dotted(loc)}: {msg}" for loc, msg in problems))
        return self

    # -- derived views -------------------------------------------------------------------------------------

    @property
    def torch_trace(self) -> bool:
        """Whether the ranks keep and serve torch's flight recorder trace (`debug.torch_trace`)."""
        on = self.mode.value in TRACE_MODES and (self.image is None or self.mode.value == "pytorch")
        return on and self.debug.torch_trace is not False

    @property
    def idle_window(self) -> float | None:
        """How long idle before it ends (None: never): `idle_timeout`, unless off."""
        return None if self.idle_timeout is None or self.idle_timeout == HANG_OFF else self.idle_timeout

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

    def output_cap(self, cluster: int) -> int:
        """The most each rank's output.log keeps, in bytes (0: no limit): `output_limit`, else the cluster's."""
        return cluster if self.output_limit is None else self.output_limit

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
        return expand_nodeset(self.node_names, text_limit=None) if self.node_names else []  # checked when accepted

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
    too_big = size_problems(data) if isinstance(data, Mapping) else []
    if too_big:  # before any other check: each is linear in the spec's size, but the size is not yet bounded
        raise ConfigError(
            [Problem(file, yamlfile.line_of(marks, loc), yamlfile.dotted(loc), msg) for loc, msg in too_big]
        )
    try:
        return yamlfile.validate(JobSpec, data, file, marks)
    except ConfigError as exc:
        raise ConfigError(_merge(exc.problems, data, file, marks)) from exc


def parse_jobspec(text: str, file: str = "<job>") -> JobSpec:
    """Parse and validate job YAML; raise JobSpecError naming file, line and key of every problem: those of the
    YAML itself (a duplicate key) with those of the spec, in one run."""
    try:
        data, marks, found = yamlfile.parse_all(text, file)
        try:
            spec = _build(data, file, marks)
        except ConfigError as exc:  # a key the YAML already faulted (its value left out) is not faulted again
            found += [p for p in exc.problems if not any(q.path and _related(q.path, p.path) for q in found)]
        if found:
            raise JobSpecError(sorted(found, key=lambda p: p.line or 0))
        return spec
    except JobSpecError:
        raise
    except ConfigError as exc:  # a YAML syntax error
        raise JobSpecError(exc.problems) from exc


def load_jobspec(path: str | Path) -> JobSpec:
    """Read, parse and validate a job file; raise JobSpecError naming file, line and key of every problem."""
    try:
        text = yamlfile.read(Path(path))
    except ConfigError as exc:
        raise JobSpecError(exc.problems) from exc
    return parse_jobspec(text, str(path))
