"""Container images (issue 17), the scheduler's side: the spec's `image` and `mounts`, the cluster's
`containers:` settings, which runtime of a node runs a job's ranks, and what the node is told to do.

- `Mount` and `container_problems`: the spec's keys and their checks (raw YAML data, like the other checks).
- `ContainerSettings` / `PoolContainers`: `containers: {runtime, ulimits}` in the cluster config, and a pool's
  `containers: {runtime}`.
- `pick_runtime`: the runtime of a node (its probe's `facts.runtimes`) that runs a job's ranks: the one the
  config names, or with `auto` the first usable of podman, docker, apptainer (singularity is apptainer's older
  name) that can give GPUs to a container; enroot is not run (refused in the config, with the reason).
- `container_step`: the "container" document of a rank's steps (see `scheduler/node/supervisor_container.py`, which
  builds the runtime's command on the node, where the user's uid and the node's devices are known).

Pure code.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_serializer

from ftconsole.scheduler.spec.specbase import Loc, Strict, Text, mapping

RUNTIMES = ("podman", "docker", "apptainer")  # what ftconsole starts containers with; `auto` tries them in order
ALIASES = {"singularity": "apptainer"}  # the same command line
NOT_RUN = {
    "enroot": "enroot (with pyxis) needs an import, a create and a start per image that ftconsole does not do "
    "yet: use podman, docker or apptainer (`apptainer exec docker://...` runs the same images)"
}
# how a runtime gives GPUs (the probe's labels, agent_runtimes.gpus_via) -> the supervisor's gpu_via, preferred first
GPU_VIA = {
    "podman": (("CDI", "cdi"), ("OCI hook", "hook")),
    "docker": (("CDI", "cdi"), ("--gpus (toolkit)", "gpus"), ("nvidia runtime", "nvidia-runtime")),
    "apptainer": (("--nv", "nv"),),
}
ULIMIT_NAMES = frozenset(
    ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
     "rttime", "sigpending", "stack")
)  # fmt: skip
MAX_MOUNTS = 32
_IMAGE = re.compile(r"^[^\s\-~][^\s]*$")
_LIMIT = re.compile(r"^(-1|\d+)(:(-1|\d+))?$")


# -- the job spec ----------------------------------------------------------------------------------------------


class Mount(Strict):
    """A folder of the node (`from`) seen in the container at `to`; `readonly`: the job cannot write it."""

    source: Text = Field(alias="from")
    to: Text
    readonly: bool = False

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.to, "readonly": self.readonly}


def _image(value: str) -> str:
    if not _IMAGE.match(value) or len(value) > 512:
        raise ValueError(
            f"{value!r} is not an image: a registry reference (nvcr.io/nvidia/pytorch:24.05-py3) or, for "
            "apptainer, a path to a SIF file on the nodes; no spaces, not starting with - or ~"
        )
    return value


Image = Annotated[str, AfterValidator(_image)]
Mounts = Annotated[list[Mount], Field(max_length=MAX_MOUNTS)]


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path.startswith("/") else path


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _path_problem(value: str, *, home: bool) -> str | None:
    if "\0" in value:
        return None  # `_nul_problems` says so
    if not (value.startswith("/") or (home and value.startswith("~/"))):
        where = " or start with ~/ (the home folder on the node)" if home else " (a path inside the container)"
        return f"must be an absolute path{where}, not {value!r}"
    if ".." in value.split("/"):
        return f"{value!r}: write the path without '..'"
    if ":" in value or "," in value:
        return f"{value!r}: a path with ':' or ',' cannot be given to the runtimes' mount options"
    return None


def container_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """The checks of `image` and `mounts` across keys, from raw job data (the models check each value)."""
    mounts = data.get("mounts")
    if not isinstance(mounts, list):
        return []
    out: list[tuple[Loc, str]] = []
    if mounts and data.get("image") is None:
        out.append((("mounts",), "mounts are the folders a container sees: give `image` too, or leave mounts out "
                    "(without an image the job runs on the node and sees its folders as they are)"))  # fmt: skip
    targets: dict[str, int] = {}
    for i, entry in enumerate(mounts):
        raw = mapping(entry)
        for key, home in (("from", True), ("to", False)):
            value = raw.get(key)
            problem = _path_problem(value, home=home) if isinstance(value, str) else None
            if problem is not None:
                out.append((("mounts", i, key), problem))
        to = raw.get("to")
        if not isinstance(to, str) or _path_problem(to, home=False) is not None:
            continue
        to = _norm(to)
        if to == "/":
            out.append((("mounts", i, "to"), "/ is the image's own root: mount the folder somewhere inside it"))
        elif to in targets:
            out.append((("mounts", i, "to"), f"{to} is also mounts[{targets[to]}].to: one mount per target"))
        targets.setdefault(to, i)
    return out


def image_mode_problems(
    data: Mapping[str, Any], first_node_launcher: str | None, own_launchers: Sequence[tuple[Loc, str]]
) -> list[tuple[Loc, str]]:
    """A job of several nodes whose first node starts every rank itself (`first_node_launcher`, from dataprep)
    runs in its image by the MPI hybrid model (scheduler/node/container_exec.py): mpirun on the host starts each MPI
    process in the runtime. That needs the mpirun line ftconsole writes, so a command that is its own launcher
    (`own_launchers`: where, and the program) is refused, as is DeepSpeed's runner, which has no program to wrap."""
    if data.get("image") is None or first_node_launcher is None:
        return []
    if first_node_launcher == "DeepSpeed's runner":
        return [
            (
                ("image",),
                "DeepSpeed's runner starts deepspeed.launcher.launch on every node over pdsh, outside any container, "
                "and has no program of each rank to start in it: with an image, use mode pytorch-deepspeed with a "
                "python command (each node runs torchrun in the image) or a job of one node",
            )
        ]
    return [
        (
            loc,
            f"{program} is ftconsole's to write for a job with an image in mode {data.get('mode')}: it starts each MPI "
            "process in the image through the runtime (the MPI hybrid model); give the program and its arguments "
            "without the launcher (mpirun's own options go in the job's env as OMPI_MCA_* or HYDRA_* variables)",
        )
        for loc, program in own_launchers
    ]


