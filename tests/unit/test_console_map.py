"""The cluster map (key 6): what each GPU's cell says, how nodes group and fit a screen, and the view in the app,
headless, on the fixed 5-node cluster and on 1,000 nodes of 8 GPUs at 200x50."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftconsole.tui import maps as M
from ftconsole.tui.app import VIEW_NAMES, ConsoleApp
from ftconsole.tui.mapview import ClusterMap
from tests.console_data import NOW, FixedClient, ManyNodesClient, fixed_config

GPU = "NVIDIA H100 80GB HBM3"


def node(name: str, state: str = "healthy", *, utils: list[float | None] | None = None,
         held: dict[int, int] | None = None, reasons: list[str] | None = None, debug: list[int] | None = None,
         pool: str = "h100", model: str = GPU) -> dict[str, Any]:  # fmt: skip
    utils = [0.0] * 8 if utils is None else utils
    return {
        "name": name, "pool": pool, "state": state, "reasons": reasons or [],
        "gpus": [{"index": i, "name": model, "utilization": u} for i, u in enumerate(utils)],
        "held": [{"gpu": g, "job": j} for g, j in (held or {}).items()],
        "held_for_debug": [{"gpu": g, "job": 9, "until": NOW + 60} for g in debug or []],
    }  # fmt: skip


def symbols(cells: tuple[M.Gpu, ...]) -> str:
    return "".join(c.symbol for c in cells)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (node("a"), "········"),
        (node("a", utils=[100, 55, 5, None, 0, 0, 0, 0], held={0: 1, 1: 1, 2: 1, 3: 1}), "█▅○█····"),
        (node("a", held={0: 7, 1: 7}, utils=[90] * 8), "▪▪······"),  # job 7 is preemptible
        (node("a", "unreachable", utils=[]), "????????"),  # no GPU data: as many cells as its group's nodes
        (node("a", "unknown"), "????????"),
        (node("a", "unhealthy", reasons=["gpu5: 2 uncorrectable ECC errors"]), "✗✗✗✗✗✗✗✗"),
        (node("a", "isolated", held={0: 1}), "⊘⊘⊘⊘⊘⊘⊘⊘"),
        (node("a", "degraded", reasons=["gpu3 temperature 88C > 85C"], held={3: 1}, utils=[50] * 8), "···!····"),
        (node("a", "drained", held={1: 1}, utils=[80] * 8), "─▇──────"),  # draining: its job still runs
        (node("r"), "□□□□□□□□"),  # node r is in an active reservation
        (node("a", debug=[2, 3]), "··◆◆····"),
    ],
)
def test_each_gpu_shows_the_first_that_holds_of_what_it_is_doing(n: dict[str, Any], expected: str) -> None:
    assert symbols(M.gpu_cells(n, 8, preemptible={7}, reserved={"r"})) == expected


def test_a_failed_gpu_that_a_check_names_stands_out_and_cells_are_shared() -> None:
    cells = M.gpu_cells(node("a", "unhealthy", reasons=["gpu5: 2 uncorrectable ECC errors"]), 8)
    assert [c.emphasis for c in cells] == [False] * 5 + [True] + [False] * 2
    assert cells[0] is M.gpu_cells(node("b", "unhealthy"), 8)[0]  # a few dozen objects for any size of cluster


def test_nodes_group_by_pool_and_make_up_in_natural_order_and_a_dead_node_keeps_its_place() -> None:
    nodes = [
        node("n10"),
        node("n2"),
        node("n1", "unreachable", utils=[]),
        node("a1", pool="a100", model="A100", utils=[0] * 4),
    ]
    groups = M.groups(nodes)
    assert [(g.pool, g.model, g.gpus, g.nodes) for g in groups] == [
        ("a100", "A100", 4, ("a1",)),
        ("h100", "H100 80GB HBM3", 8, ("n1", "n2", "n10")),
    ]


def test_where_the_config_declares_switches_the_nodes_group_by_leaf_too() -> None:
    nodes = [node(f"n{i}") for i in (1, 2, 10, 11, 3)]
    leaf_of = {"n1": "leaf2", "n2": "leaf2", "n10": "leaf10", "n11": "leaf10"}  # n3 under none
    groups = M.groups(nodes, leaf_of)
    assert [(g.switch, g.nodes) for g in groups] == [("", ("n3",)), ("leaf2", ("n1", "n2")), ("leaf10", ("n10", "n11"))]
    assert groups[1].title == "h100 · 8x H100 80GB HBM3 · leaf2"


def test_the_roomiest_layout_that_fits() -> None:
    small = M.groups([node(f"gpu{i:02d}") for i in range(1, 6)])
    named = M.fit(small, 120, 20, color=True)
    assert named.label == 5 and not named.dense and len(named.lines) == 2  # a header and one line of 5 named nodes

    big = M.groups([node(f"gpu{i:04d}", pool=("train", "infer")[i % 2]) for i in range(1000)])
    dense = M.fit(big, 198, 44, color=True)  # the map's room in a 200x50 terminal
    assert dense.dense and len(dense.lines) <= 44 and len(dense.where) == 1000
    plain = M.fit(big, 198, 44, color=False)  # no colour to tell half blocks apart: a cell per GPU, scrolled
    assert not plain.dense and not plain.label and len(plain.lines) > 44 and len(plain.where) == 1000
    for name, (line, col) in dense.where.items():  # each node where the layout says, inside the width
        assert name in dense.lines[line] and col + dense.span(8) - 1 <= 198  # type: ignore[operator]


def test_summary_and_the_node_line() -> None:
    n = node("gpu07", "degraded", reasons=["gpu3 temperature 88C > 85C"], held={0: 12, 1: 12}, utils=[90] * 8)
    cells = M.gpu_cells(n, 8)
    assert M.summary(M.counts(cells)) == "2 busy · 5 idle · 1 warning"
    line = M.node_line(n, cells, {12: {"name": "llm-sft"}}, {})
    assert "gpu07" in line and "degraded" in line and "jobs 12 llm-sft" in line and "gpu3 temperature" in line


def test_the_console_and_the_cli_name_the_same_views(tmp_path: Path) -> None:
    from ftconsole.cli import CONSOLE_VIEWS

    assert CONSOLE_VIEWS == VIEW_NAMES
    with pytest.raises(ValueError, match="no view 'maps'"):
        ConsoleApp(fixed_config(tmp_path), client=FixedClient(), view="maps")


def map_text(cluster_map: ClusterMap) -> list[str]:
    return ["".join(s.text for s in cluster_map.render_line(y)).rstrip() for y in range(cluster_map.size.height)]


async def test_the_map_view_on_the_fixed_cluster(tmp_path: Path) -> None:
    """NO_COLOR is set for the suite: the symbols alone say what each GPU does."""
    console = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(120, 24)) as pilot:
        await console.refresh_data("jobs", "nodes", "alerts", "events", "cluster", "reservations")
        await pilot.press("6")
        await pilot.pause()
        cluster_map = console.view.table
        assert isinstance(cluster_map, ClusterMap) and console.no_color
        lines = map_text(cluster_map)
        assert lines[0].startswith("h100 · 8x H100 80GB HBM3  5 nodes · 16 busy · 1 preemptible · 6 reserved")
        # job 104 is preemptible on gpu03's GPU 0; its GPU 3 is hot; the node is reserved (fan swap)
        assert lines[1] == "gpu01 ████████  gpu02 ████████  gpu03 ▪□□!□□□□  gpu04 ????????  gpu05 ────────"
        status = str(console.query_one(".map-status").render())
        assert status.startswith("gpu01  ·  healthy") and "jobs 101 llama-70b-pretrain" in status

        await pilot.press("right", "right")
        await pilot.pause()
        assert cluster_map.selected_key() == "gpu03"
        status = str(console.query_one(".map-status").render())
        assert "reserved: maint-gpu03" in status and "gpu3: temperature 88C" in status
        assert console._targets("node") == ["gpu03"]  # drain, resume and probe act on the node under the cursor

        await pilot.press("space")  # marks gpu03, the cursor moves down (a single line: stays)
        await pilot.press("right", "space")
        assert console._targets("node") == ["gpu03", "gpu04"]
        await pilot.press("escape")

        await pilot.press("slash", *"unreach", "enter")  # the filter dims the nodes it does not match
        await pilot.pause()
        assert "/unreach/ 1 of 5" in str(console.view.query_one(".view-title").render())
        assert cluster_map.matches == {"gpu04"}
        await pilot.press("escape")
        await pilot.pause()
        assert cluster_map.matches is None

        await pilot.press("enter")  # the node under the cursor opens
        await pilot.pause()
        assert type(console.screen).__name__ == "NodeScreen" and console.screen.node == "gpu04"  # type: ignore[attr-defined]


def many_nodes_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int) -> ConsoleApp:
    """The console on the Map view of `count` nodes of 8 GPUs, in colour (half blocks need it)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    client = ManyNodesClient(count)
    return ConsoleApp(fixed_config(tmp_path), client=client, clock=lambda: NOW, refresh_s=3600, view="map")


