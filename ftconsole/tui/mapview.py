"""The Map view: every GPU of the cluster as one cell (`maps.py` says what each cell shows), grouped by pool and
GPU make-up, with a cursor on one node.

`ClusterMap` draws through Textual's line API: a line is built again only when what it shows changed (its nodes'
cells, the cursor, the marks, the filter), so a second's update at 1,000 nodes redraws the few lines whose GPUs
moved. The arrow keys move the cursor from node to node (up and down keep the column), `enter` or a double
click opens the node, and the line under the map says what the node under the cursor is doing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Static

from ftconsole.tui import maps as M
from ftconsole.tui import rows as R
from ftconsole.tui.feed import Feed
from ftconsole.tui.linetable import LineView
from ftconsole.tui.mapcells import MapCells
from ftconsole.tui.views import View, set_line

# half-block colours, two GPUs a cell (dense); busy runs from dim to bright green with the utilisation
DENSE = {
    "dark": {"flat": "yellow", "preempt": "cyan", "idle": "grey35", "reserved": "blue", "drained": "grey62",
             "warn": "dark_orange", "debug": "orchid", "isolated": "dodger_blue1", "failed": "red1",
             "down": "magenta"},
    "light": {"flat": "dark_orange3", "preempt": "dark_cyan", "idle": "grey78", "reserved": "blue",
              "warn": "orange_red1", "drained": "grey50", "debug": "orchid", "isolated": "dodger_blue2",
              "failed": "red3", "down": "magenta3"},
}  # fmt: skip
BUSY_RAMP = {
    "dark": ("#1e5a1e", "#236b23", "#287c28", "#2e8e2e", "#34a034", "#3ab33a", "#41c641", "#48da48"),
    "light": ("#a8dca8", "#94d394", "#7fc97f", "#6abf6a", "#55b455", "#40a840", "#2c9c2c", "#178f17"),
}


class ClusterMap(LineView, can_focus=True):
    """The map itself. `show` hands it the nodes' cells; it keeps the cursor on the same node."""

    DEFAULT_CSS = """
    ClusterMap { height: 1fr; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("left", "cursor_left", "Left", show=False),
        Binding("right", "cursor_right", "Right", show=False),
        Binding("home", "cursor_first", "First", show=False),
        Binding("end", "cursor_last", "Last", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("enter", "open", "Open", show=False),
    ]

    class Moved(Message):
        """The cursor is on another node (or on none)."""

        def __init__(self, node: str | None) -> None:
            super().__init__()
            self.node = node

    class Selected(Message):
        """`enter` (or a double click) on a node."""

        def __init__(self, node: str) -> None:
            super().__init__()
            self.node = node

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.groups: list[M.Group] = []
        self.cells: dict[str, tuple[M.Gpu, ...]] = {}
        self.marked: Collection[str] = ()
        self.matches: Collection[str] | None = None  # the nodes the filter lets through (None: no filter)
        self.headers: list[str] = []  # one per group
        self.color = True
        self.palette = "dark"
        self.layout_: M.Layout | None = None
        self._height = 0  # the height the layout was fitted to
        self.cursor: str | None = None
        self._order: list[str] = []  # the nodes in reading order
        self._lines: list[Any] = []  # per line: what it shows (compared to decide what to redraw)
        self._strips: dict[int, tuple[Any, Strip]] = {}
        self._styles: dict[tuple[Any, ...], Style] = {}
        self._base = Style()

    # -- the interface views share with KeyedTable ---------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    def selected_key(self) -> str | None:
        return self.cursor

    def select_key(self, key: str) -> bool:
        if self.layout_ is None or key not in self.layout_.where:
            return False
        self._move(key)
        return True

    # -- data ----------------------------------------------------------------------------------------------

    def show(
        self,
        groups: Sequence[M.Group],
        cells: Mapping[str, tuple[M.Gpu, ...]],
        headers: Sequence[str],
        *,
        marked: Collection[str] = (),
        matches: Collection[str] | None = None,
        color: bool = True,
        palette: str = "dark",
    ) -> None:
        relayout = list(groups) != self.groups or color != self.color
        if palette != self.palette:
            self._strips.clear()
            self._styles.clear()
        self.groups, self.cells, self.headers = list(groups), dict(cells), list(headers)
        self.marked, self.matches, self.color, self.palette = marked, matches, color, palette
        if relayout or self.layout_ is None:
            self._relayout()
        self._update_lines()
        if self.cursor is None or self.cursor not in self.layout_.where:  # type: ignore[union-attr]
            self._move(self._order[0] if self._order else None, scroll=False)

    def on_resize(self, event: events.Resize) -> None:
        """A new width moves every node; a new height may allow a roomier layout (or need a denser one)."""
        if self.groups and (self.layout_ is None or (self.layout_.width, self._height) != tuple(self.size)):
            self._relayout()
            self._update_lines()

    def _relayout(self) -> None:
        width = max(1, self.size.width or 80)
        height = self._height = max(1, self.size.height or 24)
        self.layout_ = M.fit(self.groups, width, height, self.color)
        self._order = [n for g in self.groups for n in g.nodes]
        self._strips.clear()
        self._lines = []  # every line drawn again: a line may hold other nodes now, with cells that compare equal
        self.virtual_size = Size(width, len(self.layout_.lines))

    def _update_lines(self) -> None:
        """What each line shows now; the lines on screen that changed are drawn again."""
        assert self.layout_ is not None
        marked, matches, cursor = self.marked, self.matches, self.cursor
        lines: list[Any] = []
        for line in self.layout_.lines:
            if isinstance(line, int):
                lines.append(self.headers[line] if line < len(self.headers) else "")
            else:
                lines.append(
                    tuple(
                        (self.cells.get(n, ()), n == cursor, n in marked, matches is None or n in matches) for n in line
                    )
                )
        before, self._lines = self._lines, lines
        if len(lines) != len(before):
            self.refresh()
            return
        for index, (now, was) in enumerate(zip(lines, before, strict=True)):
            if now != was:  # a line whose nodes' cells, cursor, marks or match changed: drawn again alone
                self.refresh_line(index)

    # -- drawing -------------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        index = round(self.scroll_y) + y
        width = self.size.width
        base = self.frame_styles()[0]  # the widget's colours under every cell (they change with the theme)
        if base != self._base:
            self._base = base
            self._strips.clear()
            self._styles.clear()
        if index >= len(self._lines):
            return Strip.blank(width, base)
        what = self._lines[index]
        kept = self._strips.get(index)
        if kept is not None and kept[0] == what:
            return kept[1]
        strip = self._header(what, width) if isinstance(what, str) else self._node_strip(index, what, width)
        self._strips[index] = (what, strip)
        return strip

    def _header(self, text: str, width: int) -> Strip:
        title, _, rest = text.partition("  ")
        line = Text.assemble((title, "bold"), "  ", (rest, "dim"), style=self._base)
        line.truncate(width)
        return Strip(line.render(self.app.console), line.cell_len).extend_cell_length(width, self._base)

    def _node_strip(self, index: int, nodes: tuple[Any, ...], width: int) -> Strip:
        assert self.layout_ is not None
        dense, label = self.layout_.dense, self.layout_.label
        names = self.layout_.lines[index]
        assert not isinstance(names, int)
        segments: list[Segment] = []
        run: list[str] = []
        run_style: Style | None = None

        def put(text: str, style: Style) -> None:
            nonlocal run_style
            if style is not run_style and run:
                segments.append(Segment("".join(run), run_style))
                run.clear()
            run_style = style
            run.append(text)

        blank = self._base
        for name, (cells, cursor, marked, match) in zip(names, nodes, strict=True):
            if label:
                put(name.ljust(label), self._style("label", False, cursor, marked, match))
                put(" ", blank)
            if dense:
                for i in range(0, len(cells), 2):
                    lower = cells[i + 1] if i + 1 < len(cells) else None
                    put("▀", self._dense_style(cells[i], lower, match))
                put("◂" if cursor else "•" if marked else " ", self._style("cursor" if cursor else "mark", False))
            else:
                for cell in cells:
                    put(cell.symbol, self._style(cell.kind, cell.emphasis, cursor and not label, marked, match))
                put("  " if label else " ", blank)
        if run:
            segments.append(Segment("".join(run), run_style))
        return Strip(segments).crop_extend(0, width, self._base)

    def _style(self, kind: str, strong: bool, cursor: bool = False, marked: bool = False, match: bool = True) -> Style:
        key = (kind, strong, cursor, marked, match)
        style = self._styles.get(key)
        if style is None:
            role = {"cursor": "strong", "mark": "strong", "label": "none"}.get(kind) or M.KINDS[kind][1]
            style = self._base + Style.parse(R.style(role) or "none")
            if strong:
                style += Style(bold=True, reverse=True)
            if cursor:
                style += Style(reverse=not style.reverse)
            if marked:
                style += Style(underline=True)
            if not match:
                style += Style(dim=True)
            self._styles[key] = style
        return style

    def _dense_style(self, upper: M.Gpu, lower: M.Gpu | None, match: bool) -> Style:
        key = ("dense", upper.kind, upper.level, None if lower is None else (lower.kind, lower.level), match)
        style = self._styles.get(key)
        if style is None:
            colours = Style(
                color=self._dense_colour(upper), bgcolor=None if lower is None else self._dense_colour(lower)
            )
            style = self._base + colours
            if not match:
                style += Style(dim=True)
            self._styles[key] = style
        return style

    def _dense_colour(self, cell: M.Gpu) -> str:
        palette = "light" if self.palette == "light" else "dark"
        return BUSY_RAMP[palette][cell.level] if cell.kind == "busy" else DENSE[palette][cell.kind]

    # -- the cursor ----------------------------------------------------------------------------------------

    def _move(self, node: str | None, scroll: bool = True) -> None:
        if node == self.cursor:
            return
        self.cursor = node
        if self.layout_ is not None:
            self._update_lines()
            if node is not None and scroll:
                line = self.layout_.where[node][0]
                top = round(self.scroll_y)
                if line - 1 < top:  # its group's header too, where it is just above
                    self.scroll_to(y=max(0, line - 1), animate=False, immediate=True)
                elif line >= top + self.size.height:
                    self.scroll_to(y=line - self.size.height + 1, animate=False, immediate=True)
        self.post_message(self.Moved(node))

    def _step(self, delta: int) -> None:
        if not self._order:
            return
        at = self._order.index(self.cursor) if self.cursor in self._order else 0
        self._move(self._order[max(0, min(len(self._order) - 1, at + delta))])

    def _vertical(self, lines: int) -> None:
        """The node `lines` node rows up or down, at the nearest column."""
        if self.layout_ is None or self.cursor is None:
            return
        line, col = self.layout_.where[self.cursor]
        rows = [i for i, entry in enumerate(self.layout_.lines) if not isinstance(entry, int)]
        at = rows.index(line)
        target = rows[max(0, min(len(rows) - 1, at + lines))]
        if target == line:
            return
        names = self.layout_.lines[target]
        assert not isinstance(names, int)
        self._move(min(names, key=lambda n: abs(self.layout_.where[n][1] - col)))  # type: ignore[union-attr]

    def action_cursor_up(self) -> None:
        self._vertical(-1)

    def action_cursor_down(self) -> None:
        self._vertical(1)

    def action_cursor_left(self) -> None:
        self._step(-1)

    def action_cursor_right(self) -> None:
        self._step(1)

    def action_cursor_first(self) -> None:
        if self._order:
            self._move(self._order[0])

    def action_cursor_last(self) -> None:
        if self._order:
            self._move(self._order[-1])

    def action_page(self, direction: int) -> None:
        self._vertical(direction * max(1, self.size.height - 1))

    def action_open(self) -> None:
        if self.cursor is not None:
            self.post_message(self.Selected(self.cursor))

    def node_at(self, x: int, y: int) -> str | None:
        """The node drawn at a point of the widget's content (x, y on screen), if any."""
        if self.layout_ is None:
            return None
        index = round(self.scroll_y) + y
        if not 0 <= index < len(self.layout_.lines) or isinstance(self.layout_.lines[index], int):
            return None
        for name in self.layout_.lines[index]:  # type: ignore[union-attr]
            col = self.layout_.where[name][1]
            group_gpus = len(self.cells.get(name, ())) or 1
            if col <= x < col + self.layout_.span(group_gpus) - 1:
                return str(name)
        return None

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        node = self.node_at(offset.x, offset.y)
        if node is not None:
            self._move(node)
            if event.chain >= 2:
                self.post_message(self.Selected(node))


