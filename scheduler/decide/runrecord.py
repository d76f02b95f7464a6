"""What the scheduler writes of a run when its node answers for it (pure).

The node's answer is the run's status.json as the run's user left it (see runstatus.py): a claim about their own
job. It may say how the run ended; it never says when, nor which boot it started in (DESIGN.md, "Claims and
evidence"). So a run's `started` is the time the scheduler sent its start (for a run it adopted, the time it
first read it), its `ended` the time the scheduler first read its end: usage, fair share, quotas and goodput
count the GPUs held from then to then, as the scheduler's own clock saw it (Slurm's accounting takes a step's
times from slurmd, never from the task). The boot id is the one the start answered; a later read cannot change
it (a reboot is the scheduler's to see: its probe reads the node's boot, reconcile compares).
"""

from __future__ import annotations

from typing import Any

from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.decide.runstatus import RunStatus, status_fields

_NEVER_RAN = frozenset({"refused", "absent", "foreign"})  # nothing of the run started on the node


def recorded(run: Run, status: RunStatus, now: float, *, sent: float | None = None) -> dict[str, Any]:
    """The run's columns to write from `status`, its node's answer read at `now` (`run`: as the store has it;
    `sent`: when its start was sent, for the answer to it: a run that ended before its start was answered held
    its GPUs from then)."""
    fields = status_fields(status)
    del fields["started"], fields["ended"]
    if status.state not in _NEVER_RAN and run.started is None:
        fields["started"] = sent if sent is not None else now
    if status.finished and run.ended is None:
        fields["ended"] = now
    if run.boot_id is not None:
        del fields["boot_id"]
    return fields
