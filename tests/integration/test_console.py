"""The console against a lab cluster: node table, detail, drain and resume, read-only mode."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml

from ftconsole.app import ConsoleApp, NodeDetail, NodesTable
from ftconsole.lab import LabCluster
from scheduler.api import ApiClient
from scheduler.config import load_config
from scheduler.service import ClusterService

SIZE = (140, 30)


async def wait_for(pilot, predicate, what: str, attempts: int = 200) -> None:
    for _ in range(attempts):
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def states(app: ConsoleApp) -> dict[str, str]:
    return {name: view["state"] for name, view in app.views.items()}


async def test_console_shows_nodes_detail_and_drains(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=8) as lab:
        loaded = load_config(lab.config_path)
        app = ConsoleApp(loaded)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: "healthy" in states(app).values(), "the first probe")
            assert states(app)["lab07"] == "unhealthy"  # the layout's injected ECC fault
            table = app.query_one(NodesTable)
            assert table.row_count == 8
            assert table.get_row_index("lab07") == 0  # worst first
            table.move_cursor(row=0)
            await pilot.pause()
            assert table.selected_node() == "lab07"

            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NodeDetail), "the detail screen")
            assert "uncorrectable ECC" in " ".join(app.screen.view["reasons"])  # type: ignore[attr-defined]
            await pilot.press("escape")

            await pilot.press("down", "down", "down")  # a healthy node, far below lab07
            target = table.selected_node()
            assert target is not None and target != "lab07"
            assert table.get_row_index(target) == 3
            await pilot.press("d")
            await pilot.press(*"fan alarm", "enter")
            await wait_for(pilot, lambda: states(app).get(target) == "drained", "the drain")
            # the drained row moved up to just below lab07, and the cursor moved with it
            assert table.get_row_index(target) == 1
            assert table.selected_node() == target

            await pilot.press("r")
            await wait_for(pilot, lambda: states(app).get(target) == "healthy", "the resume")

    async with ClusterService.open(loaded) as svc:
        kinds = [e.kind for e in await svc.events(node=target)]
    assert kinds[-2:] == ["drained", "resumed"]


async def test_readonly_console_cannot_drain(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=2) as lab:
        app = ConsoleApp(load_config(lab.config_path), readonly=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: set(states(app).values()) == {"healthy"}, "the first probe")
            # the probe age moves on by itself between probes (the interval is a minute)
            table = app.query_one(NodesTable)
            await wait_for(pilot, lambda: table.get_cell("lab01", "probed") not in ("0s", "never"), "the age to tick")
            await pilot.press("d")
            await pilot.pause(0.2)
            assert not any(v["state"] == "drained" for v in app.views.values())
            assert len(app.screen_stack) == 1  # no drain dialog opened


async def test_console_runs_the_scheduler_embedded_and_serves_its_socket(tmp_path: Path) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    try:
        async with LabCluster(tmp_path / "lab", nodes=2) as lab:
            config = yaml.safe_load(lab.config_path.read_text())
            config["api"] = {"socket": str(sock_dir / "ft.sock")}
            config["scheduler"] = {"tick": "0.3s"}
            path = tmp_path / "cluster.yaml"
            path.write_text(yaml.safe_dump(config))
            loaded = load_config(path)
            app = ConsoleApp(loaded)
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: app.scheduler_mode == "embedded", "the embedded scheduler")
                # the CLI's way in: the socket, while the console runs
                async with await ApiClient.connect(loaded.socket_path) as client:
                    job = await client.call("submit", spec={"name": "via-cli", "command": "echo hi"})
                    final = [s async for s in client.stream("wait", job=job["id"])][-1]
                    assert final["status"] == "succeeded"
                    assert "".join([c async for c in client.stream("logs", job=job["id"])]) == "hi\n"
                # a second console attaches instead of running a second scheduler
                second = ConsoleApp(loaded, readonly=True)
                async with second.run_test(size=SIZE) as pilot2:
                    await wait_for(pilot2, lambda: second.scheduler_mode == "attached", "the second console")
            assert not loaded.socket_path.exists()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