async def loaded_map(console: ConsoleApp, pilot: Any) -> ClusterMap:
    await console.refresh_data()
    await pilot.pause()
    cluster_map = console.view.table
    assert isinstance(cluster_map, ClusterMap) and cluster_map.layout_ is not None
    return cluster_map


async def test_1000_nodes_of_8_gpus_fit_a_200x50_terminal_in_colour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = many_nodes_map(tmp_path, monkeypatch, 1000)
    async with console.run_test(size=(200, 50)) as pilot:
        cluster_map = await loaded_map(console, pilot)
        assert cluster_map.layout_.dense and len(cluster_map.layout_.where) == 1000
        assert len(cluster_map.layout_.lines) <= cluster_map.size.height  # all of it, no scrolling
        title = str(console.view.query_one(".view-title").render())
        assert "1000 nodes · 8000 GPUs:" in title and "failed" in title and "isolated" in title

        await pilot.press("end")
        assert cluster_map.selected_key() == "node0999"  # the last of the last group (train)
        await pilot.press("home", "down")
        first, below = cluster_map.layout_.where["node0000"], cluster_map.layout_.where[cluster_map.selected_key()]  # type: ignore[index]
        assert below[0] == first[0] + 1 and abs(below[1] - first[1]) <= cluster_map.layout_.span(8)

        line, col = cluster_map.layout_.where["node0500"]  # a click on a node's cells puts the cursor there
        assert cluster_map.node_at(col + 1, line - round(cluster_map.scroll_y)) == "node0500"
        await pilot.click(ClusterMap, offset=(col + 1 + 1, line))  # +1: the map's left padding
        assert cluster_map.selected_key() == "node0500"


