"""Failpoints: named points in the scheduler where a test can crash, fail or slow it (TiKV's fail-rs, etcd's gofail).

A point is one call between two steps, named after the step (``await afailpoint("launch.after_send")``); the
environment variable ``FTCONSOLE_FAILPOINTS`` says what happens there::

    FTCONSOLE_FAILPOINTS=launch.after_send=crash,tick.after_snapshot=delay(2),observe.after_read=2*error

``NAME=ACTION`` entries, separated by commas. Actions:

- ``crash``: the process dies at once, as by ``kill -9`` (SIGKILL to itself): no cleanup, no flush, no
  ``finally``; only one line goes to stderr first, straight to the file descriptor, naming the point.
- ``error``: raise `FailpointError` (an `FtError`) naming the point.
- ``delay(SECONDS)``: sleep that long (``afailpoint`` with ``asyncio.sleep``, so the event loop goes on).
- ``off``: nothing.

An action may start with a count, ``N*ACTION`` (as in fail-rs): the first N hits act, the later ones do not.

Every point is registered in `POINTS` with one line that says where it is; a name that is not registered is
refused, in the variable (`FailpointSpecError`, with the known names) and in the code (`UnknownFailpoint`,
a programming error), because a failpoint accepted and never hit would make a crash test pass for nothing.
The variable is read once, when this module is imported; `configure` replaces it in tests. When no point is
configured a hit costs one dict lookup and an increment (`hits` counts every hit, for tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
import time
from dataclasses import dataclass
from enum import StrEnum

from ftconsole.scheduler.errors import FtError, UsageError

ENV = "FTCONSOLE_FAILPOINTS"

POINTS: dict[str, str] = {
    # One line per point: "name": "where it is, between which two steps". Keep them sorted by step.
    "tick.after_snapshot": "a tick has read its snapshot (store and node observations), before it decides",
    "place.after_record": "a placement (the new attempt and its run intents) is in the store, before any launch",
    "launch.before_send": "a run's launch is recorded as intent, before the start command goes to its node",
    "launch.after_send": "the start command went to the node (the run may be running), before the outcome is stored",
    "launch.after_record": "the launch outcome is in the store",
    "observe.after_read": "the nodes' run states were read, before they are stored",
    "observe.after_record": "the observed run states are in the store",
    "stop.after_send": "a stop went to a node, before its outcome is stored",
    "checkpoint.before_signal": "a checkpoint signal is owed in the store (with its decision), before it is sent",
    "recover.after_record": "a failed attempt's restart (requeue or a new attempt in place) is in the store",
}
"""Every failpoint the code may hit, with where it is. Adding a point: one line here, one call in the code."""


class FailpointError(FtError):
    """Raised at a failpoint configured with ``error``."""

    title = "failpoint"

    def __init__(self, name: str) -> None:
        super().__init__(f"failpoint {name}: injected error")
        self.name = name


class FailpointSpecError(UsageError):
    """``FTCONSOLE_FAILPOINTS`` (or the spec given to `configure`) cannot be read."""

    title = "failpoints"


class UnknownFailpoint(LookupError):
    """The code hit a failpoint that `POINTS` does not register: a programming error."""


class Kind(StrEnum):
    OFF = "off"
    CRASH = "crash"
    ERROR = "error"
    DELAY = "delay"


@dataclass(frozen=True)
class Action:
    """What a point does: `kind`, `seconds` for a delay, `count` hits before it turns off (None: every hit)."""

    kind: Kind
    seconds: float = 0.0
    count: int | None = None

    def __str__(self) -> str:
        what = f"delay({self.seconds:g})" if self.kind is Kind.DELAY else self.kind.value
        return what if self.count is None else f"{self.count}*{what}"


@dataclass
class _Point:
    """A point's state: its action (None: off), hits left before it turns off (None: no limit), hits so far."""

    action: Action | None = None
    left: int | None = None
    hits: int = 0


_ENTRY = re.compile(r"^(?:(?P<count>[^*]*)\*)?(?P<action>.*)$", re.DOTALL)
_COUNT = re.compile(r"[0-9]+")
_DELAY = re.compile(r"^delay\((?P<seconds>[^()]*)\)$")
_ACTIONS = "off, crash, error, delay(SECONDS), each with an optional count N* (as 2*error)"


def _known() -> str:
    return ", ".join(POINTS)


def _unknown(name: str) -> str:
    return f"unknown failpoint {name!r}; known: {_known()}"


