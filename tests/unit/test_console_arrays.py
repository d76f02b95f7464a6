"""An array of jobs in the console's Jobs view: one row, `t` shows a row per task; stop, delete and priority on the
array's row act on the whole array (its id), on a task's row on that task alone (`200[0]`), with fixed data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftconsole.tui import rows as R
from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import JobScreen
from ftconsole.tui.views import JobsView
from tests import console_data as D

SIZE = (160, 30)
WAITS = "array 200 runs at most 2 tasks at once (2 running)"


def _task(index: int, status: str, **over: Any) -> dict[str, Any]:
    fields = {"array_id": 200, "array_index": index, "array": "0-4%2", "ref": f"200[{index}]", "owner": "cy",
              "nodes": 1, "gpus_per_node": 1, "mode": "single"}  # fmt: skip
    return D._job(200 + index, "sweep", status, **fields, **over)


TASKS = [
    _task(0, "succeeded", started=D.NOW - 900, ended=D.NOW - 600, attempt=1, exit_code=0),
    _task(1, "running", started=D.NOW - 500, attempt=1, last_output=D.NOW - 2, node_names=["gpu03"]),
    _task(2, "running", started=D.NOW - 400, attempt=1, last_output=D.NOW - 2, node_names=["gpu03"]),
    _task(3, "queued", message=WAITS),
    _task(4, "queued", message=WAITS),
]


class ArraysClient(D.FixedClient):
    """The fixed cluster and array 200 (five tasks, jobs 200 to 204); what would change something is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, op: str, **args: Any) -> Any:
        if op == "jobs_changed":
            return {"cursor": D.NOW, "jobs": [] if args.get("since") else [*D.JOBS, *TASKS]}
        if op == "show" and int(args["job"]) in {t["id"] for t in TASKS}:
            job = next(t for t in TASKS if t["id"] == int(args["job"]))
            return job | {"spec": {"name": "sweep", "command": "python sweep.py", "array": "0-4%2"},
                          "attempts": [], "conditions": [], "events": [], "tasks": []}  # fmt: skip
        if op in ("stop", "delete", "priority", "hold", "release"):
            self.calls.append((op, args))
            return []
        return await super().call(op, **args)


def console(tmp_path: Path) -> ConsoleApp:
    app = ConsoleApp(D.fixed_config(tmp_path), client=ArraysClient(), clock=lambda: D.NOW, refresh_s=3600)
    return D.record_notices(app)  # type: ignore[no-any-return]


async def loaded(pilot: Any) -> JobsView:
    await pilot.app.refresh_data("jobs", "alerts")
    await pilot.pause()
    view = pilot.app.query_one("#jobs", JobsView)
    assert isinstance(view, JobsView)
    return view


async def called(pilot: Any, client: ArraysClient, count: int) -> None:
    for _ in range(100):  # the action runs in a worker: bounded wait for it
        if len(client.calls) >= count:
            return
        await pilot.pause(0.05)
    raise AssertionError(f"expected {count} calls, got {client.calls}")


async def test_t_shows_and_hides_the_tasks_of_an_array(tmp_path: Path) -> None:
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = await loaded(pilot)
        table = view.table
        rows = table.to_rows()
        assert "array:200" in rows and not {"200", "201", "204"} & rows.keys()  # one row for the array
        row = dict(zip([c.key for c in R.JOB_COLUMNS], rows["array:200"], strict=True))
        assert (row["id"], row["status"], row["message"]) == ("200[0-4%2]", "2▶ 2○ 1✓", WAITS)
        assert table.keys.index("array:200") == table.keys.index("101") + 1  # with the running jobs
        assert app.check_action("tasks", ()) is True  # `t` is in the footer while there is an array

        assert table.select_key("array:200")
        await pilot.press("t")
        await pilot.pause()
        keys = table.keys
        at = keys.index("array:200")
        assert keys[at : at + 6] == ["array:200", "201", "202", "203", "204", "200"]  # running first, then queued
        assert [table.to_rows()[k][1] for k in keys[at + 1 : at + 6]] == [f"200[{i}]" for i in (1, 2, 3, 4, 0)]
        assert table.selected_key() == "array:200"

        assert table.select_key("203")  # `t` on one of its tasks closes the array, back on the array's row
        await pilot.press("t")
        await pilot.pause()
        assert not {"200", "203"} & set(table.keys) and table.selected_key() == "array:200"
        assert view.summary(app.feed, D.NOW).plain.endswith(f"{len(D.JOBS) + len(TASKS)} jobs")  # tasks count

        assert table.select_key("101")
        await pilot.press("t")  # a job that is no array's: said so
        await pilot.pause()
        assert any("no array's" in m for m in app.said)  # type: ignore[attr-defined]


async def test_stop_on_the_array_row_stops_the_array_and_on_a_task_row_the_task(tmp_path: Path) -> None:
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = await loaded(pilot)
        client = app.client
        assert isinstance(client, ArraysClient)
        view.table.select_key("array:200")
        await pilot.press("x")
        await pilot.pause()
        assert getattr(app.screen, "question", None) == "Stop array 200 (5 tasks)?"
        await pilot.press("y")
        await called(pilot, client, 1)
        assert client.calls[-1] == ("stop", {"jobs": [200]})  # the array's id: every task

        await pilot.press("t")
        await pilot.pause()
        view.table.select_key("200")  # its first task alone: by name, as 200 names the whole array
        await pilot.press("ctrl+d")
        await pilot.pause()
        await pilot.press("y")
        await called(pilot, client, 2)
        assert client.calls[-1] == ("delete", {"jobs": ["200[0]"]})


async def test_one_job_actions_on_an_array_row(tmp_path: Path) -> None:
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = await loaded(pilot)
        view.table.select_key("array:200")
        await pilot.press("e")  # extend: one task at a time
        await pilot.pause()
        assert app.screen is app.screen_stack[0]
        assert any("extend works on one task at a time" in m for m in app.said)  # type: ignore[attr-defined]

        await pilot.press("enter")  # the screen of its most pressing task, said so
        await pilot.pause()
        assert isinstance(app.screen, JobScreen) and app.screen.job_id == 201
        assert any("task 200[1]" in m for m in app.said)  # type: ignore[attr-defined]


def status(view: JobsView, key: str) -> str:
    row = dict(zip([c.key for c in R.JOB_COLUMNS], view.table.to_rows()[key], strict=True))
    return str(row["status"])


async def test_h_holds_a_queued_task_and_releases_one_held(tmp_path: Path) -> None:
    """`h` on a task's row holds it (`hold` of 200[3]); on a task that is held already it releases it, and the
    row says `held` where it said `queued`."""
    held = {"by": "cy", "at": D.NOW - 60, "admin": False}
    TASKS[4] = _task(4, "queued", message=WAITS, held=held)
    try:
        app = console(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            view = await loaded(pilot)
            client = app.client
            assert isinstance(client, ArraysClient)
            assert status(view, "array:200") == "2▶ 1○ 1‖ 1✓"
            view.table.select_key("array:200")
            await pilot.press("t")
            await pilot.pause()
            assert status(view, "204") == "held" and status(view, "203") == "queued"
            view.table.select_key("203")
            await pilot.press("h")
            await called(pilot, client, 1)
            assert client.calls[-1] == ("hold", {"jobs": ["200[3]"]})
            view.table.select_key("204")
            await pilot.press("h")
            await called(pilot, client, 2)
            assert client.calls[-1] == ("release", {"jobs": ["200[4]"]})
    finally:
        TASKS[4] = _task(4, "queued", message=WAITS)
