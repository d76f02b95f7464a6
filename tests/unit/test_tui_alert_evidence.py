"""Alert -> cause -> shell (issue 13) with fixed data: the detectors' marks on job rows, the evidence an alert
opens on, and the rank and node `s` opens a shell on (the argv the app would run; nothing is run).

The same keys against a real scheduler on the lab: tests/integration/test_console_alerts.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text

from ftconsole.scheduler.ssh.shell import ShellTarget
from ftconsole.tui import alertevidence as E
from ftconsole.tui import rows as R
from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import JobScreen
from ftconsole.tui.views import View
from tests import console_data as D

SIZE = (160, 30)
STRAGGLER_WHY = "attempt 2 ranks 2 epochs apart: rank 0 at 50; rank 1 at 48, for 10m (progress.window 10m)"


def alert(id_: int, kind: str, job: int | None, state: str = "open", **over: Any) -> dict[str, Any]:
    base = {"id": id_, "time": D.NOW - 120, "kind": kind, "severity": "warning", "job": job, "node": None,
            "message": f"job {job}: {kind}", "state": state, "acked_by": None, "acked_at": None,
            "resolved_at": None, "resolved_by": None, "data": {}}  # fmt: skip
    return base | over


def event(id_: int, kind: str, message: str, t: float, **data: Any) -> dict[str, Any]:
    return {"id": id_, "time": t, "kind": kind, "node": data.get("node"), "job": "104", "message": message,
            "data": data}  # fmt: skip


# job 104 (running on gpu03 and gpu02, attempt 2): rank 1 on gpu02 lags behind
STRAGGLER = alert(3, "job_straggler", 104, message=f"job 104 (eval-sweep, bo): {STRAGGLER_WHY}")
EVENTS_104 = [
    event(10, "Straggling", "attempt 1 ranks 3 epochs apart: ...", D.NOW - 4000, attempt=1, alert="job_straggler",
          rank=0, node="gpu03"),
    event(11, "Running", "all 2 ranks running", D.NOW - 3000),
    event(12, "Straggling", STRAGGLER_WHY, D.NOW - 120, attempt=2, alert="job_straggler", rank=1, node="gpu02"),
]  # fmt: skip


def runs(attempt: int, nodes: list[str]) -> dict[str, Any]:
    return {
        "number": attempt,
        "runs": [
            {"attempt": attempt, "rank": rank, "node": node, "gpus": [0, 1], "state": "running", "pid": 4000 + rank,
             "exit_code": None, "signal": None, "started": D.NOW - 3000, "ended": None, "error": None,
             "run_dir": f"~/.ftconsole/runs/c1/104/{attempt}/{rank}"}
            for rank, node in enumerate(nodes)
        ],
    }  # fmt: skip


class AlertsClient(D.FixedClient):
    """The fixed cluster with detector alerts: job 104 straggles (rank 1 on gpu02), job 101 is suspected hung."""

    def __init__(self) -> None:
        self.alerts = [*D.ALERTS, STRAGGLER, alert(4, "job_hung", 101, state="acknowledged", acked_by="ops")]

    async def call(self, op: str, **args: Any) -> Any:
        if op == "alerts":
            return self.alerts
        if op == "show" and int(args["job"]) == 104:
            job = next(j for j in D.JOBS if j["id"] == 104)
            return job | {"nodes": 2, "attempt": 2, "spec": {"name": job["name"], "command": "python eval.py"},
                          "attempts": [runs(1, ["gpu03", "gpu01"]), runs(2, ["gpu03", "gpu02"])],
                          "conditions": [], "events": EVENTS_104}  # fmt: skip
        return await super().call(op, **args)


def console(tmp_path: Path, client: Any = None) -> ConsoleApp:
    app = ConsoleApp(D.fixed_config(tmp_path), client=client or AlertsClient(), clock=lambda: D.NOW, refresh_s=3600)
    app.shells = []  # type: ignore[attr-defined]

    async def run_terminal(shell: ShellTarget) -> int:  # what would get the terminal, recorded
        app.shells.append(shell)  # type: ignore[attr-defined]
        return 0

    app.run_terminal = run_terminal  # type: ignore[method-assign]
    return D.record_notices(app)  # type: ignore[no-any-return]


async def loaded(pilot: Any) -> None:
    pilot.app.sub_title = "cluster.yaml"
    await pilot.app.refresh_data("jobs", "nodes", "alerts", "events", "cluster")
    await pilot.pause()


@pytest.fixture(autouse=True)
def _colours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)  # as the other snapshots: the marks' styles are in the picture


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Times on the screen in UTC, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# -- pure: marks and evidence ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alerts", "marks"),
    [
        ([alert(1, "job_hung", 7)], {7: ("hung?",)}),
        ([alert(1, "job_hung", 7, state="acknowledged")], {7: ("hung?",)}),
        ([alert(1, "job_hung", 7, state="resolved")], {}),
        ([alert(1, "job_failed", 7), alert(2, "node_unhealthy", None, node="gpu01")], {}),  # no detector's
        ([alert(1, "job_slow", 7), alert(2, "job_rank_error", 7), alert(3, "job_straggler", 8)],
         {7: ("rank error", "slow"), 8: ("straggler",)}),  # worst first
        ([alert(1, "job_slow", 7), alert(2, "job_slow", 7)], {7: ("slow",)}),  # once each
    ],
)  # fmt: skip
def test_job_alert_marks(alerts: list[dict[str, Any]], marks: dict[int, tuple[str, ...]]) -> None:
    assert R.job_alert_marks(alerts) == marks


@pytest.mark.parametrize(
    ("count", "found", "text"),
    [(0, (), ""), (2, (), "!2"), (1, ("hung?",), "!1 hung?"), (2, ("rank error", "slow"), "!2 rank error slow"),
     (0, ("straggler",), "straggler")],  # the alerts read a moment before the job listing counts them
)  # fmt: skip
def test_alerts_cell(count: int, found: tuple[str, ...], text: str) -> None:
    cell = R.alerts_cell(count, found)
    assert (cell.plain if isinstance(cell, Text) else cell) == text
    if found:  # the marks read without colour: reversed or bold
        assert isinstance(cell, Text) and all("bold" in str(s.style) for s in cell.spans)


def test_evidence_is_the_latest_event_the_detector_wrote_for_the_alert() -> None:
    cleared = event(13, "SuspectedHung", "attempt 2 no longer suspected hung: I/O resumed", D.NOW - 10)
    hung = event(9, "SuspectedHung", "attempt 2 suspected hung: no I/O ...", D.NOW - 60, attempt=2, alert="job_hung",
                 rank=0, node="gpu03")  # fmt: skip
    ev = E.alert_evidence(alert(1, "job_hung", 104), [hung, cleared, *EVENTS_104])
    assert ev.event is hung and (ev.rank, ev.node, ev.attempt) == (0, "gpu03", 2)  # not the clearing event

    ev = E.alert_evidence(STRAGGLER, EVENTS_104)
    assert ev.event is EVENTS_104[2] and (ev.rank, ev.node, ev.attempt) == (1, "gpu02", 2)  # the latest attempt

    failed = event(14, "Failed", "rank 1 on gpu02: exit code 1", D.NOW - 5)
    ev = E.alert_evidence(alert(2, "job_failed", 104, severity="error"), [*EVENTS_104, failed])
    assert ev.event is failed and ev.rank is None  # by its kind; no rank named: the shell's default, rank 0

    unknown = event(15, "Slow", "slow: ...", D.NOW, attempt=2, alert="job_slow")  # the rank not known
    ev = E.alert_evidence(alert(3, "job_slow", 104), [unknown])
    assert (ev.rank, ev.node, ev.attempt) == (None, None, 2)
    text = E.evidence_text(ev).plain
    assert "slow: ..." in text and "stands out" not in text

    ev = E.alert_evidence(alert(4, "job_hung", 104), [])
    assert ev.event is None and "job 104: job_hung" in E.evidence_text(ev).plain  # the alert's own words


# -- the app: three keys from the alert to the shell ---------------------------------------------------------


async def test_row_mark_then_enter_opens_the_evidence_and_s_the_rank_that_stands_out(tmp_path: Path) -> None:
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        jobs = app.query_one("#jobs", View).table.to_rows()
        alerts_column = [c.key for c in R.JOB_COLUMNS].index("alerts")
        assert jobs["104"][alerts_column] == "!1 straggler"
        assert jobs["101"][alerts_column] == "hung?"  # acknowledged: still marked
        assert jobs["103"][alerts_column] == "!1"  # job_failed: the count alone

        await pilot.press("3")
        table = app.query_one("#alerts", View).table
        assert table.keys[:2] == ["1", "3"]  # open first, errors before warnings
        await pilot.press("down", "enter")  # keys 1 and 2: the straggler alert, its evidence
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, JobScreen) and screen.job_id == 104
        while screen.data is None:
            await pilot.pause(0.05)
        shown = str(screen.query_one("#evidence").render())
        assert STRAGGLER_WHY in shown and "rank 1 on gpu02 (attempt 2)" in shown
        assert (screen.rank, screen.focus_attempt) == (1, 2)

        await pilot.press("s")  # key 3
        await pilot.pause(0.2)
        (shell,) = app.shells  # type: ignore[attr-defined]
        assert shell.node == "gpu02" and "10.0.0.2" in shell.argv
        assert "attempt 2 rank 1 (running) on gpu02:~/.ftconsole/runs/c1/104/2/1" in shell.banner

        await pilot.press("escape")
        await pilot.pause()
        assert len(app.screen_stack) == 1
        await pilot.press("s")  # or straight from the alert's row: the same rank
        await pilot.pause(0.2)
        assert [s.node for s in app.shells] == ["gpu02", "gpu02"]  # type: ignore[attr-defined]
        assert app.shells[1].argv == shell.argv  # type: ignore[attr-defined]

        table.select_key("2")  # a node alert (gpu04 unreachable): the node's own shell
        await pilot.press("s")
        await pilot.pause(0.2)
        assert app.shells[2].node == "gpu04" and "login shell" in app.shells[2].banner  # type: ignore[attr-defined]


async def test_an_alert_whose_job_has_no_run_says_so(tmp_path: Path) -> None:
    client = AlertsClient()
    client.alerts = [alert(5, "job_hung", 105)]  # 105 is queued: no run to open a shell in
    app = console(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3", "s")
        await pilot.pause(0.2)
        assert app.shells == []  # type: ignore[attr-defined]
        assert any("has no run yet" in m for m in app.said)  # type: ignore[attr-defined]


def test_job_screen_opened_from_an_alert(snap_compare: Any, tmp_path: Path, utc: None) -> None:
    assert snap_compare(console(tmp_path), press=["3", "_", "down", "enter", "_", "_"], terminal_size=SIZE,
                        run_before=loaded)  # fmt: skip


def test_jobs_with_detector_marks(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(console(tmp_path), press=["1", "_"], terminal_size=(160, 24), run_before=loaded)
