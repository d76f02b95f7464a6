"""The queue as a timeline (key 7): which rows each pool gets and in which order, where a bar falls in a window of
time, the axis, and the view in the app, headless, on the fixed cluster."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.geometry import Size

from ftconsole.tui import timeline as T
from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import JobScreen
from ftconsole.tui.timelineview import TimelineChart, TimelineView
from tests.console_data import NOW, FixedClient, fixed_config

H = 3600.0


def job(id_: int, status: str, **over: Any) -> dict[str, Any]:
    base = {"id": id_, "name": f"job{id_}", "owner": "ana", "status": status, "nodes": 1, "gpus_per_node": 8,
            "started": None, "max_runtime_s": None, "node_names": [], "preemptible": False, "message": "",
            "array_id": None}  # fmt: skip
    return base | over


NODES = {"a1": "a100", "a2": "a100", "h1": "h100"}


def rows_of(groups: list[T.Group]) -> dict[str, list[str]]:
    return {g.title.split("  ")[0]: [r.key if isinstance(r, T.Bar) else f"band:{r.name}" for r in g.rows]
            for g in groups}  # fmt: skip


def test_rows_by_pool_running_by_end_then_queued_in_queue_order_then_those_with_no_start() -> None:
    jobs = {
        1: job(1, "running", node_names=["a1"], started=NOW - H, max_runtime_s=3 * H),
        2: job(2, "running", node_names=["a2"], started=NOW - H, max_runtime_s=2 * H),
        3: job(3, "running", node_names=["h1"]),  # no time limit
        4: job(4, "queued"),
        5: job(5, "queued"),
        6: job(6, "queued", message="waiting: its dependency"),
        7: job(7, "queued"),  # not in the forecast (submitted since): not drawn
    }
    forecast = {
        "now": NOW, "until": NOW, "complete": True,
        "queued": [{"id": 5, "start": NOW + H, "end": NOW + 2 * H, "nodes": ["a2"], "message": ""},
                   {"id": 4, "start": NOW + 2 * H, "end": None, "nodes": ["h1"], "message": ""},
                   {"id": 6, "start": None, "end": None, "nodes": [], "message": "waits for job 3 to end"},
                   {"id": 99, "start": NOW, "end": None, "nodes": ["a1"], "message": ""}],  # one not seen: left out
        "running": [{"id": 1, "end": NOW + 2 * H}, {"id": 2, "end": NOW + H}, {"id": 3, "end": None}],
    }  # fmt: skip
    reservations = [{"name": "maint", "nodes": ["a1", "h1"], "start": NOW + H, "end": NOW + 3 * H,
                     "maintenance": True, "state": "planned"},
                    {"name": "old", "nodes": ["a1"], "start": NOW - 3 * H, "end": NOW - H, "user": "bo",
                     "state": "ended"}]  # fmt: skip
    groups = T.groups(jobs, forecast | {"nodes": NODES}, reservations, NOW)
    assert rows_of(groups) == {
        "pool a100": ["band:maint", "2", "1", "5"],
        "pool h100": ["band:maint", "3", "4"],
        T.NOT_FORESEEN: ["6"],
    }
    assert groups[0].title == "pool a100  2 nodes · 2 running · 1 expected"
    notes = {r.key: r.note for g in groups for r in g.rows if isinstance(r, T.Bar)}
    assert notes["6"].endswith(f"{T.NOT_FORESEEN}: waits for job 3 to end")
    assert "running on h1; no time limit" in notes["3"]
    assert "expected from" in notes["5"] and "on a2" in notes["5"]


def test_an_array_s_tasks_with_no_expected_start_are_one_row() -> None:
    jobs = {i: job(i, "queued", array_id=10, ref=f"10[{i - 10}]", name="sweep") for i in range(10, 15)}
    forecast = {"now": NOW, "until": NOW, "complete": True, "running": [],
                "queued": [{"id": 10, "start": NOW, "end": NOW + H, "nodes": ["a1"], "message": ""}]
                + [{"id": i, "start": None, "end": None, "nodes": [], "message": "waiting: behind the first 500 jobs"}
                   for i in range(11, 15)]}  # fmt: skip
    groups = T.groups(jobs, forecast | {"nodes": NODES}, [], NOW)
    assert rows_of(groups) == {"pool a100": ["10"], "pool h100": [], T.NOT_FORESEEN: ["array:10"]}
    (row,) = groups[-1].rows
    assert isinstance(row, T.Bar) and "array 10 (4 tasks)" in row.note and "10[…]" in row.label
    # the jobs past the queue depth are counted by the scheduler, not listed: a line after the rows
    beyond = {"count": 2500, "message": "waiting: behind the first 500 jobs of the queue"}
    last = T.groups(jobs, forecast | {"nodes": NODES, "beyond": beyond}, [], NOW)[-1]
    assert last.title == f"{T.NOT_FORESEEN}  2,504 jobs"
    assert last.note == f"and 2,500 more queued jobs: {beyond['message']}"


def test_rows_are_kept_until_their_job_or_expected_times_change() -> None:
    rows = T.Rows()
    jobs = {1: job(1, "running", node_names=["a1"], started=NOW, max_runtime_s=H), 2: job(2, "queued")}
    forecast = {"nodes": NODES, "running": [{"id": 1, "end": NOW + H}],
                "queued": [{"id": 2, "start": NOW + H, "end": None, "nodes": ["a1"], "message": ""}]}  # fmt: skip

    def bars(found: list[T.Group]) -> dict[str, T.Row]:
        return {r.key: r for g in found for r in g.rows if isinstance(r, T.Bar)}

    first = bars(rows.groups(jobs, forecast, [], NOW))
    again = bars(rows.groups(jobs, forecast, [], NOW + 1))
    assert again["1"] is first["1"] and again["2"] is first["2"]
    renamed = {**jobs, 1: {**jobs[1], "name": "renamed"}}  # the feed replaces a changed job's record
    later = {**forecast, "queued": [{"id": 2, "start": NOW + 2 * H, "end": None, "nodes": ["a1"], "message": ""}]}
    third = bars(rows.groups(renamed, later, [], NOW + 2))
    assert "renamed" in third["1"].label and third["2"] is not first["2"] and third["2"].start == NOW + 2 * H


def chart(row: T.Row, step: float = 600.0, width: int = 20) -> str:
    window = T.Window(NOW - step, step, width)  # the first column is the one before now
    return "".join(text for text, _ in T.cells(row, window, NOW))


def test_a_bar_runs_from_its_start_to_its_end_in_the_window() -> None:
    running = T.Bar("1", "", "running", NOW - 5 * H, NOW + 3000)  # started long ago: drawn from now
    assert chart(running) == "┊" * 0 + " █████" + " " * 14
    expected = T.Bar("2", "", "expected", NOW + 1200, NOW + 2400)
    assert chart(expected) == " ┊ ▒▒" + " " * 15
    endless = T.Bar("3", "", "expected", NOW + 6000, None)
    assert chart(endless) == " ┊" + " " * 9 + "▒" * 8 + T.OPEN_END
    short = T.Bar("4", "", "expected", NOW + 1250, NOW + 1260)  # under a column: still one
    assert chart(short) == " ┊ ▒" + " " * 16
    later = T.Bar("5", "", "expected", NOW + 30 * H, NOW + 31 * H)  # past the right edge: not drawn
    assert chart(later) == " ┊" + " " * 18


def test_bands_and_rows_with_no_start() -> None:
    band = T.Band("m", "", NOW - H, NOW + 1200, maintenance=True)
    assert chart(band) == "╳╳╳" + " " * 17  # from the first column (its start is before it)
    planned = T.Band("r", "", NOW + 600, NOW + 1800)
    assert chart(planned) == " ┊╱╱" + " " * 16
    none = T.Bar("6", "", "none", note="job 6 x (ana): no expected start: waits for its dependency")
    assert chart(none) == "waits for its depend"


def test_fit_and_the_axis() -> None:
    rows = [T.Bar("1", "", "expected", NOW + H, NOW + 10 * H)]
    assert T.fit(rows, NOW, 100) == 600  # 10.5 h over 100 columns: 10 minutes a column
    assert T.fit([], NOW, 100) == 60
    assert T.fit([T.Bar("1", "", "running", NOW, NOW + 1000 * 86400)], NOW, 100) == 86400  # at most a day
    now = NOW + 1200  # between round times: the now mark has its column
    window = T.Window(now - 600, 600, 60)
    axis = T.axis(window, now)
    assert len(axis) == 60 and axis[1] == T.NOW_MARK
    labels = axis.split("│")[1:]
    assert labels and all(time.strptime(label.strip(), "%H:%M") for label in labels)
    first = axis.index("│")
    assert (window.left + first * 600 + time.localtime(now).tm_gmtoff) % 3600 == 0  # at a round hour


def app(tmp_path: Path) -> ConsoleApp:
    return ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600)


async def loaded(pilot: Any) -> TimelineView:
    await pilot.press("7")
    await pilot.app.refresh_data()
    await pilot.pause()
    view = pilot.app.view
    assert isinstance(view, TimelineView)
    return view


async def test_the_view_moves_zooms_filters_and_opens_a_job(tmp_path: Path) -> None:
    console = app(tmp_path)
    async with console.run_test(size=(160, 30)) as pilot:
        view = await loaded(pilot)
        chart = view.chart
        assert chart.keys == ["104", "101", "105", "106"]
        status = view.query_one(".timeline-status")
        assert "job 104 eval-sweep (bo): running on gpu03" in str(status.render())
        await pilot.press("down", "down")
        assert chart.selected_key() == "105"
        assert "expected from" in str(status.render()) and "on gpu[01-02]" in str(status.render())
        title = str(view.query_one(".view-title").render())
        assert "2 running · 2 expected" in title and "30 min a column" in title
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert chart.window.step == 3600 and "1 h a column" in str(view.query_one(".view-title").render())
        await pilot.press("right")
        assert chart.window.left > NOW  # later: the window moved on
        await pilot.press("equals_sign")
        assert chart.window.step == 1800 and chart.window.left < NOW
        await pilot.press("slash", *"tokenizer", "enter")
        await pilot.pause()
        assert chart.keys == ["106"] and chart.selected_key() == "106"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(console.screen, JobScreen) and console.screen.job_id == 106


async def test_no_color_tells_running_from_expected_by_symbol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    console = app(tmp_path)
    async with console.run_test(size=(160, 30)) as pilot:
        view = await loaded(pilot)
        lines = ["".join(s.text for s in view.chart.render_line(y)) for y in range(6)]
        running = next(line for line in lines if "llama-70b" in line)
        queued = next(line for line in lines if "rlhf-ppo" in line)
        assert "█" in running and "▒" not in running and "▒" in queued and "█" not in queued
        assert isinstance(view.chart, TimelineChart)


async def test_the_chart_grows_and_shrinks_without_a_sideways_scrollbar_or_a_layout() -> None:
    """The chart is as wide as the view (a zoom, not a scroll, shows more time): its vertical scrollbar must not
    bring a horizontal one, which hid its last row and laid the whole screen out at each change of its rows."""

    class ChartApp(App[None]):
        def compose(self) -> ComposeResult:
            yield TimelineChart()

    app = ChartApp()
    async with app.run_test(size=(100, 30)) as pilot:
        chart = app.query_one(TimelineChart)
        await pilot.pause()
        layouts: list[object] = []
        refresh_layout = app.screen._refresh_layout

        def counted(*args: object, **kwargs: object) -> None:
            layouts.append(args)
            refresh_layout(*args, **kwargs)  # type: ignore[arg-type]

        app.screen._refresh_layout = counted  # type: ignore[method-assign]
        chart.set_virtual_size(Size(chart.size.width, 200))  # as `show` sizes it: the vertical scrollbar comes
        quiet = 0
        for _ in range(100):  # frames until no layout came for three of them (more of them on a busy machine)
            count = len(layouts)
            await pilot.pause()
            quiet = quiet + 1 if len(layouts) == count else 0
            if quiet >= 3:
                break
        layouts.clear()
        for rows in range(201, 221):
            chart.set_virtual_size(Size(chart.size.width, rows))
            await pilot.pause()
        assert not layouts
        assert chart.show_vertical_scrollbar and not chart.show_horizontal_scrollbar