class MapView(View):
    """The cluster as a picture: a title with the GPUs by kind, the legend, the map, the node under the cursor."""

    title = "Map"
    sources = ("nodes", "jobs", "reservations", "fabric")
    kind = "node"

    DEFAULT_CSS = """
    MapView > .map-legend { height: auto; padding: 0 1; color: $text-muted; }
    MapView > .map-status { height: 1; padding: 0 1; background: $boost; }
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.table = ClusterMap(id=f"{id}-map")  # type: ignore[assignment]
        self._views: dict[str, dict[str, Any]] = {}
        self._jobs: Mapping[int, Mapping[str, Any]] = {}
        self._reserved: dict[str, str] = {}
        self._tally: Counter[str] = Counter()
        self._make_up: tuple[Any, ...] = ()
        self._legend_palette: tuple[str, ...] = ()  # the colours the legend was drawn in
        self._groups: list[M.Group] = []
        self._cells = MapCells()
        self._preemptible: set[int] = set()
        self._jobs_seen = -1  # the feed's jobs read when the preemptible jobs were last looked at (-1: never)

    def _leaf_of(self, feed: Feed) -> dict[str, str]:
        """node -> its leaf switch, where the scheduler knows the fabric (declared in `topology:`, or found), else
        where the config declares it: the map groups by it."""
        if feed.fabric is not None:
            leaves = feed.fabric.get("leaves") or {}
        else:
            tree = getattr(getattr(getattr(self.app, "loaded", None), "cluster", None), "topology", None)
            leaves = {} if tree is None else tree.leaves()
        return {node: leaf for leaf, names in leaves.items() for node in names}

    @property
    def map(self) -> ClusterMap:
        assert isinstance(self.table, ClusterMap)
        return self.table

    def compose(self) -> ComposeResult:
        yield Static(self.title, classes="view-title")
        yield Static("", classes="map-legend")  # drawn at the first update, in the app's palette by then
        yield self.table
        yield Static("", classes="map-status")

    def update_view(self, feed: Feed, now: float) -> None:
        nodes = feed.node_views()
        self._views = {str(n["name"]): n for n in nodes}
        self._jobs = feed.jobs
        self._reserved = reserved = M.active_reservations(feed.reservations)
        make_up = (M.make_up(nodes), feed.fabric)
        if make_up != self._make_up:
            self._make_up, self._groups = make_up, M.groups(nodes, self._leaf_of(feed))
        groups = self._groups
        cells = self._cells.update(self._views, groups, self._preemptible_jobs(feed), reserved)
        headers = []
        tally: Counter[str] = Counter()
        for group in groups:
            counted = self._cells.tally(group)
            tally.update(counted)
            count = len(group.nodes)
            headers.append(f"{group.title}  {count} node{'s' * (count != 1)} · {M.summary(counted)}")
        self._tally = tally
        matches = None
        if self.pattern is not None:
            pattern = self.pattern
            matches = {name for name, n in self._views.items() if pattern.search(_node_text(n))}
        self.marked &= self._views.keys()
        self.map.show(groups, cells, headers, marked=self.marked, matches=matches, color=not self.app.no_color,
                      palette="dark" if self.app.current_theme.dark else "light")  # fmt: skip
        self._status(self.map.cursor)
        palette = tuple(R.style(role) for _, role, _ in M.KINDS.values())
        if palette != self._legend_palette:  # the first update, or the theme changed (dark, light)
            self._legend_palette = palette
            self.query_one(".map-legend", Static).update(_legend())
        shown = len(matches) if matches is not None else len(nodes)
        self._title(feed, now, shown, len(nodes))

    def _preemptible_jobs(self, feed: Feed) -> set[int]:
        """The ids of the preemptible jobs, looked at again only for the jobs the feed read anew."""
        changed = feed.jobs_changed_since(self._jobs_seen)
        if changed is None:
            self._preemptible = M.preemptible_jobs(feed.jobs)
        else:
            for job_id in changed:
                job = feed.jobs.get(job_id)
                if job is not None and job.get("preemptible"):
                    self._preemptible.add(job_id)
                else:
                    self._preemptible.discard(job_id)
        self._jobs_seen = feed.jobs_read
        return self._preemptible

    def summary(self, feed: Feed, now: float) -> Text:
        gpus = sum(self._tally.values())
        return Text(f"{len(self._views)} nodes · {gpus} GPUs: {M.summary(self._tally) or 'none'}")

    def restyle(self) -> None:
        self._legend_palette = ()  # drawn again at the next update

    def on_cluster_map_moved(self, message: ClusterMap.Moved) -> None:
        self._status(message.node)

    def _status(self, node: str | None) -> None:
        status = self.query_one(".map-status", Static)
        if node is None or node not in self._views:
            set_line(status, "no nodes" if not self._views else "")
            return
        set_line(status, M.node_line(self._views[node], self.map.cells.get(node, ()), self._jobs, self._reserved))


def _node_text(node: Mapping[str, Any]) -> str:
    """What `/` matches on the map: the name, pool, state, reasons and the jobs on the node."""
    jobs = " ".join(map(str, M.node_jobs(node)))
    return f"{node['name']} {node.get('pool') or ''} {node.get('state')} {' '.join(node.get('reasons') or ())} {jobs}"


def _legend() -> Text:
    parts: list[Any] = []
    for kind, (symbol, role, word) in M.KINDS.items():
        shown = M.BARS if kind == "busy" else symbol
        parts += [(shown, R.style(role)), f" {word}   "]
    return Text.assemble(*parts)
