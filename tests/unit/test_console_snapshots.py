"""Pictures of the console's main views with fixed data (pytest-textual-snapshot; Textual is pinned).

After a deliberate change to the console's look: `make snapshots` (pytest --snapshot-update), then look at
the SVGs under __snapshots__/ before committing them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftconsole.tui.app import ConsoleApp
from tests.console_data import NOW, FixedClient, fixed_config

SIZE = (160, 24)


def app(tmp_path: Path, **kwargs: object) -> ConsoleApp:
    return ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600, **kwargs)


async def _loaded(pilot) -> None:  # type: ignore[no-untyped-def]
    pilot.app.sub_title = "cluster.yaml"  # not the test's temporary folder
    await pilot.app.refresh_data("jobs", "nodes", "alerts", "events", "cluster", "reservations", "forecast", "shares")
    await pilot.pause()


@pytest.fixture(autouse=True)
def _fixed_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)


@pytest.mark.parametrize(("key", "view"), [("1", "jobs"), ("2", "nodes"), ("3", "alerts"), ("4", "events"),
                                           ("5", "cluster"), ("6", "map"), ("7", "timeline"),
                                           ("8", "shares")])  # fmt: skip
def test_view(snap_compare, tmp_path: Path, key: str, view: str) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(tmp_path), press=[key, "_"], terminal_size=SIZE, run_before=_loaded)


def test_jobs_filtered_and_marked(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    press = ["slash", *"running|queued", "enter", "space", "_"]
    assert snap_compare(app(tmp_path), press=press, terminal_size=SIZE, run_before=_loaded)


def test_readonly_hides_actions(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(tmp_path, readonly=True), press=["2", "_"], terminal_size=SIZE, run_before=_loaded)


def test_node_detail(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(tmp_path), press=["2", "_", "enter", "_", "_"], terminal_size=(160, 40), run_before=_loaded)


def test_light_theme(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(tmp_path, theme="light"), press=["2", "_"], terminal_size=SIZE, run_before=_loaded)


async def test_no_color_still_tells_states_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    console = app(tmp_path)
    async with console.run_test(size=SIZE) as pilot:
        await _loaded(pilot)
        await pilot.press("2")
        await pilot.pause()
        assert console.no_color
        rows = console.view.table.to_rows()
        assert rows["gpu04"][2] == "unreachable" and rows["gpu03"][2] == "degraded"  # words, not colours


def test_job_screen(snap_compare, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(tmp_path), press=["1", "_", "enter", "_", "_"], terminal_size=(160, 30), run_before=_loaded)


async def test_keys_panel_and_jump_palette(tmp_path: Path) -> None:
    console = app(tmp_path)
    async with console.run_test(size=SIZE) as pilot:
        await _loaded(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert console.screen.query("HelpPanel")  # `?` shows the keys of the screen
        await pilot.press("question_mark")
        await pilot.pause()
        assert not console.screen.query("HelpPanel")
        await pilot.press("colon", *"gpu03")  # `:` jumps to a node by name
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.5)
        assert type(console.screen).__name__ == "NodeScreen" and console.screen.node == "gpu03"  # type: ignore[attr-defined]
