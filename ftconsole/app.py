"""The console: a Textual app for operators on call.

When no scheduler runs on the config's state_dir, the console runs it embedded (`scheduler.daemon.serve`:
the control loop, the probes, and the API socket, so the CLI works while the console is open); when
`ftconsole serve` already runs, it attaches and only reads. It shows the nodes: state with reasons, pool,
GPUs, last probe age. The table is updated by diff (rows keyed by node name, `update_cell` for changed
values), so the cursor and scroll never jump.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Input, Label, Static
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState

from ftconsole.format import age, gpu_summary
from scheduler.config import LoadedConfig
from scheduler.daemon import serve
from scheduler.errors import AlreadyRunning, FtError
from scheduler.service import ClusterService
from scheduler.ssh import local_user

STATE_STYLE = {
    "healthy": "green",
    "degraded": "yellow",
    "unhealthy": "bold red",
    "unreachable": "bold magenta",
    "drained": "cyan",
    "isolated": "bold cyan",
    "unknown": "dim",
}
REFRESH_S = 2.0  # how often the views are read back from the store (the scheduler writes it)
# Worst first, so the nodes that need attention are at the top.
STATE_ORDER = ["unreachable", "unhealthy", "isolated", "degraded", "drained", "unknown", "healthy"]

COLUMNS = (("node", "NODE"), ("state", "STATE"), ("pool", "POOL"), ("gpus", "GPUS"), ("util", "UTIL"),
           ("probed", "PROBED"), ("reasons", "REASONS"))  # fmt: skip


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def node_cells(view: dict[str, Any], now: float) -> dict[str, Any]:
    gpus = view["gpus"]
    utils = [g["utilization"] for g in gpus if g.get("utilization") is not None]
    last = view["last_probe"]
    return {
        "node": view["name"],
        "state": state_text(view["state"]),
        "pool": view["pool"],
        "gpus": gpu_summary(gpus),
        "util": f"{sum(utils) / len(utils):.0f}%" if utils else "-",
        "probed": age(now - last) if last is not None else "never",
        "reasons": "; ".join(view["reasons"]) or "",
    }


class NodesTable(DataTable[Any]):
    """Nodes keyed by name; `apply` adds, updates and removes only what changed."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "open", "Detail")]

    class NodeOpened(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def apply(self, views: list[dict[str, Any]], now: float) -> None:
        selected = self.selected_node()
        wanted = {v["name"]: node_cells(v, now) for v in views}
        present = {str(k.value) for k in self.rows}
        for name in present - wanted.keys():
            self.remove_row(name)
        for name, cells in wanted.items():
            if name not in present:
                self.add_row(*(cells[k] for k, _ in COLUMNS), key=name)
                continue
            for key, _ in COLUMNS:
                if self.get_cell(name, key) != cells[key]:
                    self.update_cell(name, key, cells[key], update_width=True)
        order = {s: i for i, s in enumerate(STATE_ORDER)}
        self.sort("state", "node", key=lambda row: (order.get(str(row[0]), 99), str(row[1])))
        if selected is not None and selected in wanted:  # the cursor follows its node, not its row number
            self.move_cursor(row=self.get_row_index(selected), animate=False)

    def selected_node(self) -> str | None:
        if self.row_count == 0:
            return None
        key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return str(key.value)

    def action_open(self) -> None:
        name = self.selected_node()
        if name:
            self.post_message(self.NodeOpened(name))


class NodeDetail(ModalScreen[None]):
    """Every check of one node with value and threshold, and its GPUs."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "dismiss", "Back")]
    DEFAULT_CSS = """
    NodeDetail { align: center middle; }
    NodeDetail > Vertical { width: 90%; height: 90%; border: thick $accent; background: $surface; padding: 0 1; }
    NodeDetail DataTable { height: auto; max-height: 50%; margin-bottom: 1; }
    """

    def __init__(self, view: dict[str, Any]) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        v = self.view
        facts = v.get("facts") or {}
        with Vertical():
            yield Label(
                Text.assemble((v["name"], "bold"), "  ", state_text(v["state"]), f"  {v['host']}:{v['port'] or 22}")
            )
            yield Label("; ".join(v["reasons"]) or "no problem reported")
            yield Label(
                f"{facts.get('os') or '?'}  kernel {facts.get('kernel') or '?'}  {facts.get('cpus') or '?'} CPUs  "
                f"{(facts.get('mem_total_mib') or 0) // 1024} GiB  driver {facts.get('driver_version') or '?'}"
            )
            checks: DataTable[Any] = DataTable(id="checks", cursor_type="row")
            yield checks
            gpus: DataTable[Any] = DataTable(id="gpus", cursor_type="row")
            yield gpus

    def on_mount(self) -> None:
        checks = self.query_one("#checks", DataTable)
        checks.add_columns("CHECK", "STATUS", "VALUE", "THRESHOLD", "MESSAGE")
        colour = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
        for c in self.view["checks"]:
            value = "n/a" if c["value"] is None else f"{c['value']} {c['unit']}".strip()
            checks.add_row(c["name"], Text(c["status"], style=colour.get(c["status"], "")), value,
                           c["threshold"] if c["threshold"] is not None else "-", c["message"])  # fmt: skip
        gpus = self.query_one("#gpus", DataTable)
        gpus.add_columns("GPU", "NAME", "MEM", "UTIL", "TEMP", "ECC", "HEALTHY")
        for g in self.view["gpus"]:
            mem = f"{g['memory_used_mib'] or 0}/{g['memory_total_mib'] or '?'} MiB"
            gpus.add_row(g["index"], g["name"] or "?", mem, _na(g["utilization"], "%"), _na(g["temperature"], "C"),
                         _na(g["ecc_uncorrectable"]), _na(g["healthy"]))  # fmt: skip


def _na(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


class DrainScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    DrainScreen { align: center middle; }
    DrainScreen > Vertical { width: 70; height: auto; border: thick $warning; background: $surface; padding: 1; }
    """

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Drain {self.node}: no new work will be placed there. Reason:")
            yield Input(placeholder="e.g. fan alarm, ticket #123", id="reason")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value.strip())


