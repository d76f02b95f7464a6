"""The console: a Textual app for operators on call.

It reaches the scheduler only through the client API (`scheduler.serve.client`). When `ftconsole serve` already runs
on the config's state_dir, it attaches to its socket. Otherwise it runs the scheduler embedded (the control
loop, the probes and the API socket, so the CLI works while it is open) and calls its operations in-process.
Both paths give the same features. A client can also be handed in (tests, or a read of the store alone).

Views (number keys): 1 Jobs, 2 Nodes, 3 Alerts, 4 Events, 5 Cluster, 6 Map (every GPU as a cell, `mapview.py`), 7
Timeline (the queue over the hours to come, `timelineview.py`), 8 Shares (`shares.py`); in Jobs, an array of jobs is
one row, and `t` shows or hides a row per task. Every action is an `action_*` method
bound in `BINDINGS`; `check_action` hides the ones that do not apply to the view, and every action that changes
something under `--readonly`. Data is read once a second by a worker, for the visible view, and applied by diff
(`LineTable`), so the cursor and scroll never jump and the UI never waits on SSH.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen
from textual.widgets import ContentSwitcher, DataTable, Footer, Input
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState

from ftconsole.scheduler import gctune
from ftconsole.scheduler.errors import AlreadyRunning, FtError, NotRunning
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.serve.client import LocalClient, SocketClient, this_process
from ftconsole.scheduler.serve.daemon import Operations, serve
from ftconsole.scheduler.spec.config import LoadedConfig
from ftconsole.tui import rows as R
from ftconsole.tui.actions import Actions
from ftconsole.tui.detail import JobScreen, NodeScreen
from ftconsole.tui.feed import Feed
from ftconsole.tui.header import ConsoleHeader
from ftconsole.tui.linetable import LineTable
from ftconsole.tui.mapview import ClusterMap, MapView
from ftconsole.tui.shares import SharesView
from ftconsole.tui.timelineview import TimelineChart, TimelineView
from ftconsole.tui.views import AlertsView, ClusterView, EventsView, JobsView, NodesView, View

REFRESH_S = 1.0
COLLECT_AFTER_S = 0.25  # after an update, the collector's work waits this long: its frame is drawn by then
VIEWS = (
    ("jobs", "1"),
    ("nodes", "2"),
    ("alerts", "3"),
    ("events", "4"),
    ("cluster", "5"),
    ("map", "6"),
    ("timeline", "7"),
    ("shares", "8"),
)
VIEW_NAMES = tuple(name for name, _ in VIEWS)

# what each action changes (hidden under --readonly) and which kind of row it works on
WRITES = frozenset(
    {
        "stop",
        "delete",
        "clone",
        "priority",
        "extend",
        "scale",
        "hold",
        "drain",
        "resume",
        "probe",
        "probe_all",
        "ack",
        "resolve",
        "submit",
    }
)
MAIN_SCREEN_ONLY = frozenset({"view", "filter", "mark", "submit", "probe_all", "escape", "tasks"})
JOB, NODE, ALERT = frozenset({"job"}), frozenset({"node"}), frozenset({"alert"})
ROW_KINDS = {
    "stop": JOB,
    "delete": JOB,
    "clone": JOB,
    "priority": JOB,
    "extend": JOB,
    "scale": JOB,
    "hold": JOB,
    "logs": JOB,
    "debug": JOB | ALERT,  # on an alert: its job's
    "shell": JOB | NODE | ALERT,  # on an alert: the rank its evidence names, or its node
    "drain": NODE,
    "resume": NODE,
    "probe": NODE,
    "ack": ALERT,
    "resolve": ALERT,
    "tasks": JOB,
}


class JumpProvider(Provider):
    """`:` (or ctrl+p): jump to a job (by id or name) or a node (by name)."""

    def _targets(self) -> list[tuple[str, str, Callable[[], Any]]]:
        app = self.app
        assert isinstance(app, ConsoleApp)
        out: list[tuple[str, str, Callable[[], Any]]] = []
        for name in sorted(app.feed.nodes):
            out.append((f"node {name}", app.feed.nodes[name]["state"], partial(app.open_node, name)))
        for job_id, job in sorted(app.feed.jobs.items(), reverse=True):
            ref = job.get("ref") or job_id  # a task of an array: 12[7]
            out.append((f"job {ref} {job['name']}", job["status"], partial(app.open_job, job_id)))
        return out

    async def discover(self) -> Hits:
        for text, help_, callback in self._targets()[:50]:
            yield DiscoveryHit(text, callback, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, help_, callback in self._targets():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), callback, help=help_)


class ConsoleApp(Actions):
    TITLE = "ftconsole"
    COMMANDS = App.COMMANDS | {JumpProvider}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "keys", "Keys"),
        *(Binding(key, f"view('{name}')", name.title(), show=False) for name, key in VIEWS),
        Binding("slash", "filter", "Filter"),
        Binding("colon", "command_palette", "Jump", show=False),
        Binding("escape", "escape", "Back", show=False),
        Binding("space", "mark", "Mark", show=False),
        Binding("t", "tasks", "Tasks"),  # shown while the Jobs view has an array (check_action)
        Binding("n", "submit", "New job"),
        Binding("l", "logs", "Logs"),
        Binding("D", "debug", "Debug"),  # shift+d: `d` drains
        Binding("s", "shell", "Shell"),
        Binding("x", "stop", "Stop"),
        Binding("ctrl+d", "delete", "Delete"),
        Binding("c", "clone", "Clone"),
        Binding("plus", "priority", "Priority"),
        Binding("e", "extend", "Extend"),
        Binding("S", "scale", "Scale"),  # shift+s: `s` is the shell
        Binding("h", "hold", "Hold/release", show=False),
        Binding("d", "drain", "Drain"),
        Binding("r", "resume", "Resume"),
        Binding("p", "probe", "Probe"),
        Binding("P", "probe_all", "Probe all", show=False),
        Binding("a", "ack", "Ack"),
        Binding("R", "resolve", "Resolve"),
    ]
    CSS = """
    #views { height: 1fr; }
    #filter { height: 1; border: none; padding: 0 1; background: $boost; }
    #filter:focus { background: $accent 30%; }
    """

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        readonly: bool = False,
        client: Any = None,
        clock: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
        theme: str | None = None,
        view: str = "jobs",
    ) -> None:
        super().__init__()
        if view not in VIEW_NAMES:
            raise ValueError(f"no view {view!r}: the views are {', '.join(VIEW_NAMES)}")
        self.first_view = view
        if theme is not None:  # "light", "dark" or any Textual theme name; also from the palette (ctrl+p)
            self.theme = {"light": "textual-light", "dark": "textual-dark"}.get(theme, theme)
        self.loaded = loaded
        self.readonly = readonly
        self.clock = clock
        self.refresh_s = refresh_s
        self.client: Any = client
        self.scheduler_mode = "given" if client is not None else "starting"  # embedded | attached | given
        self.feed = Feed(clock=clock)
        self._stop = asyncio.Event()
        self._connected = asyncio.Event()
        self._arrays_shown = False  # whether the Jobs view had an array at its last update (`t` applies)
        self._frozen = False  # gc.freeze() after the first read (`_freeze`)
        self.between_updates = gctune.BetweenUpdates()  # the cyclic collector's work, after an update's frame
        self._frozen_views: set[str] = set()  # the views frozen after their first update too
        self._thresholds = gc.get_threshold()  # the collector's before `_freeze` tuned them
        self.sub_title = str(loaded.file) + (" · read-only" if readonly else "")
        self._header = ConsoleHeader()

    # -- layout --------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield self._header
        with ContentSwitcher(initial=self.first_view, id="views"):
            yield JobsView(id="jobs")
            yield NodesView(id="nodes")
            yield AlertsView(id="alerts")
            yield EventsView(id="events")
            yield ClusterView(id="cluster")
            yield MapView(id="map")
            yield TimelineView(id="timeline")
            yield SharesView(id="shares")
        yield Input(placeholder="/ filters the view (a regular expression; enter applies, esc cancels)", id="filter")
        yield Footer()

    @property
    def view(self) -> View:
        switcher = self.query_one("#views", ContentSwitcher)
        return self.query_one(f"#{switcher.current}", View)

    async def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        R.use_palette("dark" if self.current_theme.dark else "light")
        if self.client is None:
            self.connect()
        else:
            self._connected.set()
        self.view.table.focus()
        self.poll()

    def _freeze(self) -> None:
        """What the first read built (the app, its widgets, 10,000 rows) is collected once and then kept out of the
        cyclic GC's sight (gc.freeze), so that its full collections, every few seconds of updates, no longer walk
        it: they were the p99 of an update (bench/console.py). It is still freed as usual when no longer used;
        only a reference cycle in it waits for `on_unmount`, which gives it back to the collector."""
        if not self._frozen:
            self._frozen = True
            gc.collect()
            gc.freeze()
            # and the collections come between updates (`between_updates`), where nobody waits for them
            self._thresholds = gctune.tune(gctune.BETWEEN_UPDATES)

    async def on_unmount(self) -> None:
        if self._frozen:
            gc.unfreeze()
            gc.set_threshold(*self._thresholds)
        self._stop.set()
        with contextlib.suppress(WorkerCancelled, WorkerFailed):  # Textual may have cancelled them already
            await self.workers.wait_for_complete()

    # -- reaching the scheduler ----------------------------------------------------------------------------

    @work(exclusive=True, group="scheduler", exit_on_error=False)
    async def connect(self) -> None:
        """Attach to a running scheduler, or run one embedded until the app ends."""
        socket = self.loaded.socket_path
        try:
            await self._attach_socket()
            return
        except NotRunning:
            pass

        answering: list[Operations] = []  # the API's own: on a standby they refuse a change naming the leader

        def ready(scheduler: Any) -> None:
            self.client = LocalClient(answering[0], this_process())
            self._mode("embedded", f"scheduler embedded · API {socket}")

        try:
            await serve(self.loaded, self._stop, ready=ready, answering=answering.append)
        except AlreadyRunning:  # another console or `ftconsole serve` started meanwhile
            await self._attach_socket()

    async def _attach_socket(self) -> None:
        api = await ApiClient.connect(self.loaded.socket_path, timeout=2.0, scheduler_dir=self.loaded.state_dir)
        try:
            self.client = SocketClient(api)
            self._mode("attached", f"attached to the scheduler at {self.loaded.socket_path}")
            await self._stop.wait()
        finally:
            await api.close()

    def _mode(self, mode: str, text: str) -> None:
        self.scheduler_mode = mode
        self.sub_title = f"{self.loaded.file} · {text}" + (" · read-only" if self.readonly else "")
        self._connected.set()

    # -- data ----------------------------------------------------------------------------------------------

    @work(exclusive=True, group="poll", exit_on_error=False)
    async def poll(self) -> None:
        """Read what the visible view needs once a second and apply it; the clock alone moves ages on."""
        await self._connected.wait()
        first = True
        while not self._stop.is_set():
            await self.refresh_data()
            if first:
                first = False
                self._freeze()
            if await self._stopped_within(min(COLLECT_AFTER_S, self.refresh_s)):  # the update's frame is drawn
                break
            self.between_updates()
            await self._stopped_within(max(0.0, self.refresh_s - COLLECT_AFTER_S))

    async def _stopped_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def refresh_data(self, *sources: str) -> None:
        if self.client is None:
            return
        view = self.view
        wanted = set(sources or view.sources) | {"alerts"}  # open alerts count in every title
        await self.feed.refresh(self.client, sorted(wanted))
        self.apply_view()

    def apply_view(self) -> None:
        with self.batch_update():
            self.view.update_view(self.feed, self.clock())
            alerts = sum(1 for a in self.feed.alerts.values() if a["state"] == "open")
            title = f"ftconsole · {alerts} open alert{'s' * (alerts != 1)}" if alerts else "ftconsole"
            if title != self.title:  # `title`'s watchers would repaint the whole screen: only the header changes
                self.set_reactive(ConsoleApp.title, title)
                self._header.show_title()
        if self._frozen and self.view.id not in self._frozen_views:
            # what a view builds at its first update (a map's cells, a timeline's bands) is kept while it is
            # shown: out of the collector's sight too, as the first read's is (`_freeze`): a full collection that
            # walked it was the p99 of the Map view's updates
            self._frozen_views.add(str(self.view.id))
            gc.freeze()
        arrays = isinstance(self.view, JobsView) and bool(self.view.arrays)
        if arrays != self._arrays_shown:  # `t` comes and goes in the footer
            self._arrays_shown = arrays
            self.refresh_bindings()

    def _theme_changed(self, theme: Any) -> None:
        R.use_palette("dark" if theme.dark else "light")
        for view in self.query(View):
            view.restyle()
        self.apply_view()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place where a worker's unexpected error becomes a notification."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            title = error.title if isinstance(error, FtError) else type(error).__name__
            self.notify(str(error), title=title, severity="error", timeout=10)

    # -- views, filter, marks ------------------------------------------------------------------------------

    def action_view(self, name: str) -> None:
        if not isinstance(self.screen, Screen) or self.screen is not self.screen_stack[0]:
            return
        self.query_one("#views", ContentSwitcher).current = name
        self.view.table.focus()
        self._show_filter()
        self.apply_view()  # what we have now, at once; the poll reads the rest
        self.run_worker(self.refresh_data(), group="view-switch", exclusive=True, exit_on_error=False)

    def action_filter(self) -> None:
        self._show_filter()
        # now, not after a refresh: what is typed right after `/` goes to the filter
        self.set_focus(self.query_one("#filter", Input))

    @on(Input.Submitted, "#filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        try:
            self.view.set_filter(event.value.strip())
        except ValueError as exc:
            self.notify(str(exc), title="filter", severity="error")
            return
        event.stop()
        # Focus moves back to the table only once this key is done with: the table would take the same enter
        # as "open the row" (seen in a real terminal, not under the pilot).
        self.call_after_refresh(self._close_filter)
        self.apply_view()

    def _close_filter(self) -> None:
        self.set_focus(self.view.table)

    def _show_filter(self) -> None:
        """The filter bar shows the view's own filter (each view keeps its own), or its hint when it has none."""
        self.query_one("#filter", Input).value = self.view.pattern.pattern if self.view.pattern else ""

    def action_escape(self) -> None:
        bar = self.query_one("#filter", Input)
        if bar.has_focus:
            self._show_filter()
            self._close_filter()
        elif self.view.marked:
            self.view.marked.clear()
            self.apply_view()
        elif self.view.pattern is not None:
            self.view.pattern = None
            self._show_filter()
            self.apply_view()

    def action_mark(self) -> None:
        key = self.view.table.selected_key()
        if key is None or self.view.kind not in ("job", "node", "alert"):
            return
        self.view.toggle_mark(key)
        self.apply_view()
        self.view.table.action_cursor_down()

    def action_tasks(self) -> None:
        """`t` on an array's row, or on one of its tasks: show or hide a row per task of the array."""
        view = self.view
        key = view.table.selected_key()
        if not isinstance(view, JobsView) or key is None:
            return
        array = R.array_of_key(key)
        if array is None and key.isdecimal():
            array = self.feed.jobs.get(int(key), {}).get("array_id")
        if array is None:
            self.notify(f"job {key} is no array's: `t` shows the tasks of an array", severity="warning")
            return
        view.toggle_array(int(array))
        self.apply_view()
        view.table.select_key(R.array_key(int(array)))  # closing it from a task's row: back on the array's

    def action_keys(self) -> None:
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.readonly and action in WRITES:
            return False
        if action in MAIN_SCREEN_ONLY and self.screen is not self.screen_stack[0]:
            return False
        if action == "tasks":
            return self._arrays_shown
        kinds = ROW_KINDS.get(action)
        if kinds is None:
            return True
        if isinstance(self.screen, JobScreen):
            return "job" in kinds
        if isinstance(self.screen, NodeScreen):
            return "node" in kinds
        if self.screen is not self.screen_stack[0]:
            return False
        return self.view.kind in kinds

    # -- opening details -----------------------------------------------------------------------------------

    @on(DataTable.RowSelected)
    @on(LineTable.RowSelected)
    def row_selected(self, event: DataTable.RowSelected | LineTable.RowSelected) -> None:
        if self.screen is not self.screen_stack[0] or event.row_key.value is None:
            return
        key = str(event.row_key.value)
        kind = self.view.kind
        if kind == "job":
            if (job := self._task_of(key, "the screen of")) is not None:
                self.open_job(int(job))
        elif kind == "node":
            self.open_node(key)
        elif kind == "alert":
            alert = self.feed.alerts.get(int(key))
            if alert and alert.get("job") is not None:
                self.open_job(int(alert["job"]), alert=alert)  # at the evidence: the alert's event on top
            elif alert and alert.get("node"):
                self.open_node(str(alert["node"]))

    @on(ClusterMap.Selected)
    def map_selected(self, event: ClusterMap.Selected) -> None:
        if self.screen is self.screen_stack[0]:
            self.open_node(event.node)

    @on(TimelineChart.Selected)
    def timeline_selected(self, event: TimelineChart.Selected) -> None:
        if self.screen is self.screen_stack[0] and (job := self._task_of(event.key, "the screen of")) is not None:
            self.open_job(int(job))

    def open_job(self, job_id: int, *, alert: dict[str, Any] | None = None) -> JobScreen | None:
        if self.client is None:
            return None
        screen = JobScreen(self.client, self.clock, job_id, alert=alert)
        self.push_screen(screen)
        return screen

    def open_node(self, name: str) -> None:
        if self.client is not None:
            self.push_screen(NodeScreen(self.client, self.clock, name))

    # -- targets -------------------------------------------------------------------------------------------

    def _targets(self, kind: str) -> list[str]:
        if isinstance(self.screen, JobScreen) and kind == "job":
            return [str(self.screen.job_id)]
        if isinstance(self.screen, NodeScreen) and kind == "node":
            return [self.screen.node]
        if self.view.kind != kind:
            return []
        return self.view.targets()

    def _one(self, kind: str) -> str | None:
        targets = self._targets(kind)
        if len(targets) > 1:
            self.notify(f"this acts on one {kind}: unmark the others (esc)", severity="warning")
            return None
        return targets[0] if targets else None

    def _job(self, job_id: int) -> dict[str, Any]:
        """What the console knows of a job: the feed's row, or the job screen's own data."""
        if job_id in self.feed.jobs:
            return dict(self.feed.jobs[job_id])
        if isinstance(self.screen, JobScreen) and self.screen.job_id == job_id and self.screen.data:
            return dict(self.screen.data)
        return {}

    @work(group="act", exit_on_error=False)
    async def act(self, what: str, op: str, **args: Any) -> Any:
        """Run one operation; say what happened; read the data again at once."""
        try:
            result = await self.client.call(op, **args)
        except FtError as exc:
            self.notify(str(exc), title=f"{what}: {exc.title}", severity="error", timeout=10)
            return None
        self.notify(what, timeout=3)
        self.view.marked.clear()
        await self.refresh_data()
        return result

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        yield from super().get_system_commands(screen)
        for name, key in VIEWS:
            yield SystemCommand(f"View: {name} ({key})", f"Show the {name} view", partial(self.action_view, name))
