"""The job spec's `data_prep:` key (seed 003's data preparation): data sets copied from a shared path on each node
to its node-local fast storage before the job's command runs. Pure code.

- The model (`DataSet`, `DataPrep`) and `data_prep_problems`, the spec's checks at submit, each naming its key
  path: paths absolute or starting with ~/ (the home of the account the job runs as on the node: where a
  user's data sets often live; a relative path would depend on where SSH logs in), no "..", `to` never / or a
  home folder, never over ftconsole's own folder (~/.ftconsole: run folders, checkpoints), not the same as,
  inside or over its `from`, no two entries on one `to` or one inside another, at most MAX_DATA_SETS entries,
  and only in modes where every node runs its own rank (the copy is a step of each rank's run).
- `check_admissible`, the cluster's rules at submit (`Rules.admissible`): `to` inside one of the admin's
  `data_prep.roots` (at most MAX_DEPTH folders down), not over or inside the run root; no roots, no data_prep.
- `node_params`, what the node-side program (`scheduler/node/datacopy.py`) is given: `scheduler.decide.jobplan`
  makes that program the first step of each launching rank (step kind "data", name DATA_STEP).
- `preparing`, the text of the Preparing condition while ranks are in that step.

What is copied how, the skip rule, the safety rule and the keeping are datacopy.py's docstring.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, model_serializer

from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.config import DataPrepSettings
from ftconsole.scheduler.spec.specbase import Loc, Strict, Text, as_int, mapping

if TYPE_CHECKING:  # jobspec imports this module
    from ftconsole.scheduler.spec.jobspec import JobSpec

DATA_STEP = "data prep"  # the name of the step in a run's steps (status.json "step" while it runs)
MAX_DATA_SETS = 16
MAX_DEPTH = 4  # `to` lies at most this many folders below its root (datacopy.py looks no deeper when it cleans)
PROGRESS_S = 5.0  # seconds between the copy's progress lines in output.log
LOCK_WAIT_S = 600.0  # the longest a rank waits for another data_prep's lock on its `to`, then fails saying who holds it
OWN_FOLDER = "~/.ftconsole"  # run folders and checkpoints (the default run root is inside it)
# modes whose launcher starts the other nodes' ranks itself from the first node: those nodes run no steps
FIRST_NODE_LAUNCHES = {"horovod": "mpirun", "mpich": "MPICH's mpirun (hydra)"}


class DataSet(Strict):
    """One data set: the folder `from` (a shared file system, as the node sees it) copied to `to` (node-local)."""

    source: Text = Field(alias="from")
    to: Text

    @model_serializer
    def _dump(self) -> dict[str, str]:
        return {"from": self.source, "to": self.to}


DataPrep = Annotated[list[DataSet], Field(min_length=1, max_length=MAX_DATA_SETS)]


# -- the spec's checks (raw YAML data) -------------------------------------------------------------------------


def _norm(path: str) -> str:
    """A path as written, normalised ("~/a/../b" stays relative to "~"): for comparing paths of one kind."""
    if path == "~" or path.startswith("~/"):
        rest = posixpath.normpath("/" + path[2:]) if len(path) > 2 else "/"
        return "~" + rest.rstrip("/") if rest != "/" else "~"
    return posixpath.normpath(path)


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies inside it (both `_norm`ed; a "~" path is never inside a "/" one)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _path_problem(value: str) -> str | None:
    if "\0" in value:
        return None  # `_nul_problems` says so
    if not (value.startswith("/") or value.startswith("~/")):
        return (
            f"must be an absolute path (as /local/imagenet) or start with ~/ (the home folder on the node), not "
            f"{value!r}: a relative path would depend on where SSH logs in"
        )
    if ".." in value.split("/"):
        return f"{value!r}: write the path without '..'"
    return None


def data_prep_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The spec's checks of `data_prep` (see the module docstring), from raw job data; the model reports types."""
    entries = data.get("data_prep")
    if not isinstance(entries, list) or not entries:
        return []
    out: list[tuple[Loc, str]] = []
    tos: dict[str, int] = {}
    for i, entry in enumerate(entries):
        raw = {key: mapping(entry).get(key) for key in ("from", "to")}
        bad = False
        for key, value in raw.items():
            problem = _path_problem(value) if isinstance(value, str) else None
            if problem is not None:
                out.append((("data_prep", i, key), problem))
            bad = bad or problem is not None or not isinstance(value, str) or "\0" in value
        if bad:
            continue
        src, dst = _norm(str(raw["from"])), _norm(str(raw["to"]))
        problem = _to_problem(src, dst)
        for other, j in tos.items():
            if problem is None and (_inside(dst, other) or _inside(other, dst)):
                how = "is also" if dst == other else "lies inside" if _inside(dst, other) else "holds"
                problem = f"{dst} {how} data_prep[{j}].to ({other}): each data set needs a folder of its own"
        if problem is not None:
            out.append((("data_prep", i, "to"), problem))
        tos.setdefault(dst, i)
    return out + _mode_problems(data)


