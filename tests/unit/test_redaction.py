"""What a caller reads of a job it may not read (access none, another user's, caller no admin): no id, name, owner or
cause in any text about something else (a node's reasons, events and alerts, a prediction), the rest kept."""

from __future__ import annotations

from typing import Any

import pytest

from ftconsole.scheduler.decide.placement import Place, Wait, WaitCause
from ftconsole.scheduler.redaction import HIDDEN_JOB, redact, redact_decision, redact_json

HIDDEN = frozenset({7, 12})


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a node's reason, as isolate() writes it: the node's state stays, the job and its cause go
        ("isolated: job 7 attempt 1: hardware fault: node01 unhealthy: gpu 0 ECC", f"isolated: {HIDDEN_JOB}"),
        ("job 7 attempt 1: hardware fault: node01 unhealthy", HIDDEN_JOB),
        ("job 12: hardware fault: rank 0 on node02 lost", HIDDEN_JOB),
        # the node_isolated alert and the isolated event
        ("node01 isolated by scheduler: job 7 attempt 2: pre-flight failed: node01 item gpu_ecc: fail 2 0",
         f"node01 isolated by scheduler: {HIDDEN_JOB}"),
        # inside parentheses: only up to the one that closes
        ("resumed by ann (was isolated: job 7 attempt 1: hardware fault: node01 unhealthy (ECC))",
         f"resumed by ann (was isolated: {HIDDEN_JOB})"),
        ("node01 is flaky: 3 faults within 1h (the last: 2024-05-01 10:00 isolated by scheduler: job 12: x; "
         "2024-05-01 10:05 unreachable); look at it",
         f"node01 is flaky: 3 faults within 1h (the last: 2024-05-01 10:00 isolated by scheduler: {HIDDEN_JOB}); "
         "look at it"),
        # a prediction, and a queued job's message
        ("blocked behind job 7 (head of queue)", f"blocked behind {HIDDEN_JOB}"),
        ("waiting (position 2): blocked behind job 12 (head of queue)",
         f"waiting (position 2): blocked behind {HIDDEN_JOB}"),
        ("job #7 (secret, root) failed: exit 1", HIDDEN_JOB),
        # jobs the caller may read stay as they are, and so does what follows them
        ("isolated: job 8 attempt 1: hardware fault: node01 unhealthy", None),
        ("blocked behind job 70 (head of queue)", None),
        ("job 1 then job 7: its cause", f"job 1 then {HIDDEN_JOB}"),
        ("job 77 and job 7", f"job 77 and {HIDDEN_JOB}"),
        # no job at all, or a word that only looks like one
        ("node01 unreachable: connection refused", None),
        ("jobs 7 and 12 are mentioned as a list", None),
        ("a blowjob 7 of nothing", None),
        ("", None),
    ],
)  # fmt: skip
def test_redact(text: str, shown: str | None) -> None:
    assert redact(text, HIDDEN) == (text if shown is None else shown)


@pytest.mark.parametrize("text", ["isolated: job 7 attempt 1: hardware fault", "blocked behind job 12 (head)"])
def test_nothing_is_redacted_for_a_caller_who_may_read_every_job(text: str) -> None:
    assert redact(text, frozenset()) == text


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ({"message": "isolated by scheduler: job 7: x", "data": {"reason": "job 7: x"}, "node": "node01", "job": None},
         {"message": f"isolated by scheduler: {HIDDEN_JOB}", "data": {"reason": HIDDEN_JOB}, "node": "node01",
          "job": None}),
        ({"reasons": ["isolated: job 12 attempt 1: y", "gpu 0: ECC uncorrectable 2"], "faults": 3},
         {"reasons": [f"isolated: {HIDDEN_JOB}", "gpu 0: ECC uncorrectable 2"], "faults": 3}),
        ([{"admin_reason": "job 7 attempt 1: z", "since": 1.5}], [{"admin_reason": HIDDEN_JOB, "since": 1.5}]),
        ({"job 7": "keys are kept"}, {"job 7": "keys are kept"}),
        # a job's id as a value, not a text: a preempted job's Stopping event names the job that took its GPUs
        ({"message": "preempted by job 12 (urgent): stopped", "data": {"attempt": 1, "preempted_by": 12,
          "lost_gpu_s": 60}},
         {"message": f"preempted by {HIDDEN_JOB}", "data": {"attempt": 1, "preempted_by": None, "lost_gpu_s": 60}}),
        ({"data": {"preempted_by": "7"}}, {"data": {"preempted_by": None}}),
        ({"data": {"preempted_by": 8, "attempt": 7}}, {"data": {"preempted_by": 8, "attempt": 7}}),
        ({"cloned_from": 7, "id": 9}, {"cloned_from": None, "id": 9}),
        ({"preempted_by": True}, {"preempted_by": True}),
        (None, None),
        (7, 7),
    ],
)  # fmt: skip
def test_redact_json(value: Any, shown: Any) -> None:
    assert redact_json(value, HIDDEN) == shown


@pytest.mark.parametrize(
    ("decision", "shown"),
    [
        (Wait("(this job)", "blocked behind job 7 (head of queue)", 3, cause=WaitCause.BLOCKED, ahead=("7", "8")),
         Wait("(this job)", f"blocked behind {HIDDEN_JOB}", 3, cause=WaitCause.BLOCKED, ahead=("8",))),
        (Wait("(this job)", "needs 2 GPUs", 2, ahead=("12", "7")), Wait("(this job)", "needs 2 GPUs", 2, ahead=())),
        (Wait("(this job)", "blocked behind job 8 (head of queue)", 1, ahead=("8",)), None),
        (Place("(this job)", 0, (("node01", (0,)),)), None),
    ],
)  # fmt: skip
def test_redact_decision(decision: Wait | Place, shown: Wait | Place | None) -> None:
    assert redact_decision(decision, HIDDEN) == (decision if shown is None else shown)


def test_a_value_that_names_no_job_is_what_redact_json_leaves_alone() -> None:
    """`may_name_a_job` False is sure: `redact_json` would change nothing (random values with and without
    mentions of hidden jobs, and with the keys whose values are job ids)."""
    import random

    from ftconsole.scheduler.redaction import may_name_a_job

    rng = random.Random(5)
    words = ["job 7", "job #7", "job 8 attempt 1: fault", "jobs", "job", "a job", "gpu3 hot", "isolated: job 7",
             "Job 7", "job7", "(was: job 7)", "", "x"]  # fmt: skip

    def value(depth: int) -> Any:
        roll = rng.random()
        if depth > 2 or roll < 0.3:
            return rng.choice([rng.choice(words), 7, 7.5, None, True])
        if roll < 0.6:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        keys = ["reasons", "held", "preempted_by", "cloned_from", "job", "name"]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randrange(4))}

    skipped = 0
    for _ in range(5000):
        v = value(0)
        if not may_name_a_job(v):
            skipped += 1
            assert redact_json(v, {7, 8}) == v, v
    assert skipped > 1000
