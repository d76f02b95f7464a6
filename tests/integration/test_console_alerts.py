"""Alert -> cause -> shell (issue 13) against a real scheduler on the lab: a job that goes quiet is suspected
hung, a two-node job whose rank 1 lags is a straggler, each by the scheduler's own detectors. The console marks
their rows, `enter` on an alert opens the job at its evidence, and `s` opens the shell on the rank that stands
out. The shell's argv is recorded instead of run (test_console_tmux.py runs a real one).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from textual.widgets import Static

from ftconsole.scheduler import logwatch
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from ftconsole.scheduler.ssh.shell import ShellTarget
from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import JobScreen
from ftconsole.tui.views import View
from tests.integration.test_console import SIZE, column, lab, ready, rows, wait_for

# rank 0 reaches epoch 50, rank 1 only 48; then both wait without a sound
LAGS = (
    'sh -c \'for e in 46 47 48; do echo "Rank:$RANK Epoch:[$e] loss 0.1"; done; '
    'if [ $RANK = 0 ]; then echo "Rank:0 Epoch:[49]"; echo "Rank:0 Epoch:[50]"; fi; exec sleep 120\''
)


@pytest.fixture(autouse=True)
def scan_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logwatch, "SCAN_EVERY_S", 0.5)  # the scheduler runs embedded, in this process


@contextlib.asynccontextmanager
async def lab_probing_often(tmp_path: Path) -> AsyncIterator[LoadedConfig]:
    """test_console's lab, probed every 0.5 s: the hang detector needs the GPUs' utilisation over the window."""
    async with lab(tmp_path) as loaded:
        config = yaml.safe_load(loaded.file.read_text())
        config["probes"]["interval"] = "0.5s"
        loaded.file.write_text(yaml.safe_dump(config))
        yield load_config(loaded.file)


def recording(app: ConsoleApp) -> list[ShellTarget]:
    shells: list[ShellTarget] = []

    async def run_terminal(shell: ShellTarget) -> int:
        shells.append(shell)
        return 0

    app.run_terminal = run_terminal  # type: ignore[method-assign]
    return shells


def alert_of(app: ConsoleApp, kind: str, job: int) -> str | None:
    found = [a["id"] for a in app.feed.alerts.values() if a["kind"] == kind and a["job"] == job]
    return str(found[0]) if found else None


async def test_alert_to_evidence_to_shell_in_three_keys(tmp_path: Path) -> None:
    async with lab_probing_often(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        shells = recording(app)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            async with await ApiClient.connect(loaded.socket_path) as client:
                quiet = (await client.call("submit", spec={"name": "quiet", "command": "sleep 120",
                                                           "gpus_per_node": 1, "hang_detect": "3s"}))["id"]  # fmt: skip
                lagging = (await client.call("submit", spec={"name": "lagging", "command": LAGS, "mode": "pytorch",
                                                             "nodes": 2, "gpus_per_node": 1,
                                                             "progress": {"window": "1s"}}))["id"]  # fmt: skip

            # the rows say what the detectors found
            await wait_for(pilot, lambda: "hung?" in (column(app, "jobs", str(quiet), "alerts") or ""), "hung? mark")
            await wait_for(pilot, lambda: "straggler" in (column(app, "jobs", str(lagging), "alerts") or ""),
                           "the straggler mark")  # fmt: skip
            assert column(app, "jobs", str(quiet), "alerts") == "!1 hung?"

            # Alerts view: the alert selected (the arrows do it; here by key), enter -> the evidence
            await pilot.press("3")
            await wait_for(pilot, lambda: {alert_of(app, "job_hung", quiet)} <= rows(app, "alerts").keys(), "the row")
            table = app.query_one("#alerts", View).table
            assert table.select_key(str(alert_of(app, "job_hung", quiet)))
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen")
            screen = app.screen
            assert isinstance(screen, JobScreen) and screen.job_id == quiet
            evidence = screen.query_one("#evidence", Static)
            await wait_for(pilot, lambda: "stands out" in str(evidence.render()), "the evidence")
            shown = str(evidence.render())
            assert "job_hung" in shown and "SuspectedHung at" in shown
            async with await ApiClient.connect(loaded.socket_path) as client:
                first = (await client.call("show", job=quiet))["attempts"][0]["runs"][0]  # rank 0, its only rank
            why = (
                f"attempt 1 suspected hung: no I/O by any rank for 3s or more; GPU utilisation flat: {first['node']}:0"
            )
            assert why in shown
            assert f"rank 0 on {first['node']} (attempt 1)" in shown

            # s -> the shell in rank 0's run folder on its node (every rank of a hung job is quiet: rank 0)
            await pilot.press("s")
            await wait_for(pilot, lambda: len(shells) == 1, "the shell")
            node = next(n for n in loaded.cluster.node_list() if n.name == first["node"])
            assert shells[0].node == node.name and str(node.port) in shells[0].argv
            where = f"attempt 1 rank 0 (running) on {node.name}:{first['run_dir']}"
            assert f"job {quiet} (quiet, running) {where}" in shells[0].banner

            # from the straggler's row, s alone: the rank behind (rank 1) on its node
            await pilot.press("escape")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, "back to the alerts")
            await wait_for(pilot, lambda: alert_of(app, "job_straggler", lagging) in rows(app, "alerts"), "the row")
            assert table.select_key(str(alert_of(app, "job_straggler", lagging)))
            await pilot.press("s")
            await wait_for(pilot, lambda: len(shells) == 2, "the second shell")
            async with await ApiClient.connect(loaded.socket_path) as client:
                shown_job: dict[str, Any] = await client.call("show", job=lagging)
                behind = next(r for r in shown_job["attempts"][-1]["runs"] if r["rank"] == 1)
                assert shells[1].node == behind["node"]
                assert f"attempt 1 rank 1 (running) on {behind['node']}:{behind['run_dir']}" in shells[1].banner
                await client.call("stop", jobs=[quiet, lagging])
