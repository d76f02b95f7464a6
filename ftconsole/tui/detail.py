"""The detail screens: one job, one node. `esc` goes back to the view they were opened from.

Job: its facts, spec, attempts with the node, GPUs, state and exit of every rank, their curves over the last
hour (GPU utilisation and memory, epochs: `curves.py`), the conditions timeline, each rank's command, hostfile and
env as its run folder holds them, and a live log tail per rank (`[` and `]` switch rank). Opened from an alert, it
shows the alert's evidence on top (the event with the detector's figures) and starts on the rank that stands out,
so `s` and `l` go there. Node: every check with value and threshold, its GPUs and who holds them, their curves over
the last hour, and its history of faults (marked) and drains, with how many faults fell within
probes.flaky_window and whether that makes it flaky. Both re-read their data every few seconds.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import Any, ClassVar

import yaml
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Log, Static, TabbedContent, TabPane

from ftconsole.debug_cli import evidence_text
from ftconsole.format import age, node_doing, runtime_lines, test_line
from ftconsole.probes.health import is_fault
from ftconsole.scheduler.decide.arrays import summary
from ftconsole.scheduler.decide.hangs import ranges
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.serve.client import Client
from ftconsole.scheduler.spec.config import format_duration
from ftconsole.tui import alertevidence as E
from ftconsole.tui import rows as R
from ftconsole.tui.curves import job_curves, node_curves

DETAIL_REFRESH_S = 2.0
DEBUG_HINT = "D gathers what every rank is doing now (states, stacks) and names the rank that stands out"
LOG_TAIL_LINES = 200
NODE_HISTORY_KINDS = ("unhealthy", "unreachable", "isolated", "drained", "resumed", "healthy", "degraded")
FAULT = "!"  # before the kind of a history event that counts as a fault (probes.health.is_fault)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


class DetailScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "app.pop_screen", "Back")]
    DEFAULT_CSS = """
    DetailScreen > #head { dock: top; height: auto; padding: 0 1; background: $boost; }
    DetailScreen > TabbedContent, DetailScreen > VerticalScroll { height: 1fr; }
    DetailScreen TabPane { height: 1fr; }
    DetailScreen DataTable { height: auto; max-height: 20; }
    DetailScreen .section { text-style: bold; margin-top: 1; padding: 0 1; }
    DetailScreen Log { height: 1fr; }
    DetailScreen > #evidence { height: auto; max-height: 8; padding: 0 1; border-bottom: solid $warning; }
    """

    def __init__(self, client: Client, clock: Callable[[], float]) -> None:
        super().__init__()
        self.client = client
        self.clock = clock
        self.data: dict[str, Any] | None = None
        self.fetched: float | None = None
        self.error: str | None = None

    def on_mount(self) -> None:
        self.reload()
        self.set_interval(DETAIL_REFRESH_S, self.reload)

    @work(exclusive=True, group="detail-reload", exit_on_error=False)
    async def reload(self) -> None:
        try:
            self.data = await self.fetch()
            self.fetched = self.clock()
            self.error = None
        except FtError as exc:
            self.error = str(exc)
        if self.data is not None:
            with self.app.batch_update():
                self.show(self.data)
        self.query_one("#head", Static).update(self.head())

    async def fetch(self) -> dict[str, Any]:
        raise NotImplementedError

    def show(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def head(self) -> Text:
        raise NotImplementedError

    def _age(self) -> Text:
        if self.error:
            return Text(f"  {self.error}", style=R.style("bad"))
        if self.fetched is None:
            return Text("  loading…", style="dim")
        return Text(f"  data {age(self.clock() - self.fetched)} old", style="dim")


def fill(table: DataTable[Any], rows: list[tuple[Any, ...]]) -> None:
    """Small detail tables: refill only when their content changed, keeping the cursor row."""
    current = [tuple(table.get_row_at(i)) for i in range(table.row_count)]
    if current == rows:
        return
    row = table.cursor_row
    table.clear()
    table.add_rows(rows)
    if rows:
        table.move_cursor(row=min(row, len(rows) - 1), animate=False)


JOB_TABS = ("overview", "attempts", "curves", "launch", "logs", "debug")  # `1` to `6` in a job's screen


class JobScreen(DetailScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "logs", "Logs"),
        Binding("D", "debug", "Debug"),
        Binding("left_square_bracket", "rank(-1)", "Rank -"),
        Binding("right_square_bracket", "rank(1)", "Rank +"),
        # a tab by its place: the keyboard's way to Attempts, Curves and Launch (the focus need not be on the tabs)
        *(Binding(str(i), f"tab({name!r})", f"{name.title()} tab", show=False) for i, name in enumerate(JOB_TABS, 1)),
    ]

    def __init__(
        self, client: Client, clock: Callable[[], float], job_id: int, alert: dict[str, Any] | None = None
    ) -> None:
        super().__init__(client, clock)
        self.job_id = job_id
        self.rank = 0
        self.alert = alert  # opened from this alert: its evidence on top, the rank that stands out chosen
        self.evidence: E.Evidence | None = None
        self.focus_attempt: int | None = None  # the evidence's attempt while its rank is the one shown
        self._focused = False
        self._streaming: tuple[int, int] | None = None  # (attempt, rank) of the log tail shown
        self.samples: dict[str, Any] | None = None  # its ranks over time (API `samples`), while Curves is shown

    def compose(self) -> ComposeResult:
        yield Static("", id="head")
        yield Static("", id="evidence")
        with TabbedContent(initial="overview"):
            with TabPane("Overview", id="overview"), VerticalScroll():
                yield Static("", id="facts")
                yield Label("Conditions", classes="section")
                yield DataTable(id="conditions", cursor_type="row")
                yield Label("Spec", classes="section")
                yield Static("", id="spec")
            with TabPane("Attempts", id="attempts"), Vertical():
                yield DataTable(id="runs", cursor_type="row")
                yield Label("Steps (ftconsole run)", classes="section", id="steps-title")
                yield DataTable(id="steps", cursor_type="row")
            with TabPane("Curves", id="curves"), VerticalScroll():
                yield Static("", id="curves-text")
            with TabPane("Launch", id="launch"), VerticalScroll():
                yield Static("", id="launch-text")
            with TabPane("Logs", id="logs"), Vertical():
                yield Label("", id="log-title")
                yield Log(id="log", max_lines=5000)
            with TabPane("Debug", id="debug"), VerticalScroll():
                yield Static(Text(DEBUG_HINT, style="dim"), id="debug-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#conditions", DataTable).add_columns("TIME", "CONDITION", "MESSAGE")
        self.query_one("#runs", DataTable).add_columns(
            "TRY", "RANK", "NODE", "GPUS", "STATE", "PID", "EXIT", "STARTED", "ENDED", "RUN FOLDER", "ERROR"
        )
        self.query_one("#steps", DataTable).add_columns(
            "STEP", "STATE", "EXIT", "MODE", "NODES:GPUS", "STARTED", "ENDED", "BY", "COMMAND", "MESSAGE"
        )
        self.query_one("#evidence", Static).display = self.alert is not None
        super().on_mount()

    async def fetch(self) -> dict[str, Any]:
        job = dict(await self.client.call("show", job=self.job_id))
        if self.query_one(TabbedContent).active == "curves":  # read only while shown
            self.samples = await _samples(self.client, job=self.job_id)
        return job

    def head(self) -> Text:
        job = self.data
        if job is None:
            return Text.assemble((f"job {self.job_id}", "bold"), self._age())
        state = R.job_state(job, self.clock())
        return Text.assemble(
            (f"job {job['id']} ", "bold"),
            (job["name"], "bold"),
            "  ",
            R.styled(state, R.STATUS_STYLE.get(state)),
            f"  owner {job['owner']}  priority {job['priority']}  try {job['attempt']}  {job['mode']} "
            f"{job['nodes']}x{job['gpus_per_node']} GPUs",
            self._age(),
        )

    def show(self, job: dict[str, Any]) -> None:
        now = self.clock()
        if self.alert is not None:
            self._show_evidence(job)
        facts = [
            f"submitted {_when(job['submitted'])}   started {_when(job['started'])}   ended {_when(job['ended'])}",
            f"runtime {age(job['runtime_s']) if job['runtime_s'] is not None else '-'}"
            f"   max {age(job['max_runtime_s']) if job['max_runtime_s'] else 'none'}"
            f"   last output {age(now - job['last_output']) + ' ago' if job.get('last_output') else '-'}",
            f"project {job['project'] or '-'}   access {job['access']}   output {job['output'] or '-'}",
        ]
        if (good := job.get("goodput")) and good.get("goodput") is not None:  # useful against lost to failures
            facts.append(f"goodput {good['text']}")
        if job.get("tasks"):  # a task of an array: where it stands, and its array
            counts = summary(t["status"] for t in job["tasks"])
            facts.append(f"task {job['ref']} of array {job['array_id']}[{job['array']}]: {counts}")
        if elastic := job.get("elastic"):  # `S` scales it within this range
            facts.append(f"nodes {job['nodes']} (elastic {elastic['min_nodes']}-{elastic['max_nodes']})")
        if job.get("message"):
            facts.append(f"message: {job['message']}")
        if job.get("stop_reason"):
            facts.append(f"stop: {job['stop_reason']} by {job['stop_by']}")
        self.query_one("#facts", Static).update(Text("\n".join(facts)))  # Text: a message may hold [x]
        fill(
            self.query_one("#conditions", DataTable),
            [(_when(c["time"]), c["type"], c["message"]) for c in job.get("conditions", [])],
        )
        self.query_one("#spec", Static).update(Text(yaml.safe_dump(job.get("spec") or {}, sort_keys=False)))
        runs = []
        for attempt in reversed(job.get("attempts", [])):
            for run in attempt["runs"]:
                runs.append(
                    (
                        str(attempt["number"]),
                        str(run["rank"]),
                        run["node"],
                        ",".join(map(str, run["gpus"])),
                        run["state"],
                        str(run["pid"] or "-"),
                        "-" if run["exit_code"] is None else str(run["exit_code"]),
                        _when(run["started"]),
                        _when(run["ended"]),
                        run["run_dir"],
                        run["error"] or "",
                    )
                )
        fill(self.query_one("#runs", DataTable), runs)
        steps = [
            (
                str(step["number"]),
                step["state"],
                "-" if step["exit_code"] is None else str(step["exit_code"]),
                step["mode"],
                " ".join(f"{r['node']}:{','.join(map(str, r['gpus'])) or '-'}" for r in step["ranks"]),
                _when(step["started"]),
                _when(step["ended"]),
                step["run_by"],
                " ".join(step["argv"]),
                step["message"],
            )
            for step in reversed(job.get("steps") or [])
        ]
        for part in ("#steps", "#steps-title"):
            self.query_one(part).display = bool(steps)
        fill(self.query_one("#steps", DataTable), steps)
        active = self.query_one(TabbedContent).active
        if active == "logs":
            self._ensure_log()
        elif active == "curves":
            self.query_one("#curves-text", Static).update(job_curves(self.samples, job, now))

    def _show_evidence(self, job: dict[str, Any]) -> None:
        """The alert's evidence on top; the first time, its rank becomes the screen's (for `s`, `l`)."""
        assert self.alert is not None
        self.evidence = ev = E.alert_evidence(self.alert, job.get("events") or [])
        self.query_one("#evidence", Static).update(E.evidence_text(ev))
        if not self._focused and ev.event is not None:
            self._focused = True
            if ev.rank is not None:
                self.rank = ev.rank
                self.focus_attempt = ev.attempt

    # -- debug ---------------------------------------------------------------------------------------------

    def action_debug(self) -> None:
        self.query_one(TabbedContent).active = "debug"
        self.query_one("#debug-text", Static).update(Text("gathering what every rank is doing…", style="dim"))
        self.gather()

    @work(exclusive=True, group="job-debug", exit_on_error=False)
    async def gather(self) -> None:
        """`ftconsole debug`: the evidence of every rank and the one that stands out, whose rank then becomes the
        screen's (`s` opens a shell on its node, `l` its log)."""
        text = self.query_one("#debug-text", Static)
        try:
            doc = await self.client.call("debug", job=self.job_id)
        except FtError as exc:
            text.update(Text(str(exc), style=R.style("bad")))
            return
        text.update(Text(evidence_text(doc)))
        node = doc["verdict"]["node"]
        current = [a for a in (self.data or {}).get("attempts", []) if a["number"] == doc["attempt"]]
        at = sorted(r["rank"] for a in current for r in a["runs"] if r["node"] == node)
        if node is not None and at:
            self.rank, self.focus_attempt = at[0], None

    # -- logs ----------------------------------------------------------------------------------------------

    def ranks(self) -> list[int]:
        if not self.data or not self.data.get("attempts"):
            return []
        current = [a for a in self.data["attempts"] if a["number"] == self.data["attempt"]] or self.data["attempts"]
        return sorted(r["rank"] for r in current[-1]["runs"])

    def action_logs(self) -> None:
        self.query_one(TabbedContent).active = "logs"
        self._ensure_log()

    def action_tab(self, name: str) -> None:
        self.query_one(TabbedContent).active = name  # (the Debug tab gathers nothing until `D`)

    def action_rank(self, step: int) -> None:
        ranks = self.ranks()
        if not ranks:
            return
        i = ranks.index(self.rank) if self.rank in ranks else 0
        self.rank = ranks[(i + step) % len(ranks)]
        self.focus_attempt = None  # the current attempt's ranks from now on
        tabs = self.query_one(TabbedContent)
        if tabs.active == "launch":
            self.show_launch(self.rank)
        else:
            tabs.active = "logs"
            self._ensure_log()

    @on(TabbedContent.TabActivated)
    def tab(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "logs":
            self._ensure_log()
        elif event.pane.id == "curves":
            self.reload()  # its samples now, not at the next refresh
        elif event.pane.id == "launch":
            self.show_launch(self.rank)

    @work(exclusive=True, group="job-launch", exit_on_error=False)
    async def show_launch(self, rank: int) -> None:
        """Rank `rank`'s argv, hostfile and env, as its run folder on the node holds them."""
        text = self.query_one("#launch-text", Static)
        try:
            where = {"attempt": self.focus_attempt} if self.focus_attempt is not None else {}
            got = await self.client.call("launch", job=self.job_id, rank=rank, **where)
        except FtError as exc:
            text.update(Text(str(exc), style=R.style("bad")))
            return
        out = Text()
        out.append(f"rank {got['rank']} of try {got['attempt']} on {got['node']}: {got['run_dir']}\n\n", "bold")
        out.append("command\n", "bold")
        out.append((shlex.join(got["argv"]) if got.get("argv") else "-") + "\n\n")
        out.append("hostfile\n", "bold")
        out.append((got.get("hostfile") or "-") + "\n")
        out.append("env\n", "bold")
        for key, value in sorted((got.get("env") or {}).items()):
            out.append(f"{key}=", R.style("info"))
            out.append(f"{value}\n")
        out.append("\n[ and ] switch rank", R.style("muted"))
        text.update(out)

    def _ensure_log(self) -> None:
        if self.data is None:
            return
        wanted = (self.focus_attempt or int(self.data["attempt"]), self.rank)
        if self._streaming == wanted:
            return
        self._streaming = wanted
        self.query_one("#log", Log).clear()
        ranks = self.ranks()
        self.query_one("#log-title", Label).update(
            Text(  # Text, not a string: "[ and ]" would be read as markup
                f"output.log of rank {self.rank} (of {len(ranks) or '?'}), try {wanted[0]}: "
                f"the last {LOG_TAIL_LINES} lines, then live    [ and ] switch rank"
            )
        )
        self.tail_log(wanted[0], self.rank)

    @work(exclusive=True, group="job-log", exit_on_error=False)
    async def tail_log(self, attempt: int, rank: int) -> None:
        log = self.query_one("#log", Log)
        try:
            async for chunk in self.client.stream(
                "logs", job=self.job_id, rank=rank, attempt=attempt, follow=True, tail=LOG_TAIL_LINES
            ):
                log.write(chunk)
        except FtError as exc:
            log.write(f"\n[ftconsole: {exc}]\n")
        else:
            log.write("\n[ftconsole: the run ended]\n")


class NodeScreen(DetailScreen):
    def __init__(self, client: Client, clock: Callable[[], float], name: str) -> None:
        super().__init__(client, clock)
        self.node = name
        self.history: list[dict[str, Any]] = []
        self.samples: dict[str, Any] | None = None  # its GPUs over time (API `samples`)
        self.jobs_on: list[dict[str, Any]] = []  # the runs that held its GPUs, the newest job first (`node_jobs`)

    def compose(self) -> ComposeResult:
        yield Static("", id="head")
        with VerticalScroll():
            yield Static("", id="facts")
            yield Label("Checks", classes="section")
            yield DataTable(id="checks", cursor_type="row")
            yield Label("GPUs", classes="section")
            yield DataTable(id="gpus", cursor_type="row")
            yield Label("GPUs over the last hour", classes="section")
            yield Static("", id="curves-text")
            yield Label("Jobs on its GPUs, the newest first", classes="section")
            yield DataTable(id="node-jobs", cursor_type="row")
            yield Label("History: faults, drains and recoveries", classes="section")
            yield DataTable(id="history", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#checks", DataTable).add_columns("CHECK", "STATUS", "VALUE", "THRESHOLD", "MESSAGE")
        self.query_one("#gpus", DataTable).add_columns("GPU", "NAME", "JOB", "MEM", "UTIL", "TEMP", "ECC", "HEALTHY")
        self.query_one("#history", DataTable).add_columns("TIME", "EVENT", "MESSAGE")
        self.query_one("#node-jobs", DataTable).add_columns(
            "JOB", "NAME", "USER", "RANK", "GPUS", "STARTED", "ENDED", "HOW"
        )
        super().on_mount()

    async def fetch(self) -> dict[str, Any]:
        views = await self.client.call("nodes", nodeset=self.node)  # in full: checks, facts, every GPU field
        node = views[0]
        self.history = await self.client.call("events", node=self.node, limit=200)
        self.samples = await _samples(self.client, node=self.node)
        self.jobs_on = await _node_jobs(self.client, self.node)
        return dict(node)

    def head(self) -> Text:
        v = self.data
        if v is None:
            return Text.assemble((self.node, "bold"), self._age())
        return Text.assemble(
            (v["name"], "bold"),
            "  ",
            R.node_state_cell(v),
            f"  {v['host']}:{v['port'] or 22}  pool {v['pool']}",
            self._age(),
        )

    def show(self, v: dict[str, Any]) -> None:
        facts = v.get("facts") or {}
        lines = ["; ".join(node_doing(v) + list(v.get("reasons") or [])) or "no problem reported"]
        if v.get("admin"):
            lines.append(f"{v['admin']} by {v.get('admin_by') or '?'}: {v.get('admin_reason') or ''}")
        if v.get("isolated_passes"):
            lines.append(f"passed the checks {v['isolated_passes']} times in a row since it was isolated")
        lines.extend(_fault_lines(v))
        lines.append(
            f"{facts.get('os') or '?'}  kernel {facts.get('kernel') or '?'}  {facts.get('cpus') or '?'} CPUs  "
            f"{(facts.get('mem_total_mib') or 0) // 1024} GiB  driver {facts.get('driver_version') or '?'}"
        )
        lines.extend(runtime_lines(v.get("facts")))
        lines.extend(f"tested: {test_line(t)}" for t in v.get("tests") or [])  # its last node test of each kind
        last = v.get("last_probe")
        lines.append(f"last probe {age(self.clock() - last) + ' ago' if last else 'never'}")
        self.query_one("#facts", Static).update(Text("\n".join(lines)))
        fill(
            self.query_one("#checks", DataTable),
            [
                (
                    c["name"],
                    R.styled(c["status"], R.CHECK_STYLE.get(c["status"])),
                    "n/a" if c["value"] is None else f"{c['value']} {c.get('unit') or ''}".strip(),
                    "-" if c.get("threshold") is None else str(c["threshold"]),
                    c.get("message") or "",
                )
                for c in v.get("checks") or []
            ],
        )
        holders = {h["gpu"]: "private job" if h.get("private") else h["job"] for h in v.get("held") or []}
        for h in v.get("held_for_debug") or []:
            until = time.strftime("%H:%M", time.localtime(h["until"]))
            holders[h["gpu"]] = f"{'private job' if h.get('private') else h['job']} (held for debug until {until})"
        fill(
            self.query_one("#gpus", DataTable),
            [
                (
                    str(g["index"]),
                    g.get("name") or "?",
                    str(holders.get(g["index"], "-")),
                    f"{g.get('memory_used_mib') or 0}/{g.get('memory_total_mib') or '?'} MiB",
                    _na(g.get("utilization"), "%"),
                    _na(g.get("temperature"), "C"),
                    _na(g.get("ecc_uncorrectable")),
                    _na(g.get("healthy")),
                )
                for g in v.get("gpus") or []
            ],
        )
        fill(
            self.query_one("#history", DataTable),
            [(_when(e["time"]), _history_kind(e), e["message"]) for e in reversed(self.history)],
        )
        self.query_one("#curves-text", Static).update(node_curves(self.samples, v.get("gpus") or [], self.clock()))
        fill(self.query_one("#node-jobs", DataTable), [_node_job_row(r) for r in self.jobs_on])


async def _samples(client: Client, **which: Any) -> dict[str, Any] | None:
    """A node's or a job's samples; None from a scheduler that has none to give (older, or a refusal)."""
    try:
        return dict(await client.call("samples", **which))
    except FtError:
        return None


async def _node_jobs(client: Client, node: str) -> list[dict[str, Any]]:
    """The runs that held the node's GPUs (API `node_jobs`); none from a scheduler without the op."""
    try:
        return list((await client.call("node_jobs", node=node))["runs"])
    except FtError:
        return []


def _node_job_row(run: dict[str, Any]) -> tuple[Any, ...]:
    how = str(run["state"])
    if how == "exited":
        how += f" ({run['signal']})" if run.get("signal") else f" (code {run.get('exit_code')})"
    private = run.get("private")
    return (
        "private job" if private else str(run.get("ref") or run["job"]),
        "" if private else str(run.get("name") or ""),
        "" if private else str(run.get("owner") or ""),
        str(run["rank"]),
        ranges(run.get("gpus") or []) or "-",
        _when(run.get("started")),
        _when(run.get("ended")) if run.get("ended") else ("running" if run["state"] == "running" else "-"),
        how,
    )


def _fault_lines(v: dict[str, Any]) -> list[str]:
    """How many faults the node had within the flaky window, and what being flaky means, when it had any."""
    recent = int(v.get("faults_in_window") or 0)
    if not recent:
        return []
    window = format_duration(float(v.get("faults_window_s") or 0))
    line = f"faults: {recent} within {window}, {v.get('faults') or recent} in all (marked {FAULT} below)"
    if v.get("flaky"):
        line = f"{R.FLAKY_MARK} flaky: {line}; it is not resumed automatically: look before resuming it"
    return [line]


def _history_kind(event: dict[str, Any]) -> R.Cell:
    kind = str(event["kind"])
    if not is_fault(kind, event.get("data") or {}):
        return kind
    to = (event.get("data") or {}).get("to")
    return R.styled(f"{FAULT} {kind}" + (f" to {to}" if to else ""), "bad")


def _na(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"
