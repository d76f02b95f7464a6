"""The records a deep queue keeps by the hundred thousand stay small: a Job is kept for every queued and running
job (100,000 in a deep queue), so an instance that grows a dict of its own (CPython 3.11 gives one to an object
of 30 attributes or more, unless it has slots) costs 190 MB there."""

from __future__ import annotations

import dataclasses
import tracemalloc

from ftconsole.scheduler.decide.jobs import Attempt, Job, JobStatus, Run
from ftconsole.scheduler.spec.jobspec import JobSpec


def _per_object(make, count: int = 2000) -> float:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make(i) for i in range(count)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(kept) == count
    return (after - before) / count


def test_a_job_takes_no_dict_of_its_own() -> None:
    spec = JobSpec.model_validate({"name": "t", "command": "true"})
    per_job = _per_object(
        lambda i: Job(i, "t", "u", 1000, spec, JobStatus.QUEUED, "normal", "default", "owner", float(i))
    )
    # about 330 bytes: its fields' pointers, and the float and int made for each; with a dict of its own, 1,700
    assert per_job < 1000, per_job


def test_the_records_kept_in_bulk_have_slots_or_few_fields() -> None:
    for cls in (Job, Attempt, Run):
        assert hasattr(cls, "__slots__") or len(dataclasses.fields(cls)) < 30, cls.__name__
