"""Job arrays (spec/arrayspec.py, decide/arrays.py): the `array` key, task names, the throttle, and how the
store writes an array's tasks."""

from __future__ import annotations

import pytest

from ftconsole.scheduler.decide.arrays import Task, hold_back, summary
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.spec.arrayspec import MAX_TASKS, Array, parse, ref
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.store.db import Store
from tests.unit.conftest import StoreAt


@pytest.mark.parametrize(
    ("text", "indexes", "limit", "shown"),
    [
        ("0-99%8", tuple(range(100)), 8, "0-99%8"),
        ("1,3,5-7", (1, 3, 5, 6, 7), None, "1,3,5-7"),
        ("0-30:10%2", (0, 10, 20, 30), 2, "0,10,20,30%2"),
        ("7", (7,), None, "7"),
        (" 2-4 , 9 ", (2, 3, 4, 9), None, "2-4,9"),
    ],
)
def test_the_array_key_expands_to_its_indexes(
    text: str, indexes: tuple[int, ...], limit: int | None, shown: str
) -> None:
    array = parse(text)
    assert array == Array(indexes, limit) and str(array) == shown


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "is not N, N-M or N-M:STEP"),
        ("5-2", "'5-2' ends before it starts"),
        ("0-9:0", "the step must be at least 1"),
        ("0-9%0", "the limit after % must be a whole number of at least 1"),
        ("0-9%x", "the limit after % must be"),
        ("-1", "is not N, N-M"),
        ("1,2,2", "index 2 given twice"),
        (f"0-{MAX_TASKS}", f"more than {MAX_TASKS:,} tasks"),
        ("0-2000000", "indexes go up to 1,000,000"),
    ],
)
def test_a_bad_array_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("%", "%")):
        parse(text)


def test_a_spec_keeps_the_array_as_ranges_and_refuses_a_bad_one_with_its_key() -> None:
    spec = JobSpec.from_json({"name": "sweep", "command": "python train.py", "array": "0,1,2,3,10%2"})
    assert spec.array == "0-3,10%2"
    assert JobSpec.from_json({"name": "one", "command": "true", "array": 5}).array == "5"
    with pytest.raises(ValueError, match="array"):
        JobSpec.from_json({"name": "bad", "command": "true", "array": "3-1"})


def test_a_task_is_named_by_its_array_and_index() -> None:
    assert ref("12[7]") == (12, 7) and ref(" #12[0] ") == (12, 0)
    assert ref("12") is None and ref("12[x]") is None and ref("12[7") is None


def test_the_throttle_lets_the_first_tasks_in_queue_order_run_up_to_the_limit() -> None:
    queue = [Task("1", 1, 2), Task("2", 1, 2), Task("3", 1, 2), Task("9", 9, None), Task("20", 20, 1)]
    assert hold_back(queue, {}) == {"3": "array 1 runs at most 2 tasks at once (0 running)"}
    assert hold_back(queue, {1: 1, 20: 1}) == {
        "2": "array 1 runs at most 2 tasks at once (1 running)",
        "3": "array 1 runs at most 2 tasks at once (1 running)",
        "20": "array 20 runs at most 1 task at once (1 running)",
    }


def test_a_summary_counts_the_tasks_per_status_in_the_order_of_a_life() -> None:
    assert summary(["succeeded", "queued", "running", "queued", "error"]) == "queued 2, running 1, succeeded 1, error 1"


async def test_an_arrays_tasks_are_written_at_once_each_naming_the_array_by_its_first(store_at: StoreAt) -> None:
    """`JobTx.add_tasks`, on both engines: the indexes in the order given (not sorted), the first task's id names
    the array in every task, each task stamped for the job feed."""
    spec = JobSpec.from_json({"name": "sweep", "command": "true", "array": "5,1,3"})
    job = Job(0, "sweep", "ann", 1000, spec, JobStatus.QUEUED, "normal", "default", "none", 0.0)
    async with await Store.open(store_at()) as store:
        async with store.jobs_tx("an earlier job") as tx:
            earlier = await tx.add_job(job)
        cursor, _, _ = await store.jobs_changed(None)
        async with store.jobs_tx("submit an array") as tx:
            ids = await tx.add_tasks(job, [5, 1, 3])
        assert ids[5] < ids[1] < ids[3] and ids[5] > earlier  # written in the order given: the first names it
        tasks = {j.id: j for j in await store.jobs() if j.id != earlier}
        assert {j.array_index: (j.id, j.array_id) for j in tasks.values()} == {i: (ids[i], ids[5]) for i in ids}
        _, changed, _ = await store.jobs_changed(cursor)
        assert {j.id for j in changed} == set(ids.values())