def _to_problem(src: str, dst: str) -> str | None:
    if dst in ("/", "~"):
        return f"{dst} is not a folder to copy into: name a folder of its own on the node's local storage"
    if _inside(dst, OWN_FOLDER) or _inside(OWN_FOLDER, dst):
        return f"{dst} would be over ftconsole's own folder {OWN_FOLDER} (run folders, checkpoints): choose another"
    if dst == src:
        return "is its own `from`: name the node-local folder to copy it to"
    if _inside(dst, src):
        return f"lies inside its `from` ({src}): the copy would copy itself"
    if _inside(src, dst):
        return f"holds its `from` ({src}): the copy would replace its own source"
    return None


def first_node_launcher(data: Mapping[str, Any]) -> str | None:
    """The launcher that starts the other nodes' ranks itself from the first node (mpirun, hydra, DeepSpeed's
    runner), for a job of more than one node (raw job data); None when each node runs its own rank."""
    elastic = mapping(mapping(data.get("fault_tolerance")).get("elastic"))
    sizes = [as_int(data.get("nodes", 1)), as_int(elastic.get("max_nodes"))]
    if max((n for n in sizes if n is not None), default=1) < 2:
        return None
    mode = data.get("mode")
    launcher = FIRST_NODE_LAUNCHES.get(str(mode))
    if mode == "pytorch-deepspeed":
        commands = [data.get("command"), *(mapping(t).get("command") for t in data.get("tasks") or [])]
        if any(program_name(c) == "deepspeed" for c in commands):
            launcher = "DeepSpeed's runner"
    return launcher


def _mode_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The copy is a step of each rank's run: a launcher that starts the other nodes' ranks itself (mpirun,
    hydra, DeepSpeed's runner) would leave those nodes without it."""
    launcher = first_node_launcher(data)
    mode = data.get("mode")
    if launcher is None:
        return []
    return [
        (
            ("data_prep",),
            f"in mode {mode}, {launcher} on the first node starts the ranks of the other nodes itself, so only the "
            "first node would copy the data sets: data_prep needs a mode where each node runs its own rank "
            "(pytorch, tensorflow) or a job of one node",
        )
    ]


def program_name(command: Any) -> str | None:
    try:
        argv = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        return None
    return posixpath.basename(argv[0]) if argv else None


# -- the cluster's rules, at submit ----------------------------------------------------------------------------


def check_admissible(spec: JobSpec, settings: DataPrepSettings, *, run_root: str, user: str) -> None:
    """UsageError unless every `to` lies inside one of the admin's `data_prep.roots` (at most MAX_DEPTH folders
    down) and away from the run root of `user`'s runs; a cluster with no roots takes no job with data_prep."""
    if not spec.data_prep:
        return
    if not settings.roots:
        raise UsageError(
            f"job {spec.name}: data_prep is refused here: this cluster names no node-local storage to copy data "
            "sets to (data_prep.roots in the cluster config is empty); ask an admin, or leave data_prep out"
        )
    roots = [_norm(r) for r in settings.roots]
    runs = _norm(run_root.replace("{user}", user))
    for i, data_set in enumerate(spec.data_prep):
        to = _norm(data_set.to)
        root = next((r for r in roots if _inside(to, r) and to != r), None)
        if root is None:
            raise UsageError(
                f"job {spec.name}: data_prep[{i}].to {data_set.to} is not inside this cluster's node-local storage "
                f"for data sets (data_prep.roots: {', '.join(settings.roots)}): choose a folder inside one of them"
            )
        depth = len(to[len(root) :].strip("/").split("/"))
        if depth > MAX_DEPTH:
            raise UsageError(
                f"job {spec.name}: data_prep[{i}].to {data_set.to} lies {depth} folders below {root}: at most "
                f"{MAX_DEPTH} (deeper ones would never be found to be cleaned)"
            )
        if _inside(to, runs) or _inside(runs, to):
            raise UsageError(
                f"job {spec.name}: data_prep[{i}].to {data_set.to} would be over this cluster's run folders "
                f"({runs}): choose another folder"
            )


# -- what the node runs ----------------------------------------------------------------------------------------


def node_params(data_sets: Sequence[DataSet], run_dir: str, settings: DataPrepSettings | None) -> str:
    """PARAMS of datacopy.py for one rank: its data sets, its run folder (a use a clean-up must wait for), the
    cluster's roots and retention (without `settings`, none given to the plan, nothing is cleaned up), and how long
    it may wait for another data_prep's lock on a `to` (data_prep.lock_wait; LOCK_WAIT_S without settings)."""
    doc = {
        "sets": [{"from": d.source, "to": d.to} for d in data_sets],
        "run_dir": run_dir,
        "roots": list(settings.roots) if settings is not None else [],
        "retention": settings.retention if settings is not None else 0.0,
        "progress": PROGRESS_S,
        "lock_wait": settings.lock_wait if settings is not None else LOCK_WAIT_S,
    }
    return json.dumps(doc, separators=(",", ":"))


def preparing(attempt: int, ranks: Sequence[tuple[int, str]]) -> str | None:
    """The Preparing condition's text for the ranks (rank, node) of an attempt now in their data step."""
    if not ranks:
        return None
    where = ", ".join(f"rank {rank} on {node}" for rank, node in sorted(ranks))
    return f"attempt {attempt}: copying data sets to node-local storage (data_prep): {where}"