async def test_a_taller_terminal_gives_the_map_a_roomier_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = many_nodes_map(tmp_path, monkeypatch, 300)
    async with console.run_test(size=(150, 20)) as pilot:
        cluster_map = await loaded_map(console, pilot)
        assert cluster_map.layout_.dense  # 22 lines of a cell per GPU do not fit its 14
        await pilot.resize_terminal(150, 40)
        await pilot.pause()
        assert not cluster_map.layout_.dense and len(cluster_map.layout_.lines) <= cluster_map.size.height
        await pilot.resize_terminal(150, 20)
        await pilot.pause()
        assert cluster_map.layout_.dense


async def test_the_map_groups_by_the_switches_the_scheduler_goes_by_found_or_declared(tmp_path: Path) -> None:
    """The `fabric` op names the leaves (found by discovery here: the config declares none): the map's groups
    follow them."""

    class FoundFabric(FixedClient):
        async def call(self, op: str, **args: Any) -> Any:
            if op == "fabric":
                return {"leaves": {"sw-a": ["gpu01", "gpu02"], "sw-b": ["gpu03", "gpu04", "gpu05"]}, "parents": {},
                        "blocks": {}, "source": {"switches": "found", "blocks": "none"}, "found_at": NOW}  # fmt: skip
            return await super().call(op, **args)

    console = ConsoleApp(fixed_config(tmp_path), client=FoundFabric(), clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(120, 24)) as pilot:
        await pilot.press("6")
        await console.refresh_data("jobs", "nodes", "reservations", "fabric")
        await pilot.pause()
        lines = map_text(console.view.table)
        titles = [line for line in lines if line.startswith("h100")]
        make_up = "h100 · 8x H100 80GB HBM3"
        assert [t.split("  ")[0] for t in titles] == [f"{make_up} · sw-a", f"{make_up} · sw-b"]


