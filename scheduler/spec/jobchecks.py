"""The checks of a job spec that span several keys (`cross_problems`), on the raw YAML data: `CROSS_CHECKS`, the
rules every stored spec obeys, and `SUBMIT_CHECKS`, what the launcher or the supervisor would refuse later, run
on new specs only. Values of the wrong type are skipped: the model (jobspec.py) reports them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from ftconsole.scheduler.spec.command import MPI_LAUNCHERS
from ftconsole.scheduler.spec.containers import container_problems, image_mode_problems
from ftconsole.scheduler.spec.dataprep import data_prep_problems, first_node_launcher, program_name
from ftconsole.scheduler.spec.detectspec import hang_env_problems, performance_problems
from ftconsole.scheduler.spec.faultspec import fault_problems
from ftconsole.scheduler.spec.jobkinds import (
    ENV_NAME,
    LAUNCHER_MODES,
    MAX_NODE_NAMES,
    RESERVED_ENV,
    RESOURCE_KEYS,
    TRACE_MODES,
    JobMode,
    JobType,
)
from ftconsole.scheduler.spec.launchspec import deepspeed_env_problems, torchrun_problems
from ftconsole.scheduler.spec.nodesets import expand_nodeset
from ftconsole.scheduler.spec.specbase import Loc
from ftconsole.scheduler.spec.specbase import as_int as _int
from ftconsole.scheduler.spec.specbase import given as _given
from ftconsole.scheduler.spec.specbase import mapping as _mapping


def _mode(data: Mapping[str, Any]) -> JobMode | None:
    """The job's mode, or None when the value is invalid (the model reports that)."""
    value = data.get("mode", JobMode.SINGLE.value)
    return JobMode(value) if value in [m.value for m in JobMode] else None


def _job_type(data: Mapping[str, Any]) -> JobType | None:
    value = data.get("type", JobType.REGULAR.value)
    return JobType(value) if value in [t.value for t in JobType] else None


def _resource_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    given = [key for key in data if key in RESOURCE_KEYS and _given(data, key)]
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


def _segment_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """`topology.segment` groups the job's nodes: it divides their count, which is fixed."""
    segment = _int(_mapping(data.get("topology")).get("segment"))
    if segment is None or segment < 1:  # the model refuses it
        return []
    nodes = _int(data.get("nodes", 1))
    where: Loc = ("topology", "segment")
    if _given(_mapping(data.get("fault_tolerance")), "elastic"):
        return [(where, "segment groups a fixed number of nodes: an elastic job's count changes")]
    if nodes is not None and nodes % segment:
        return [(where, f"segment {segment} does not divide nodes: {nodes} (groups of {segment} nodes, each inside "
                        "one block)")]  # fmt: skip
    return []


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
    if not ENV_NAME.match(key):
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
    tasks = data.get("tasks")  # anything at all: the keys' own checks say what is wrong with it
    listed = tasks if isinstance(tasks, list) else []
    commands += [(("tasks", i, "command"), _mapping(t).get("command")) for i, t in enumerate(listed)]
    own = [(loc, name) for loc, command in commands if (name := program_name(command)) in MPI_LAUNCHERS]
    return image_mode_problems(data, first_node_launcher(data), own)


Check = Callable[[Mapping[str, Any]], list[tuple[Loc, str]]]


def _torch_trace_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    debug = data.get("debug")
    if not isinstance(debug, Mapping) or debug.get("torch_trace") is not True:
        return []
    mode = data.get("mode", "single")
    if mode not in TRACE_MODES or (data.get("image") is not None and mode != "pytorch"):
        return [(("debug", "torch_trace"), "torch's trace is kept in modes pytorch (with an image or without) and "
                 "pytorch-deepspeed (without an image) only")]  # fmt: skip
    return []


CROSS_CHECKS: tuple[Check, ...] = (
    _resource_problems,
    _placement_problems,
    _segment_problems,
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
