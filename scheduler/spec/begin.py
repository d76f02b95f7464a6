"""`begin:` in a job spec (Slurm's `sbatch --begin`): the job is not placed before this time. Pure.

A time is an ISO date and time (`2026-11-28T16:00`, `2026-11-28 16:00:00+01:00`; without an offset, the
scheduler's local time), or `+` and a duration after the job's submission (`+2h`, `+90m`). A date alone is
midnight at its start. The spec keeps the text as given; `begin_at` reads it against the submission time.
"""

from __future__ import annotations

import datetime
import functools
import time
from typing import Any

from ftconsole.scheduler.spec.values import parse_duration


def parse_begin(value: Any) -> str:
    """The text of a `begin:` value (YAML reads a date as a date: taken back as text); ValueError where it is none."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if not isinstance(value, str):
        raise ValueError(f"a date and time (2026-11-28T16:00) or a time after the submit (+2h), not {value!r}")
    text = value.strip()
    if text.startswith("+"):
        try:
            if parse_duration(text[1:]) <= 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"{text!r}: + and a duration after the submit, such as +30m, +2h or +1d") from None
        return text
    try:
        datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: a date and time (2026-11-28T16:00, local) or a time after the submit (+2h)"
        ) from None
    return text


@functools.lru_cache(maxsize=4096)
def begin_at(text: str, submitted: float) -> float:
    """When a job whose spec says `begin: text`, submitted at `submitted`, may be placed (seconds since the epoch).
    Kept: each pass asks it of every queued job with a `begin:` (an array's tasks share both arguments)."""
    if text.startswith("+"):
        return submitted + parse_duration(text[1:])
    return datetime.datetime.fromisoformat(text).timestamp()  # no offset: this machine's local time


def waits_for(text: str, submitted: float, now: float) -> str | None:
    """Why the job waits for its begin time (None: it has come)."""
    at = begin_at(text, submitted)
    return None if at <= now else _note(at)


@functools.lru_cache(maxsize=4096)
def _note(at: float) -> str:
    return f"waiting: not before {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))} (its begin:)"


def from_command_line(text: str, now: float) -> str:
    """`submit --begin WHEN` as a `begin:` value: `+2h` as it is, `16:00` the next time it is 16:00 here, a date and
    time in this machine's local time, given with its offset (the scheduler may run in another zone)."""
    text = text.strip()
    if text.startswith("+"):
        return parse_begin(text)
    try:
        clock = datetime.time.fromisoformat(text)
    except ValueError:
        clock = None
    if clock is not None and ":" in text:
        today = datetime.datetime.fromtimestamp(now).astimezone()
        at = today.replace(hour=clock.hour, minute=clock.minute, second=clock.second, microsecond=0)
        if at.timestamp() <= now:
            at += datetime.timedelta(days=1)
        return at.isoformat()
    parse_begin(text)
    at = datetime.datetime.fromisoformat(text)
    return (at if at.tzinfo is not None else at.astimezone()).isoformat()
