"""What a caller who may not read a job sees of it: every mention of a private job, and what a text says of it,
replaced by `HIDDEN_JOB` in node reasons, events, alerts, probe results and predictions. Pure; tested from tables
(tests/unit/test_redaction.py)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from typing import Any

from ftconsole.scheduler.decide import placement
from ftconsole.scheduler.nodeops import ProbeOutcome

HIDDEN_JOB = "a job you cannot see"  # what a caller reads in place of a job it may not read
_JOB_MENTION = re.compile(r"\bjob #?(\d+)\b")
# the keys of an event's data whose value is a job's id (not a text that `redact` reads): a hidden one reads null
JOB_ID_KEYS = frozenset({"preempted_by", "cloned_from"})


def redact(text: str, hidden: Collection[int]) -> str:
    """`text` with every mention of a job in `hidden` (``job 7``, ``job 7 attempt 1``) and what it says of that
    job replaced by `HIDDEN_JOB`; the rest is kept (a node's name, state, who acted and when).

    What a text says of a job follows its mention to the end of the clause: the end of the text, or the ``)`` that
    closes a parenthesis opened before the mention. So ``isolated: job 7 attempt 1: hardware fault: ...`` reads
    ``isolated: a job you cannot see`` and ``resumed by ann (was isolated: job 7: ...)`` reads ``resumed by ann
    (was isolated: a job you cannot see)``: the job's id, name, owner and cause all go. Pure; tested from tables.
    """
    if not hidden or "job" not in text:
        return text
    out: list[str] = []
    pos = 0
    while (found := _JOB_MENTION.search(text, pos)) is not None:
        if int(found[1]) not in hidden:
            out.append(text[pos : found.end()])
            pos = found.end()
            continue
        out.append(text[pos : found.start()] + HIDDEN_JOB)
        pos = _clause_end(text, found.end())
    out.append(text[pos:])
    return "".join(out)


def _clause_end(text: str, start: int) -> int:
    """Where the clause that goes on at `start` ends: at a ``)`` with no ``(`` of its own after `start`, else at
    the end of the text."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            if depth == 0:
                return i
            depth -= 1
    return len(text)


def redact_json(value: Any, hidden: Collection[int]) -> Any:
    """A JSON value with `redact` applied to every string in it (keys are left as they are), and every job id
    under a key of `JOB_ID_KEYS` (an event's ``preempted_by``) that names a job in `hidden` made null."""
    if not hidden:
        return value
    if isinstance(value, str):
        return redact(value, hidden)
    if isinstance(value, list):
        return [redact_json(v, hidden) for v in value]
    if isinstance(value, dict):
        return {k: None if k in JOB_ID_KEYS and _names_hidden(v, hidden) else redact_json(v, hidden)
                for k, v in value.items()}  # fmt: skip
    return value


def may_name_a_job(value: Any) -> bool:
    """Whether `redact_json` could change anything in a JSON value: whether a text in it holds `job ` (every
    mention `redact` looks for does) or a dict in it has a key of `JOB_ID_KEYS`. A third of `redact_json`'s time,
    which builds every container again: at 1,000 nodes, what `nodes_changed` masks each second for a caller who
    may not see some jobs, and most node views name no job. False is sure; True may not be (`job 9`, not hidden)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "job " in item:
                return True
        elif isinstance(item, dict):
            if not JOB_ID_KEYS.isdisjoint(item):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _names_hidden(value: Any, hidden: Collection[int]) -> bool:
    """Whether a job id (a number, or its digits as text) is one of `hidden`."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    return isinstance(value, int) and value in hidden


def redact_outcome(outcome: ProbeOutcome, hidden: Collection[int]) -> ProbeOutcome:
    h = outcome.health
    health = dataclasses.replace(
        h, admin_reason=redact(h.admin_reason, hidden), reasons=tuple(redact(r, hidden) for r in h.reasons)
    )
    return dataclasses.replace(outcome, health=health)


def redact_decision(decision: placement.Decision, hidden: Collection[int]) -> placement.Decision:
    """A prediction as a caller who may not read the `hidden` jobs sees it: its reason redacted (``blocked
    behind a job you cannot see``), those jobs left out of `ahead` (its queue position still counts them)."""
    if not hidden or not isinstance(decision, placement.Wait):
        return decision
    ahead = tuple(j for j in decision.ahead if not (j.isdigit() and int(j) in hidden))
    return dataclasses.replace(decision, reason=redact(decision.reason, hidden), ahead=ahead)
