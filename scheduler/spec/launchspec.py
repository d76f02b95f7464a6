"""The job spec's `launcher:` key (the options of the launcher a job's mode runs) and the submit checks about
what the launcher does with a job (`launcher.py`): torchrun's options only where a command is wrapped in
torchrun, and env values that DeepSpeed's env file can carry. Pure code; `jobspec` holds the model and runs
the checks (its `SUBMIT_CHECKS`), which read raw YAML data."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from ftconsole.scheduler.spec.command import check_command
from ftconsole.scheduler.spec.config import PositiveDuration
from ftconsole.scheduler.spec.specbase import Loc, Strict, given, mapping
from ftconsole.scheduler.spec.torchwrap import wraps_in_torchrun

_IFACE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def _valid_iface(value: str) -> str:
    if not _IFACE.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"invalid network interface name {value!r}: use 1 to 15 letters, digits, '_', '.', ':' or '-' "
            "(as eth0, ib0 or enp65s0f0)"
        )
    return value


class Launcher(Strict):
    """Options of the launcher the job's mode runs (seed 002), each for one mode only (`LAUNCHER_MODES`).

    `torchrun_max_restarts` is torchrun's own restart of its workers, on the node, within one attempt; it is
    not `fault_tolerance.max_restarts`, the scheduler's restart of the whole job, and the two multiply."""

    torchrun_max_restarts: int | None = Field(None, ge=0, strict=True)
    torchrun_monitor_interval: PositiveDuration | None = None
    hydra_iface: Annotated[str, AfterValidator(_valid_iface)] | None = None


# -- submit checks ----------------------------------------------------------------------------------------


def torchrun_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """torchrun's options apply only where mode pytorch wraps a command in torchrun (launcher.py's rule, which
    may change: so a submit check); a command left as given (torchrun, a script) would ignore them."""
    launcher = mapping(data.get("launcher"))
    keys = [key for key in ("torchrun_max_restarts", "torchrun_monitor_interval") if given(launcher, key)]
    tasks = data.get("tasks")
    batch = data.get("type", "regular") == "batch"
    asked = [mapping(t).get("command") for t in tasks] if batch and isinstance(tasks, list) else [data.get("command")]
    if not keys or data.get("mode", "single") != "pytorch" or not asked:
        return []
    commands = [c for c in asked if isinstance(c, str) and check_command(c) is None]
    if len(commands) < len(asked) or any(wraps_in_torchrun(shlex.split(c)) for c in commands):
        return []  # wrapped, or a command that the model reports
    which = "no task's command is wrapped" if batch else f"{commands[0].strip()!r} is run as given"
    return [
        (
            ("launcher", key),
            f"{key} sets an option of the torchrun that ftconsole wraps a python command in (python SCRIPT, or "
            f"python -m MODULE other than torch.distributed.run), and {which}: pass "
            f"--{key.removeprefix('torchrun_')} to your own launcher, or remove the key",
        )
        for key in keys
    ]


def deepspeed_env_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """DS_ENV_FILE is ours (the file that carries the env to every rank); with DeepSpeed's runner, each value
    travels as one line of that file, which strips blanks at either end and cannot hold a line break."""
    out: list[tuple[Loc, str]] = []
    env = mapping(data.get("env"))
    if "DS_ENV_FILE" in env:
        out.append(
            (("env", "DS_ENV_FILE"), "DS_ENV_FILE is set by ftconsole (it carries env: to every rank); remove it")
        )
    if data.get("mode", "single") == "pytorch-deepspeed":
        for key, value in env.items():
            if isinstance(value, str) and ("\n" in value or "\r" in value or value != value.strip()):
                why = "a line break" if "\n" in value or "\r" in value else "blanks at its start or end"
                out.append(
                    (("env", key), f"has {why}, which DeepSpeed's env file (one KEY=VALUE line each) cannot carry")
                )
    return out
