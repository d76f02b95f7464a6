"""The console against a real scheduler on the lab cluster (asyncssh servers running real processes).

Each test drives the app with keys, as an operator would, and checks both the screen's tables and the
scheduler's own records: submit (with errors shown in place, then the prediction), stop, drain and resume,
acknowledge and resolve, scaling an elastic job, the selection staying on its row, read-only mode, and
attaching to `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from textual.widgets import Static, TabbedContent

from ftconsole.lab import LabCluster
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.serve.daemon import serve
from ftconsole.scheduler.spec.config import LoadedConfig, load_config
from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.detail import JobScreen, NodeScreen
from ftconsole.tui.dialogs import ConfirmDialog, PromptDialog, SubmitDialog
from ftconsole.tui.views import View

SIZE = (160, 40)


async def wait_for(pilot: Any, predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextlib.asynccontextmanager
async def lab(tmp_path: Path, nodes: int = 2) -> AsyncIterator[LoadedConfig]:
    """A lab cluster and its config, with a short socket path (AF_UNIX) and a fast scheduler tick."""
    sock_dir = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    try:
        async with LabCluster(tmp_path / "lab", nodes=nodes) as cluster:
            config = yaml.safe_load(cluster.config_path.read_text())
            config["api"] = {"socket": str(sock_dir / "ft.sock")}
            config["scheduler"] = {"tick": "0.3s", "stop_grace": "2s"}
            path = tmp_path / "cluster.yaml"
            path.write_text(yaml.safe_dump(config))
            yield load_config(path)
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def job_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def rows(app: ConsoleApp, view: str) -> dict[str, tuple[str, ...]]:
    return app.query_one(f"#{view}", View).table.to_rows()


def column(app: ConsoleApp, view: str, key: str, name: str) -> str | None:
    table = app.query_one(f"#{view}", View).table
    row = table.to_rows().get(key)
    if row is None:
        return None
    return row[[c.key for c in table.spec].index(name)]


async def ready(pilot: Any, app: ConsoleApp) -> None:
    await wait_for(pilot, lambda: app.scheduler_mode in ("embedded", "attached"), "the scheduler")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not (app.feed.nodes and all(n["state"] == "healthy" for n in app.feed.nodes.values())):
        assert loop.time() < deadline, f"timed out waiting for the first probe: {app.feed.nodes}"
        await app.refresh_data("nodes")  # the Jobs view alone does not read the nodes
        await pilot.pause(0.1)


async def type_path(pilot: Any, path: Path) -> None:
    await pilot.press(*str(path), "enter")


async def test_submit_with_errors_in_place_then_stop(tmp_path: Path) -> None:
    bad = job_file(tmp_path, "bad", "command: sleep 60\nnodes: zero\ngpus_per_node: 1\n")
    good = job_file(tmp_path, "long", "command: sleep 60\ngpus_per_node: 1\n")
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, SubmitDialog), "the submit dialog")
            dialog = app.screen
            assert isinstance(dialog, SubmitDialog)
            await type_path(pilot, bad)
            await wait_for(pilot, lambda: dialog.problems, "the problems of bad.yaml")
            assert any("bad.yaml:3" in p and "nodes" in p for p in dialog.problems), dialog.problems
            shown = str(dialog.query_one("#result").render())
            assert "nodes: zero" in shown and "^ nodes" in shown  # the problem under its line
            assert dialog.ready is None

            await pilot.press("ctrl+u")  # the whole path, as a user clears a shell's line
            await type_path(pilot, good)
            await wait_for(pilot, lambda: dialog.ready is not None, "the prediction")
            assert "would start now on lab0" in str(dialog.query_one("#result").render())
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, "the dialog to close")
            await wait_for(pilot, lambda: any(j["name"] == "long" for j in app.feed.jobs.values()), "the job")
            job_id = next(j["id"] for j in app.feed.jobs.values() if j["name"] == "long")
            await wait_for(pilot, lambda: column(app, "jobs", str(job_id), "status") == "running", "running")

            table = app.query_one("#jobs", View).table
            assert table.select_key(str(job_id))
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            await pilot.press("n")  # changed my mind: nothing happens
            await pilot.pause(0.5)
            assert app.feed.jobs[job_id]["status"] == "running" and not app.feed.jobs[job_id]["stop_requested"]
            await pilot.press("x", "y")
            await wait_for(pilot, lambda: column(app, "jobs", str(job_id), "status") == "stopped", "stopped", 30)
            async with await ApiClient.connect(loaded.socket_path) as client:
                shown_job = await client.call("show", job=job_id)
            assert shown_job["stop_reason"] == "stopped" and shown_job["stop_by"]


async def test_selection_stays_on_its_job_while_the_queue_changes(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            async with await ApiClient.connect(loaded.socket_path) as client:
                ids = [
                    (await client.call("submit", spec={"name": f"q{i}", "command": "sleep 60", "gpus_per_node": 8}))[
                        "id"
                    ]
                    for i in range(6)
                ]
                await wait_for(pilot, lambda: all(str(i) in rows(app, "jobs") for i in ids), "the jobs")
                table = app.query_one("#jobs", View).table
                target = str(ids[-1])  # queued: the last one
                table.select_key(target)
                before = table.get_row_index(target)
                # an urgent job and a failing one arrive: rows move, the cursor stays on its job
                await client.call("submit", spec={"name": "urgent", "command": "sleep 60", "priority": "urgent",
                                                  "gpus_per_node": 8})  # fmt: skip
                await client.call("submit", spec={"name": "boom", "command": "sh -c 'exit 3'"})
                await wait_for(pilot, lambda: column(app, "jobs", str(ids[-1] + 2), "status") == "error", "the failure")
                assert table.selected_key() == target
                assert table.get_row_index(target) != before  # it did move
                await client.call("stop", jobs=ids)


async def test_nodes_drain_resume_probe_and_detail(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await pilot.press("2")
            await wait_for(pilot, lambda: len(rows(app, "nodes")) == 2, "the node rows")
            table = app.query_one("#nodes", View).table
            table.select_key("lab02")
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, PromptDialog), "the drain dialog")
            await pilot.press("enter")  # no reason: refused in place
            assert isinstance(app.screen, PromptDialog)
            await pilot.press(*"fan alarm", "enter")
            await wait_for(pilot, lambda: column(app, "nodes", "lab02", "state") == "drained", "the drain")
            assert "fan alarm" in (column(app, "nodes", "lab02", "reasons") or "")
            assert table.keys[0] == "lab02" and table.selected_key() == "lab02"  # drained goes up, cursor too

            probed_before = app.feed.nodes["lab01"]["last_probe"]
            table.select_key("lab01")
            await pilot.press("p")
            await wait_for(pilot, lambda: app.feed.nodes["lab01"]["last_probe"] != probed_before, "the probe")

            table.select_key("lab02")
            await pilot.press("r")
            await wait_for(pilot, lambda: column(app, "nodes", "lab02", "state") == "healthy", "the resume")

            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NodeScreen), "the node screen")
            screen = app.screen
            assert isinstance(screen, NodeScreen)
            await wait_for(pilot, lambda: screen.query_one("#history").row_count >= 2, "the node's history")
            kinds = [screen.query_one("#history").get_row_at(i)[1] for i in range(2)]
            assert kinds == ["resumed", "drained"]  # newest first
            assert screen.query_one("#checks").row_count > 3
            await pilot.press("escape")
            assert len(app.screen_stack) == 1

            await pilot.press("4")  # the timeline has the drain, with its reason
            await wait_for(pilot, lambda: any("fan alarm" in " ".join(r) for r in rows(app, "events").values()),
                           "the drain in the events")  # fmt: skip
            await pilot.press("5")  # the resources of seed 003: each node's make-up and use
            await wait_for(pilot, lambda: set(rows(app, "cluster")) == {"lab01", "lab02"}, "the cluster view")
            assert column(app, "cluster", "lab01", "used") == "0/8"
            assert column(app, "cluster", "lab01", "os") not in (None, "", "?")  # read from the node


async def test_alerts_acknowledge_and_resolve(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            async with await ApiClient.connect(loaded.socket_path) as client:
                job = await client.call("submit", spec={"name": "boom", "command": "sh -c 'echo dying; exit 3'"})
            await pilot.press("3")
            await wait_for(pilot, lambda: rows(app, "alerts"), "the job_failed alert")
            key, row = next(iter(rows(app, "alerts").items()))
            assert "job_failed" in row and f"job {job['id']}" in row
            await pilot.press("a")
            await wait_for(pilot, lambda: (column(app, "alerts", key, "state") or "").startswith("ack"), "the ack")
            await pilot.press("R", "y")
            await wait_for(pilot, lambda: key not in rows(app, "alerts"), "the resolve")

            # enter on an alert opens its job; the log tail shows what the job printed
            async with await ApiClient.connect(loaded.socket_path) as client:
                await client.call("submit", spec={"name": "boom2", "command": "sh -c 'echo dying; exit 3'"})
            await wait_for(pilot, lambda: rows(app, "alerts"), "a second alert")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen")
            await pilot.press("l")
            log = app.screen.query_one("#log")
            await wait_for(pilot, lambda: "dying" in "\n".join(log.lines), "the log tail")

            # the Launch tab: what rank 0 was started with, read back from its run folder on the node
            app.screen.query_one(TabbedContent).active = "launch"
            launch = app.screen.query_one("#launch-text", Static)
            await wait_for(pilot, lambda: "FT_JOB_ID=" in str(launch.render()), "the launch files")
            shown = str(launch.render())
            assert "hostfile" in shown and "127.0.0.1 slots=" in shown and "echo dying" in shown


async def test_readonly_hides_every_change(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded, readonly=True)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            for action in ("stop", "delete", "submit", "drain", "resume", "probe", "ack", "resolve", "priority",
                           "extend", "scale"):  # fmt: skip
                assert app.check_action(action, ()) is False, action
            await pilot.press("n", "x", "S", "2", "d")
            await pilot.pause(0.2)
            assert len(app.screen_stack) == 1  # no dialog opened
            assert all(n["state"] == "healthy" for n in app.feed.nodes.values())


@pytest.mark.parametrize("readonly", [False])
async def test_attached_to_serve_has_the_same_features(tmp_path: Path, readonly: bool) -> None:
    async with lab(tmp_path) as loaded:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(loaded, stop))
        try:
            for _ in range(200):
                if loaded.socket_path.exists():
                    break
                await asyncio.sleep(0.05)
            app = ConsoleApp(loaded, readonly=readonly)
            async with app.run_test(size=SIZE) as pilot:
                await ready(pilot, app)
                assert app.scheduler_mode == "attached"
                await pilot.press("2")
                await wait_for(pilot, lambda: len(rows(app, "nodes")) == 2, "the node rows")
                app.query_one("#nodes", View).table.select_key("lab01")
                await pilot.press("d", *"through the socket", "enter")
                await wait_for(pilot, lambda: column(app, "nodes", "lab01", "state") == "drained", "the drain")
        finally:
            stop.set()
            await asyncio.wait_for(server, 30)


async def test_job_actions_clone_priority_extend_delete_on_marked_rows(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            async with await ApiClient.connect(loaded.socket_path) as client:
                a = await client.call("submit", spec={"name": "a", "command": "sleep 60", "gpus_per_node": 8,
                                                      "max_runtime": "1h"})  # fmt: skip
                b = await client.call("submit", spec={"name": "b", "command": "sleep 60", "gpus_per_node": 8,
                                                      "max_runtime": "1h"})  # fmt: skip
            await wait_for(pilot, lambda: {str(a["id"]), str(b["id"])} <= rows(app, "jobs").keys(), "the jobs")
            table = app.query_one("#jobs", View).table

            table.select_key(str(a["id"]))
            await pilot.press("c")  # clone
            await wait_for(pilot, lambda: any(j.get("cloned_from") == a["id"] for j in app.feed.jobs.values()),
                           "the clone")  # fmt: skip

            clone = next(j for j in app.feed.jobs.values() if j.get("cloned_from") == a["id"])
            queued = (b["id"], clone["id"])  # a runs on lab01; b and its clone wait: their priority may change
            await wait_for(pilot, lambda: str(clone["id"]) in rows(app, "jobs"), "the clone's row")
            for job_id in queued:  # mark both: the next action applies to both
                table.select_key(str(job_id))
                await pilot.press("space")
            assert app.view.marked == {str(j) for j in queued}
            await pilot.press("plus")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ChoiceDialog", "the priority dialog")
            await pilot.press("down", "enter")  # normal -> urgent
            await wait_for(pilot, lambda: all(app.feed.jobs[j]["priority"] == "urgent" for j in queued),
                           "the new priority")  # fmt: skip
            assert not app.view.marked  # done with them

            table.select_key(str(a["id"]))
            await pilot.press("e")
            await wait_for(pilot, lambda: isinstance(app.screen, PromptDialog), "the extend dialog")
            await pilot.press(*"ten minutes", "enter")  # not a duration: the dialog says so and stays
            await pilot.pause(0.2)
            assert isinstance(app.screen, PromptDialog)
            assert str(app.screen.query_one("#problem").render())
            for _ in "ten minutes":
                await pilot.press("backspace")
            await pilot.press(*"30m", "enter")
            async with await ApiClient.connect(loaded.socket_path) as client:
                for _ in range(100):
                    shown = await client.call("show", job=a["id"])
                    if shown["max_runtime_s"] == 3600 + 1800 or shown.get("extra_runtime_s"):
                        break
                    await pilot.pause(0.1)
                events = [e["message"] for e in shown["events"]]
            assert any("30m" in m or "1800" in m for m in events), events

            table.select_key(str(b["id"]))
            await pilot.press("ctrl+d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: str(b["id"]) not in rows(app, "jobs"), "the deleted job to leave")
            async with await ApiClient.connect(loaded.socket_path) as client:
                await client.call("stop", jobs=[j["id"] for j in app.feed.jobs.values() if j["status"] != "stopped"])


async def test_scale_an_elastic_job_from_its_row(tmp_path: Path) -> None:
    async with lab(tmp_path) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            spec = {"name": "hog", "command": "sleep 60", "gpus_per_node": 8}
            async with await ApiClient.connect(loaded.socket_path) as client:
                hog = await client.call("submit", spec=spec)  # holds lab01: the elastic job waits for 2 nodes
                spec |= {
                    "name": "elastic",
                    "mode": "pytorch",
                    "nodes": 2,
                    "fault_tolerance": {"elastic": {"min_nodes": 1}},
                }
                elastic = await client.call("submit", spec=spec)
            await wait_for(pilot, lambda: {str(hog["id"]), str(elastic["id"])} <= rows(app, "jobs").keys(), "the jobs")
            table = app.query_one("#jobs", View).table

            table.select_key(str(hog["id"]))
            await pilot.press("S")  # not elastic: said so, no dialog
            await pilot.pause(0.3)
            assert len(app.screen_stack) == 1

            table.select_key(str(elastic["id"]))
            assert app.feed.jobs[elastic["id"]]["status"] == "queued"  # placed at its new size once scaled
            await pilot.press("S")
            await wait_for(pilot, lambda: isinstance(app.screen, PromptDialog), "the scale dialog")
            assert "how many nodes? (1-2, now 2)" in str(app.screen.query_one("Label").render())
            await pilot.press("3", "enter")  # out of range: the dialog says so and stays
            await pilot.pause(0.2)
            assert isinstance(app.screen, PromptDialog)
            assert "from 1 to 2" in str(app.screen.query_one("#problem").render())
            await pilot.press("backspace", "1", "enter")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, "the dialog to close")
            await wait_for(pilot, lambda: app.feed.jobs[elastic["id"]]["nodes"] == 1, "the new size")
            async with await ApiClient.connect(loaded.socket_path) as client:
                shown = await client.call("show", job=elastic["id"])
                assert shown["nodes"] == 1
                assert any(c["type"] == "Scaling" for c in shown["conditions"]), shown["conditions"]
                await pilot.press("2")  # a node row: scaling is for jobs only
                assert app.check_action("scale", ()) is False
                await client.call("stop", jobs=[hog["id"], elastic["id"]])


async def test_the_debug_tab_shows_what_every_rank_does(tmp_path: Path) -> None:
    """`D` on a job's row: its screen at the Debug tab, with the evidence (`ftconsole debug`) gathered from the
    node, the rank's stack in it."""
    script = tmp_path / "waits.py"
    script.write_text("import time\ndef wait_here():\n    time.sleep(600)\nprint('waiting', flush=True)\nwait_here()\n")
    async with lab(tmp_path, nodes=1) as loaded:
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            async with await ApiClient.connect(loaded.socket_path) as client:
                job = await client.call("submit", spec={"name": "waits", "command": f"python3 {script}"})
                ran = lambda j: any(r["state"] == "running" for a in j["attempts"] for r in a["runs"])  # noqa: E731
                for _ in range(300):
                    if ran(await client.call("show", job=job["id"])):
                        break
                    await asyncio.sleep(0.1)
            await pilot.press("1")
            await wait_for(pilot, lambda: rows(app, "jobs"), "the job's row")
            await pilot.press("D")  # from the job's row: its screen, at the Debug tab
            await wait_for(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen")
            await wait_for(pilot, lambda: app.screen.query("#debug-text"), "the Debug tab")
            text = app.screen.query_one("#debug-text", Static)
            await wait_for(pilot, lambda: "verdict:" in str(text.render()), "the evidence", timeout=60)
            shown = str(text.render())
            assert "no rank stands out: rank 0 is at waits.py:3 in wait_here" in shown, shown
            assert "rank 0:\n    wait_here (" in shown, shown
            assert app.screen.query_one(TabbedContent).active == "debug"
