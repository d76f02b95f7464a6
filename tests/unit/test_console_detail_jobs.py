"""The node screen lists the jobs that held its GPUs, the newest first: each run's job, user, rank, GPUs and times,
a private job as such (API `node_jobs`, with fixed data)."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable

from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import NodeScreen
from tests.console_data import NOW, FixedClient, fixed_config


async def test_the_node_screen_lists_the_jobs_on_its_gpus(tmp_path: Path) -> None:
    console = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(160, 40)) as pilot:
        console.push_screen(NodeScreen(console.client, console.clock, "gpu01"))
        table = None
        for _ in range(100):  # its first fetch comes after the screen is up
            await pilot.pause(0.05)
            screen = console.screen
            if isinstance(screen, NodeScreen) and screen.jobs_on:
                table = screen.query_one("#node-jobs", DataTable)
                if table.row_count:
                    break
        assert table is not None and table.row_count == 3
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(3)]
        assert rows[0][:5] == ["101", "llama-70b-pretrain", "ann", "0", "0-7"] and rows[0][6:] == ["running", "running"]
        assert rows[1][:5] == ["102", "bert-base", "bob", "0", "0-3"] and rows[1][7] == "exited (code 0)"
        assert rows[2][:3] == ["private job", "", ""] and rows[2][4] == "4-5"


async def test_the_title_counts_the_open_alerts_at_every_update(tmp_path: Path) -> None:
    """The app's title says how many alerts are open, as they open and close, whatever view was drawn first."""
    from tests import console_data as D

    class Alerting(FixedClient):
        def __init__(self) -> None:
            self.alerts = [dict(a) for a in D.ALERTS]

        async def call(self, op: str, **args: object) -> object:
            if op == "alerts":
                return [dict(a) for a in self.alerts]
            return await super().call(op, **args)

    client = Alerting()
    console = ConsoleApp(fixed_config(tmp_path), client=client, clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(120, 24)) as pilot:
        for view in ("1", "2", "6"):  # each view's first update, then more of them
            await pilot.press(view)
            for state in ("open", "resolved", "open"):
                for alert in client.alerts:
                    alert["state"] = state
                await console.refresh_data()
                await pilot.pause()
                opened = len(client.alerts) if state == "open" else 0
                assert console.title == (f"ftconsole · {opened} open alerts" if opened else "ftconsole"), view
                header = "".join(s.text for s in console.screen.query_one("HeaderTitle").render_line(0))
                assert header.strip().startswith(console.title + " — "), header  # the header shows it, with the config
