"""The job spec's keys for what the scheduler watches in a job's log (`progress:`, `performance:`): the
patterns, checked at submit as the node will use them (Python's `re`, with the named groups each needs)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from ftconsole.scheduler.spec.config import PositiveDuration, parse_duration
from ftconsole.scheduler.spec.specbase import Loc, Strict, as_int, given, is_off, mapping

# seed 001's straggler log line: `Rank:2 Epoch:[48]`
PROGRESS_PATTERN = r"Rank:\s*(?P<rank>\d+).*?Epoch:\s*\[?(?P<epoch>\d+)"
ERROR_PATTERN = r"Traceback \(most recent call last\)|NCCL error|CUDA error|RuntimeError:"
# seed 003's performance line: `this iteration hardware time is X and e2e time is Y ms`
PERFORMANCE_PATTERN = r"hardware time is\s*(?P<hw>[\d.]+)\D+?e2e time is\s*(?P<e2e>[\d.]+)"
MAX_PATTERN = 500  # characters


def _pattern(*needs: str) -> Any:
    def check(value: str) -> str:
        if value == "" and not needs:
            return value  # errors: off
        if len(value) > MAX_PATTERN:
            raise ValueError(f"a pattern is at most {MAX_PATTERN} characters")
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression (Python's re): {exc}") from None
        missing = [g for g in needs if g not in compiled.groupindex]
        if missing:
            named = ", ".join(f"(?P<{g}>...)" for g in missing)
            raise ValueError(f"the pattern needs the named group{'s' if len(missing) > 1 else ''} {named}")
        return value

    return AfterValidator(check)


def _errors(value: Any) -> Any:
    """`errors: off` (YAML may read a bare off as false): no error lines looked for, kept as ""."""
    return "" if is_off(value) else value


class HangAction(StrEnum):
    """What a suspected hang leads to: an alert, or also a restart through the job's fault tolerance."""

    ALERT = "alert"
    RESTART = "restart"


class Progress(Strict):
    """Seed 001's stragglers: each rank's epoch (or step) from its log lines; ranks more than `max_lag`
    apart for `window` are reported, and so is a rank whose log shows an error while the job runs on."""

    pattern: Annotated[str, _pattern("epoch")] = PROGRESS_PATTERN  # `rank` optional: else the node's rank
    max_lag: int = Field(1, ge=0)
    window: PositiveDuration = 600.0
    errors: Annotated[str, BeforeValidator(_errors), _pattern()] = ERROR_PATTERN  # off: "" (none looked for)
    enabled: bool = True  # `progress: off` reads as enabled false


def progress_off(value: Any) -> Any:
    """`progress: off` (YAML may read a bare off as false)."""
    if is_off(value):
        return {"enabled": False}
    return value


class SlowAction(StrEnum):
    """What a slow job leads to (seed 003): an alert only, or also a reschedule through its fault tolerance."""

    ALERT = "alert"
    RESCHEDULE = "reschedule"  # stopped (checkpoint signal first, with checkpoint_resume), queued again


class Performance(Strict):
    """Seed 003's performance detection: a job whose end-to-end iteration time is more than `ratio` times
    its hardware time for `iterations` iterations in a row is reported as slow; with `action: reschedule` it
    is also stopped and queued again, without the slow rank's node."""

    pattern: Annotated[str, _pattern("hw", "e2e")] = PERFORMANCE_PATTERN
    ratio: float = Field(1.5, gt=1)
    iterations: int = Field(5, ge=1, le=64)
    action: SlowAction = SlowAction.ALERT


def performance_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """`performance.action: reschedule` needs resubmits to spend: fault_tolerance.retries or checkpoint_resume."""
    perf, ft = mapping(data.get("performance")), mapping(data.get("fault_tolerance"))
    if perf.get("action") != SlowAction.RESCHEDULE:
        return []
    if as_int(ft.get("retries")) or given(ft, "checkpoint_resume"):
        return []
    why = "performance.action reschedule needs fault_tolerance.retries or checkpoint_resume: the resubmits it uses"
    return [(("performance", "action"), why)]


# -- the hang window (seed 001) --------------------------------------------------------------------------------

HANG_OFF = 0.0  # hang_detect: off, as stored
HANG_WINDOW_S = 1800.0  # the hang window when the spec names none (seed 001: 30 minutes)


def hang_detect_value(value: Any) -> float:
    """A positive duration, or `off` (YAML may read a bare off as false; stored as HANG_OFF)."""
    if is_off(value) or value == HANG_OFF:
        return HANG_OFF
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be greater than 0 (or off)")
    return seconds


def hang_minutes(env: Mapping[str, str]) -> float | None:
    """MA_HANG_DETECT_TIME (seed 001's platform: minutes) from a job's env; ValueError when it is not a
    positive number."""
    text = env.get("MA_HANG_DETECT_TIME")
    if text is None:
        return None
    try:
        minutes = float(text)
    except ValueError:
        raise ValueError(f"MA_HANG_DETECT_TIME is minutes, a positive number, not {text!r}") from None
    if not minutes > 0 or minutes == float("inf"):
        raise ValueError(f"MA_HANG_DETECT_TIME is minutes, a positive number, not {text!r}")
    return minutes


def hang_env_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    env = mapping(data.get("env"))
    try:
        hang_minutes({k: str(v) for k, v in env.items() if k == "MA_HANG_DETECT_TIME"})
    except ValueError as exc:
        return [(("env", "MA_HANG_DETECT_TIME"), str(exc))]
    return []