def parse_action(text: str) -> Action:
    """``[N*](off|crash|error|delay(SECONDS))`` as an `Action`; ValueError saying what is wrong."""
    match = _ENTRY.match(text.strip())
    assert match is not None  # the pattern matches any text
    count_text, word = match["count"], match["action"].strip()
    count = None
    if count_text is not None:
        if not _COUNT.fullmatch(count_text.strip()) or int(count_text) < 1:
            raise ValueError(f"the count in {text.strip()!r} must be a whole number, 1 or more")
        count = int(count_text)
    if word in (Kind.OFF, Kind.CRASH, Kind.ERROR):
        if word == Kind.OFF and count is not None:
            raise ValueError("'off' takes no count")
        return Action(Kind(word), count=count)
    delay = _DELAY.match(word)
    if delay is None:
        raise ValueError(f"unknown action {word!r}; one of: {_ACTIONS}")
    try:
        seconds = float(delay["seconds"])
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"delay needs a number of seconds, 0 or more, as delay(2) or delay(0.5), not {word!r}")
    return Action(Kind.DELAY, seconds, count)


def parse(spec: str, source: str = ENV) -> dict[str, Action]:
    """``NAME=ACTION,...`` as {name: action}; FailpointSpecError naming `source` and the faulty entry."""
    out: dict[str, Action] = {}
    for entry in spec.split(","):
        if not entry.strip():
            continue  # a blank entry, as after a trailing comma
        name, equals, action = (part.strip() for part in entry.partition("="))
        if not equals or not name:
            raise FailpointSpecError(f"{source}: {entry.strip()!r} is not NAME=ACTION")
        if name not in POINTS:
            raise FailpointSpecError(f"{source}: {_unknown(name)}")
        if name in out:
            raise FailpointSpecError(f"{source}: failpoint {name!r} is given twice")
        try:
            out[name] = parse_action(action)
        except ValueError as exc:
            raise FailpointSpecError(f"{source}: {name}: {exc}") from None
    return out


_points: dict[str, _Point] = {}


def configure(spec: str | None, source: str = "failpoints") -> None:
    """Replace every point's action by `spec` (``NAME=ACTION,...``) and zero the hit counts; None: all off.

    The spec is read whole before anything changes: a bad one raises FailpointSpecError and leaves the
    points as they were.
    """
    actions = parse(spec, source) if spec is not None else {}
    _points.clear()
    for name in POINTS:
        action = actions.get(name)
        if action is not None and action.kind is Kind.OFF:
            action = None
        _points[name] = _Point(action, action.count if action else None)


def hits(name: str) -> int:
    """How many times the code passed point `name` since the last `configure` (or the import)."""
    if name not in POINTS:
        raise UnknownFailpoint(_unknown(name))
    point = _points.get(name)
    return point.hits if point else 0


def active() -> dict[str, str]:
    """The points that act now, as {name: action} (for a log line at start), in `POINTS` order."""
    return {name: str(p.action) for name, p in _points.items() if p.action is not None}


def _hit(name: str) -> Action | None:
    """Count a pass of point `name`; the action to carry out now, if any."""
    try:
        point = _points[name]
    except KeyError:
        if name not in POINTS:
            raise UnknownFailpoint(_unknown(name)) from None
        point = _points[name] = _Point()  # registered after `configure` ran: off
    point.hits += 1
    if point.action is None:
        return None
    action = point.action
    if point.left is not None:
        point.left -= 1
        if point.left <= 0:
            point.action = None
    return action


def _crash(name: str) -> None:
    with contextlib.suppress(OSError):  # no stderr: die all the same
        os.write(2, f"ftconsole: failpoint {name}: crash (SIGKILL)\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)  # not reached: SIGKILL to oneself is delivered before kill() returns


def _act(name: str, action: Action) -> None:
    if action.kind is Kind.CRASH:
        _crash(name)
    elif action.kind is Kind.ERROR:
        raise FailpointError(name)


def failpoint(name: str) -> None:
    """Pass point `name` in synchronous code: crash, raise FailpointError, sleep (blocking) or nothing."""
    action = _hit(name)
    if action is None:
        return
    if action.kind is Kind.DELAY:
        time.sleep(action.seconds)
    else:
        _act(name, action)


async def afailpoint(name: str) -> None:
    """Pass point `name` in a coroutine: as `failpoint`, but a delay sleeps without blocking the event loop."""
    action = _hit(name)
    if action is None:
        return
    if action.kind is Kind.DELAY:
        await asyncio.sleep(action.seconds)
    else:
        _act(name, action)


configure(os.environ.get(ENV) or None, ENV)