async def test_the_map_title_gives_the_age_of_what_is_read_at_every_refresh(tmp_path: Path) -> None:
    """The fabric is read every 30 s: 20 s after it, with the nodes just read, the data is not 20 s old."""
    now = [NOW]
    console = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: now[0], refresh_s=3600)
    async with console.run_test(size=(120, 24)) as pilot:
        await pilot.press("6")
        await console.refresh_data()
        now[0] += 20
        await console.refresh_data()  # nodes, jobs and reservations again; the fabric not yet
        await pilot.pause()
        title = str(console.view.query_one(".view-title").render())
        assert "data 0s old" in title, title


async def test_a_node_gone_redraws_the_lines_whose_nodes_moved(tmp_path: Path) -> None:
    """Eight idle nodes (equal cells); one goes: the line it was on holds other nodes now, with cells that compare
    equal to what it showed. The screen shows the nodes as they are, not as they were."""

    def idle(i: int) -> dict[str, Any]:
        gpus = [{"index": g, "name": "H100", "utilization": 0.0} for g in range(8)]
        return {"name": f"node{i:04d}", "pool": "train", "state": "healthy", "reasons": [], "held": [],
                "held_for_debug": [], "gpus": gpus}  # fmt: skip

    class Idle(FixedClient):
        def __init__(self) -> None:
            self.nodes = [idle(i) for i in range(8)]

        async def call(self, op: str, **args: Any) -> Any:
            return list(self.nodes) if op == "nodes" and not args.get("nodeset") else await super().call(op, **args)

    client = Idle()
    console = ConsoleApp(fixed_config(tmp_path), client=client, clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(120, 24)) as pilot:
        await pilot.press("6")
        await console.refresh_data()
        await pilot.pause()
        assert "node0002" in console.export_screenshot()
        client.nodes = [n for n in client.nodes if n["name"] != "node0002"]
        await console.refresh_data()
        await pilot.pause()
        screen = console.export_screenshot()
        assert "node0002" not in screen and all(f"node{i:04d}" in screen for i in (0, 1, 3, 4, 5, 6, 7))


def test_a_held_gpus_index_is_looked_up_as_a_key_is() -> None:
    """Indexes as JSON could bring them: 1.0 and true are the key 1; an index out of range, none or a word holds
    no cell."""
    view = {"name": "n", "state": "healthy",
            "held": [{"gpu": 1.0, "job": 5}, {"gpu": 9, "job": 7}, {"gpu": None, "job": 8}, {"gpu": "x", "job": 9}],
            "gpus": [{"index": 0, "utilization": 50.0}, {"index": 1, "utilization": 95.0}]}  # fmt: skip
    assert [c.kind for c in M.gpu_cells(view, 4)] == ["idle", "busy", "idle", "idle"]
    assert M.gpu_cells(view, 4)[1].level == 7
    view["held"] = [{"gpu": True, "job": 6}, {"gpu": 3, "job": 6}]
    assert [c.kind for c in M.gpu_cells(view, 4)] == ["idle", "busy", "idle", "busy"]
