"""The filter bar (`/`) shows the filter of the view on screen: each view keeps its own, and `escape` clears it from
the view and from the bar alike."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input

from ftconsole.tui.app import ConsoleApp
from tests.console_data import NOW, FixedClient, fixed_config


async def test_the_bar_shows_the_filter_of_the_view_on_screen(tmp_path: Path) -> None:
    console = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(160, 30)) as pilot:
        await console.refresh_data()
        await pilot.pause()
        bar = console.query_one("#filter", Input)
        await pilot.press("slash", *"llama", "enter")
        await pilot.pause()
        assert console.view.pattern is not None and bar.value == "llama"

        await pilot.press("2")  # the Nodes view has no filter of its own: the bar shows its hint, not "llama"
        await pilot.pause()
        assert console.view.pattern is None and bar.value == ""
        await pilot.press("slash", *"gpu0", "enter")
        await pilot.pause()
        assert bar.value == "gpu0"

        await pilot.press("1")  # back on the Jobs view: its own filter, still applied
        await pilot.pause()
        assert console.view.pattern is not None and console.view.pattern.pattern == "llama" and bar.value == "llama"

        await pilot.press("escape")  # clears the view's filter, and the bar with it
        await pilot.pause()
        assert console.view.pattern is None and bar.value == ""
        await pilot.press("2")
        await pilot.pause()
        assert bar.value == "gpu0"