def run_root_problem(mounts: Sequence[Mount], run_root: str) -> str | None:
    """A mount over (or inside) the run folders would hide the hostfile: refused at submit where the run root
    is an absolute path (a ~ run root is checked on the node, where the home folder is known)."""
    if not run_root.startswith("/"):
        return None
    root = _norm(run_root.split("{user}")[0].rstrip("/") or "/")
    for i, mount in enumerate(mounts):
        to = _norm(mount.to)
        if _inside(root, to) or _inside(to, root):
            return f"mounts[{i}].to {mount.to} would be over this cluster's run folders ({run_root}): choose another"
    return None


# -- the cluster config ----------------------------------------------------------------------------------------


def _runtime_name(value: Any) -> Any:
    if isinstance(value, str) and value in NOT_RUN:
        raise ValueError(f"{value} is not supported: {NOT_RUN[value]}")
    if isinstance(value, str) and value in ALIASES:
        return ALIASES[value]
    return value


RuntimeName = Annotated[Literal["auto", "podman", "docker", "apptainer"], BeforeValidator(_runtime_name)]


def _ulimits(value: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, raw in value.items():
        if name not in ULIMIT_NAMES:
            raise ValueError(f"{name!r} is not a ulimit the runtimes know ({', '.join(sorted(ULIMIT_NAMES))})")
        text = "-1" if str(raw).strip().lower() in ("unlimited", "-1") else str(raw).strip()
        if isinstance(raw, bool) or not _LIMIT.match(text):
            raise ValueError(f"{name}: {raw!r} is not a limit: a number, soft:hard, or unlimited")
        out[name] = text if ":" in text else f"{text}:{text}"
    return out


class ContainerSettings(Strict):
    """`containers:` in the cluster config (docs/configuration.md): the runtime jobs with `image` run in (`auto`:
    the first usable one of podman, docker, apptainer that can give GPUs) and the ulimits podman and docker set
    in each container (apptainer's containers have the limits of the supervisor that starts them)."""

    runtime: RuntimeName = "auto"
    # replaces the default as a whole: a node that may not raise memlock (a container in a container) sets less
    ulimits: Annotated[dict[str, Any], AfterValidator(_ulimits)] = Field(default_factory=lambda: {"memlock": "-1:-1"})


class PoolContainers(Strict):
    """A pool's `containers:`: its own runtime."""

    runtime: RuntimeName


# -- a node's runtime --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime that runs a job's ranks on one node: its command line family, path and how it gives GPUs."""

    runtime: str  # podman, docker, apptainer
    path: str
    gpu_via: str | None  # the supervisor's name for it (cdi, gpus, nvidia-runtime, hook, nv); None: no GPUs


def _family(name: str) -> str:
    return ALIASES.get(name, name)


def pick_runtime(runtimes: Iterable[Mapping[str, Any]], wanted: str, *, gpus: bool = True) -> RuntimeChoice | None:
    """The runtime of a node's probe (`facts.runtimes` entries) that runs image jobs there, or None: `wanted`
    (a name, or `auto`: the first of RUNTIMES found), usable, and with `gpus` able to give GPUs."""
    found: dict[str, RuntimeChoice] = {}
    for entry in runtimes:
        family = _family(str(entry.get("name")))
        if family not in RUNTIMES or family in found or not entry.get("usable") or not entry.get("path"):
            continue
        labels = set(entry.get("gpus_via") or ())
        via = next((ours for label, ours in GPU_VIA[family] if label in labels), None)
        if gpus and via is None:
            continue
        found[family] = RuntimeChoice(family, str(entry["path"]), via)
    order = RUNTIMES if wanted == "auto" else (wanted,)
    return next((found[name] for name in order if name in found), None)


def why_not(runtimes: Iterable[Mapping[str, Any]], wanted: str) -> str:
    """Why `pick_runtime` found none on a node: for a launch that finds the node changed since placement."""
    entries = list(runtimes)
    if not entries:
        return "no container runtime was found on its PATH"
    named = [e for e in entries if wanted == "auto" or _family(str(e.get("name"))) == wanted]
    if not named:
        return f"it has no {wanted} (found: {', '.join(str(e.get('name')) for e in entries)})"
    texts = []
    for e in named:
        if not e.get("usable"):
            texts.append(f"{e.get('name')} is not usable: {e.get('problem') or 'no reason given'}")
        else:
            texts.append(f"{e.get('name')} cannot give GPUs to a container (no CDI spec, toolkit or --nv)")
    return "; ".join(texts)


def container_step(
    choice: RuntimeChoice,
    *,
    image: str,
    name: str,
    gpus: Sequence[int],
    mounts: Sequence[Mount],
    shares: Iterable[str],
    settings: ContainerSettings,
) -> dict[str, Any]:
    """The "container" document of a rank's step (scheduler/node/supervisor_container.py)."""
    return {
        "runtime": choice.runtime,
        "path": choice.path,
        "image": image,
        "name": name,
        "gpus": list(gpus),
        "gpu_via": choice.gpu_via,
        "mounts": [m.model_dump() for m in mounts],
        "shares": sorted({s for s in shares if s}),
        "ulimits": dict(settings.ulimits) if choice.runtime != "apptainer" else {},
    }


def container_name(token: str, rank: int, task: int | None = None) -> str:
    """The container of a rank (and of its batch task): named by the attempt's token, so fencing and orphan
    cleanup find it like any run of the attempt."""
    return f"ft-{token}-r{rank}" + ("" if task is None else f"-t{task}")


def pulling(image: str, attempt: int, ranks: Sequence[tuple[int, str]]) -> str | None:
    """The Pulling condition's text for the ranks (rank, node) of an attempt now in their pull step."""
    if not ranks:
        return None
    where = ", ".join(f"rank {rank} on {node}" for rank, node in sorted(ranks))
    return f"attempt {attempt}: pulling image {image} (where a node lacks it): {where}"
