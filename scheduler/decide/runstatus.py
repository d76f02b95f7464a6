"""What a run's status says, as the scheduler keeps it (`RunStatus`), checked first.

What a node sends back about a run is untrusted input: status.json belongs to the run's user (see supervisor.py,
"Users"), who may write anything in it. Each field is checked by type and range (`status_problem`) before it is
used or stored; a document that fails reads state "lost" with the reason (UNREADABLE). Its texts (`error`,
`step`, `signal`, what a scan of output.log found) are kept without control characters (`usertext.clean`): an
escape sequence written there never reaches a terminal that shows the job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.decide.usertext import clean, clean_json

UNREADABLE = "its status file is unreadable: "
NODE_STATES = frozenset({"starting", "running", "exited", "failed", "lost", "orphaned", "absent", "foreign"})
PID_MAX = 1 << 22  # the kernel's largest pid_max
TICKS_MAX = 1 << 62  # a process start time in clock ticks since boot
COUNT_MAX = (1 << 63) - 1  # what SQLite's INTEGER holds
TIME_MAX = 1e11  # epoch seconds (the year 5138)


def _int_in(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _time(value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and 0 <= value < TIME_MAX


def _text(most: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and len(v) <= most


def _scan(value: Any) -> bool:
    """A scan of output.log as the supervisor's `_scan` answers it: {"to", "matches": name -> [groups], "error"}."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return False
    matches = value.get("matches", {})
    return (
        (value.get("to") is None or _int_in(0, COUNT_MAX)(value["to"]))
        and (value.get("error") is None or isinstance(value["error"], str))
        and isinstance(matches, dict)
        and all(isinstance(found, list) and all(isinstance(m, dict) for m in found) for found in matches.values())
    )


# the node's key -> (RunStatus field, check, what it must be); every key is optional (None: not known)
_STATUS_FIELDS: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "pid": ("pid", _int_in(1, PID_MAX), "a pid"),
    "supervisor_pid": ("supervisor_pid", _int_in(1, PID_MAX), "a pid"),
    "supervisor_start": ("supervisor_start", _int_in(0, TICKS_MAX), "a start time in clock ticks"),
    "pid_start": ("pid_start", _int_in(0, TICKS_MAX), "a start time in clock ticks"),
    "started": ("started", _time, "a time"),
    "ended": ("ended", _time, "a time"),
    "stop_requested": ("stop_requested", _time, "a time"),
    "exit_code": ("exit_code", _int_in(0, 255), "an exit status (0 to 255)"),
    "signal": ("signal", _text(32), "a signal name"),
    "error": ("error", _text(12000), "a text of at most 12000 characters"),
    "step": ("step", _text(1000), "a step name"),
    "token": ("token", _text(200), "a token"),
    "boot_id": ("boot_id", _text(100), "a boot id"),
    "output_mtime": ("output_at", _time, "a time"),
    "output_size": ("output_size", _int_in(0, COUNT_MAX), "a size"),
    "io": ("io", _int_in(0, COUNT_MAX), "an I/O count"),
    "scan": ("scan", _scan, "a scan of output.log"),
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def status_problem(doc: Any) -> str | None:
    """What is wrong with a run's status document as a node sent it (None: nothing)."""
    if not isinstance(doc, dict):
        return f"not a JSON object but {type(doc).__name__}"
    if not isinstance(doc.get("state"), str) or doc["state"] not in NODE_STATES:
        return f"state {_shown(doc.get('state'))} is not one of {', '.join(sorted(NODE_STATES))}"
    for key, (_, check, what) in _STATUS_FIELDS.items():
        if doc.get(key) is not None and not check(doc[key]):
            return f"{key} {_shown(doc[key])} is not {what}"
    return None


@dataclass(frozen=True)
class RunStatus:
    """What status.json of one run says (see supervisor.py)."""

    # starting | running | exited | failed | lost | orphaned (supervisor dead, its processes alive) | absent (no
    # status.json in a run folder asked for) | foreign (another attempt's run) | refused (start: claimed by another)
    state: str
    pid: int | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    stop_requested: float | None = None
    error: str | None = None
    step: str | None = None  # the step running (at the end: the last one run), for a run of several steps
    run_dir: str | None = None  # the run folder's absolute path on the node, where the supervisor said it
    output_at: float | None = None  # output.log's mtime (status action only; None before it exists)
    output_size: int | None = None
    token: str | None = None  # the attempt token the run folder is claimed by
    boot_id: str | None = None  # the node's boot when the run started
    supervisor_pid: int | None = None
    supervisor_start: int | None = None  # start time of the supervisor (clock ticks since boot)
    pid_start: int | None = None  # start time of the step's process (the leader of its process group)
    io: int | None = None  # running: the I/O counters summed over its process group (the hang detector's)
    scan: dict[str, Any] | None = None  # what a scan of output.log asked for found (see supervisor `_scan`)

    def __post_init__(self) -> None:
        # the user's words, however the status was made (from_json, a refusal quoting the claim file): without
        # control characters (token and boot_id stay as sent: they are compared, never shown as text)
        for name in ("error", "step", "signal"):
            text = getattr(self, name)
            if text is not None:
                object.__setattr__(self, name, clean(text))
        if self.scan is not None:
            object.__setattr__(self, "scan", clean_json(self.scan))

    @classmethod
    def from_json(cls, doc: Any) -> RunStatus:
        """The status a node sent, each field checked by type and range (`status_problem`); a document that is
        not what the supervisor writes reads lost, with what is wrong (its user may write anything in it). Its
        texts are kept without control characters (see `__post_init__`)."""
        problem = status_problem(doc)
        if problem is not None:
            return cls(state="lost", error=UNREADABLE + problem)
        fields = {name: doc[key] for key, (name, _, _) in _STATUS_FIELDS.items() if doc.get(key) is not None}
        return cls(state=doc["state"], **fields)

    @property
    def finished(self) -> bool:
        return self.state in ("exited", "failed", "lost", "absent", "foreign", "refused")

    @property
    def succeeded(self) -> bool:
        return self.state == "exited" and self.exit_code == 0


@dataclass(frozen=True)
class NodeRun:
    job: str
    attempt: str
    rank: str
    status: RunStatus


def missing(run: Run, status: RunStatus) -> str:
    if status.state == "foreign":
        return f"its run folder {run.run_dir} on {run.node} now holds another attempt's run"
    return f"its run folder {run.run_dir} on {run.node} has no status (removed on the node?)"


def status_fields(status: RunStatus) -> dict[str, Any]:
    return {
        "state": status.state,
        "pid": status.pid,
        "exit_code": status.exit_code,
        "signal": status.signal,
        "started": status.started,
        "ended": status.ended,
        "error": status.error,
        "boot_id": status.boot_id,
        "supervisor_pid": status.supervisor_pid,
        "supervisor_start": status.supervisor_start,
        "pid_start": status.pid_start,
    }