class ConsoleApp(App[int]):
    TITLE = "ftconsole"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "probe_selected", "Probe node"),
        Binding("P", "probe_all", "Probe all"),
        Binding("d", "drain", "Drain"),
        Binding("r", "resume", "Resume"),
        Binding("question_mark", "help", "Keys"),
    ]
    CSS = """
    #summary { height: 1; padding: 0 1; background: $boost; }
    NodesTable { height: 1fr; }
    """

    data_time: reactive[float | None] = reactive(None)

    def __init__(self, loaded: LoadedConfig, *, readonly: bool = False) -> None:
        super().__init__()
        self.loaded = loaded
        self.readonly = readonly
        self.service: ClusterService | None = None
        self._service_cm: Any = None
        self.scheduler_mode = "starting"  # embedded | attached
        self._stop_scheduler = asyncio.Event()
        self.views: dict[str, dict[str, Any]] = {}
        self.sub_title = str(loaded.file)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading...", id="summary")
        yield NodesTable(id="nodes")
        yield Footer()

    async def on_mount(self) -> None:
        self._service_cm = ClusterService.open(self.loaded)
        self.service = await self._service_cm.__aenter__()
        await self.refresh_nodes()
        self.query_one(NodesTable).focus()
        self.run_scheduler()
        self.set_interval(1.0, self._tick)
        self.set_interval(REFRESH_S, self.refresh_nodes)

    async def on_unmount(self) -> None:
        self._stop_scheduler.set()
        with contextlib.suppress(WorkerCancelled, WorkerFailed):  # Textual may have cancelled it already
            await self.workers.wait_for_complete()
        if self._service_cm is not None:
            await self._service_cm.__aexit__(None, None, None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.readonly and action in {"drain", "resume"})

    # -- data --------------------------------------------------------------------------------------------

    async def refresh_nodes(self) -> None:
        assert self.service is not None
        views = [v.to_json() for v in await self.service.nodes()]
        self.views = {v["name"]: v for v in views}
        self.data_time = time.time()
        with self.batch_update():
            self.query_one(NodesTable).apply(views, self.data_time)

    def _tick(self) -> None:
        if self.data_time is None:
            return
        with self.batch_update():  # ages move on between refreshes; only the changed cells are touched
            self.query_one(NodesTable).apply(list(self.views.values()), time.time())
        counts: dict[str, int] = {}
        for v in self.views.values():
            counts[v["state"]] = counts.get(v["state"], 0) + 1
        parts = [Text(f"{len(self.views)} nodes  ")]
        for state in STATE_ORDER:
            if counts.get(state):
                parts += [state_text(f"{counts[state]} {state}"), Text("  ")]
        parts.append(Text(f"data {age(time.time() - self.data_time)} old", style="dim"))
        self.query_one("#summary", Static).update(Text.assemble(*parts))

    @work(exclusive=True, group="scheduler", exit_on_error=False)
    async def run_scheduler(self) -> None:
        """The scheduler embedded (loop, probes, API socket) until the app ends; attach if one already runs."""
        assert self.service is not None

        def ready(_: object) -> None:
            self.scheduler_mode = "embedded"
            self.sub_title = f"{self.loaded.file} · scheduler embedded · API {self.loaded.socket_path}"

        try:
            await serve(self.loaded, self._stop_scheduler, ready=ready, service=self.service)
        except AlreadyRunning:
            self.scheduler_mode = "attached"
            self.sub_title = f"{self.loaded.file} · attached to the scheduler of {self.loaded.state_dir}"

    async def _probe(self, nodeset: str | None) -> None:
        assert self.service is not None
        try:
            await self.service.probe(nodeset)
        except FtError as exc:
            self.notify(str(exc), title=exc.title, severity="error")
        await self.refresh_nodes()

    @work(group="probe-now", exit_on_error=False)
    async def probe_now(self, nodeset: str | None) -> None:
        self.notify(f"probing {nodeset or 'all nodes'}...", timeout=2)
        await self._probe(nodeset)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place where a worker's unexpected error becomes a notification."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            title = error.title if isinstance(error, FtError) else type(error).__name__
            self.notify(str(error), title=title, severity="error")

    # -- actions -----------------------------------------------------------------------------------------

    def _selected(self) -> str | None:
        return self.query_one(NodesTable).selected_node()

    def action_probe_selected(self) -> None:
        if name := self._selected():
            self.probe_now(name)

    def action_probe_all(self) -> None:
        self.probe_now(None)

    def action_drain(self) -> None:
        name = self._selected()
        if not name:
            return

        def done(reason: str | None) -> None:
            if reason:
                self._admin(name, reason)

        self.push_screen(DrainScreen(name), done)

    def action_resume(self) -> None:
        if name := self._selected():
            self._admin(name, None)

    @work(group="admin", exit_on_error=False)
    async def _admin(self, name: str, reason: str | None) -> None:
        assert self.service is not None
        try:
            if reason is None:
                await self.service.resume(name, by=local_user())
                self.notify(f"{name} resumed")
            else:
                await self.service.drain(name, reason=reason, by=local_user())
                self.notify(f"{name} drained: {reason}")
        except FtError as exc:
            self.notify(str(exc), title=exc.title, severity="error")
        await self.refresh_nodes()

    @on(NodesTable.NodeOpened)
    def open_node(self, event: NodesTable.NodeOpened) -> None:
        view = self.views.get(event.name)
        if view:
            self.push_screen(NodeDetail(view))

    def action_help(self) -> None:
        self.notify(
            "enter detail · p probe node · P probe all · d drain · r resume · q quit",
            title="Keys",
            timeout=8,
        )
