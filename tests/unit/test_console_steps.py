"""The job screen's steps (`ftconsole run` in an allocation): each with its state, exit code, nodes and GPUs, who
ran it and the command, newest first; the table is hidden for a job without steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets import DataTable, TabbedContent

from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import JobScreen
from tests import console_data as D

SIZE = (160, 40)


def _step(number: int, state: str, **over: Any) -> dict[str, Any]:
    step = {"number": number, "attempt": 1, "argv": ["python", "train.py"], "mode": "pytorch",
            "ranks": [{"node": "gpu01", "gpus": [0, 1]}, {"node": "gpu02", "gpus": [0, 1]}], "run_by": "cy",
            "started": D.NOW - 600, "ended": None, "state": state, "exit_code": None, "message": "",
            "overlap": False}  # fmt: skip
    return step | over


STEPS = [
    _step(1, "succeeded", ended=D.NOW - 500, exit_code=0),
    _step(2, "cancelled", ended=D.NOW - 100, exit_code=255, message="its ftconsole run went away (interrupted)"),
    _step(3, "running", argv=["sh", "-c", "nvidia-smi"], mode="single", ranks=[{"node": "gpu01", "gpus": []}]),
]


class StepsClient(D.FixedClient):
    async def call(self, op: str, **args: Any) -> Any:
        shown = await super().call(op, **args)
        if op == "show" and int(args["job"]) == 101:
            return shown | {"steps": STEPS}
        return shown


async def test_the_attempts_tab_lists_the_steps_newest_first(tmp_path: Path) -> None:
    app = ConsoleApp(D.fixed_config(tmp_path), client=StepsClient(), clock=lambda: D.NOW, refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(JobScreen(app.client, app.clock, 101))
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, JobScreen)
        screen.query_one(TabbedContent).active = "attempts"
        table = screen.query_one("#steps", DataTable)
        for _ in range(100):
            if table.row_count:
                break
            await pilot.pause(0.05)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert [r[:4] for r in rows] == [
            ["3", "running", "-", "single"],
            ["2", "cancelled", "255", "pytorch"],
            ["1", "succeeded", "0", "pytorch"],
        ]
        assert rows[1][4] == "gpu01:0,1 gpu02:0,1" and rows[0][4] == "gpu01:-"
        assert rows[1][7] == "cy" and rows[1][8] == "python train.py" and "went away" in rows[1][9]
        assert table.display

        app.pop_screen()
        app.push_screen(JobScreen(app.client, app.clock, 104))  # no steps: no table
        await pilot.pause()
        other = app.screen
        assert isinstance(other, JobScreen)
        for _ in range(100):
            if other.data is not None:
                break
            await pilot.pause(0.05)
        await pilot.pause()
        assert not other.query_one("#steps", DataTable).display
