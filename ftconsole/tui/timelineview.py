"""The Timeline view: the queue over the hours to come (`timeline.py` says what each row shows), by pool.

`TimelineChart` draws through Textual's line API, a line built again only when its row, the window of time, the
cursor or the marks changed; the window moves a column at a time, so a second's update redraws nothing until a
column's time has passed. The cursor is on a job's row: `enter` opens the job, and the job actions (`x`, `+`,
`e`...) act on it or on the marked rows. `left`/`right` move the window over time, `[`/`]` zoom out and in,
`=` fits it to what is foreseen again. The line under the chart says what the row under the cursor is expected
to do.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Static

from ftconsole.tui import rows as R
from ftconsole.tui import timeline as T
from ftconsole.tui.feed import Feed
from ftconsole.tui.linetable import LineView
from ftconsole.tui.views import View, set_line


class TimelineChart(LineView, can_focus=True):
    """The rows and their bars; `show` hands it the groups, and it keeps the cursor on the same row."""

    DEFAULT_CSS = """
    TimelineChart { height: 1fr; padding: 0 1; overflow-x: hidden; }  /* as wide as the view: zoom, no scroll */
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("home", "cursor_first", "First", show=False),
        Binding("end", "cursor_last", "Last", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("enter", "open", "Open", show=False),
        Binding("left", "pan(-1)", "Earlier", show=False),
        Binding("right", "pan(1)", "Later", show=False),
        Binding("left_square_bracket", "zoom(1)", "Zoom out"),
        Binding("right_square_bracket", "zoom(-1)", "Zoom in"),
        Binding("equals_sign", "fit", "Fit", show=False),
    ]

    class Moved(Message):
        """The cursor is on another row (or on none), or the window of time changed."""

        def __init__(self, key: str | None) -> None:
            super().__init__()
            self.key = key

    class Selected(Message):
        """`enter` on a job's row."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.groups: list[T.Group] = []
        self.now = 0.0
        self.marked: Collection[str] = ()
        self.matches: Collection[str] | None = None
        self.cursor: str | None = None
        self.step: float | None = None  # seconds per column; None: fitted to what is foreseen
        self.pan = 0  # columns the window is moved from its start (a column before now)
        self.window = T.Window(0.0, 60.0, 1)
        self.lines: list[T.Row | str] = []  # a group's title, or a row
        self._order: list[str] = []  # the rows' keys, in reading order
        self._where: dict[str, int] = {}
        self._strips: dict[int, tuple[Any, Strip]] = {}
        self._styles: dict[str, Style] = {}
        self._base = Style()

    # -- the interface views share with KeyedTable ---------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    def selected_key(self) -> str | None:
        return self.cursor

    def select_key(self, key: str) -> bool:
        if key not in self._where:
            return False
        self._move(key)
        return True

    # -- data ----------------------------------------------------------------------------------------------

    def show(
        self,
        groups: Sequence[T.Group],
        now: float,
        *,
        marked: Collection[str] = (),
        matches: Collection[str] | None = None,
        palette: str = "dark",
    ) -> None:
        if palette != getattr(self, "_palette", None):
            self._palette = palette
            self._strips.clear()
            self._styles.clear()
        self.groups, self.now, self.marked, self.matches = list(groups), now, marked, matches
        lines: list[T.Row | str] = []
        for group in self.groups:
            shown = [r for r in group.rows if matches is None or isinstance(r, T.Band) or r.key in matches]
            if shown or group.note:
                lines += [group.title, *shown, *(["  " + group.note] if group.note else [])]
        self.lines = lines
        self._where = {line.key: i for i, line in enumerate(lines) if isinstance(line, T.Bar)}
        self._order = list(self._where)
        self._window()
        self.set_virtual_size(Size(self.size.width or 80, len(lines)))
        if self.cursor not in self._where:
            self._move(self._order[0] if self._order else None, scroll=False)
        self.refresh()

    def _window(self) -> None:
        width = max(1, (self.size.width or 80) - T.LABEL_COLUMNS - 1)
        rows = [line for line in self.lines if not isinstance(line, str)]
        step = self.step or T.fit(rows, self.now, width - 2)
        left = (math.floor(self.now / step) - 1 + self.pan) * step  # whole columns: still until one has passed
        window = T.Window(left, step, width)
        if window != self.window:
            self.window = window
            self.post_message(self.Moved(self.cursor))

    def on_resize(self) -> None:
        if self.groups:
            self.show(self.groups, self.now, marked=self.marked, matches=self.matches, palette=self._palette)

    # -- drawing -------------------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        index = round(self.scroll_y) + y
        width = self.size.width
        base = self.frame_styles()[0]
        if base != self._base:
            self._base = base
            self._strips.clear()
            self._styles.clear()
        if index >= len(self.lines):
            return Strip.blank(width, base)
        line = self.lines[index]
        key = line.key if isinstance(line, T.Bar) else None
        what = (line, self.window, math.floor(self.window.column(self.now)), key == self.cursor, key in self.marked)
        kept = self._strips.get(index)
        if kept is not None and kept[0] == what:
            return kept[1]
        if isinstance(line, str):
            title, _, rest = line.partition("  ")
            text = Text.assemble((title, "bold"), "  ", (rest, "dim"), style=base)
            text.truncate(width)
            strip = Strip(text.render(self.app.console), text.cell_len).extend_cell_length(width, base)
        else:
            strip = self._row(line, what[3], what[4], width)
        self._strips[index] = (what, strip)
        return strip

    def _row(self, row: T.Row, cursor: bool, marked: bool, width: int) -> Strip:
        label = row.label[: T.LABEL_COLUMNS].ljust(T.LABEL_COLUMNS)
        label_style = self._style("strong" if isinstance(row, T.Bar) else "muted")
        if cursor:
            label_style += Style(reverse=True)
        if marked:
            label_style += Style(underline=True)
        segments = [Segment(label, label_style), Segment(" ", self._base)]
        segments += [Segment(text, self._style(role)) for text, role in T.cells(row, self.window, self.now)]
        return Strip(segments).crop_extend(0, width, self._base)

    def _style(self, role: str) -> Style:
        style = self._styles.get(role)
        if style is None:
            style = self._styles[role] = self._base + Style.parse(R.style(role) or "none")
        return style

    # -- the cursor and the window -------------------------------------------------------------------------

    def _move(self, key: str | None, scroll: bool = True) -> None:
        if key != self.cursor:
            self.cursor = key
            self.refresh()
        if key is not None and scroll:
            line = self._where[key]
            top = round(self.scroll_y)
            if line - 1 < top:  # its group's title too, where it is just above
                self.scroll_to(y=max(0, line - 1), animate=False, immediate=True)
            elif line >= top + self.size.height:
                self.scroll_to(y=line - self.size.height + 1, animate=False, immediate=True)
        self.post_message(self.Moved(key))

    def _step(self, delta: int) -> None:
        if self._order:
            at = self._order.index(self.cursor) if self.cursor in self._order else 0
            self._move(self._order[max(0, min(len(self._order) - 1, at + delta))])

    def action_cursor_up(self) -> None:
        self._step(-1)

    def action_cursor_down(self) -> None:
        self._step(1)

    def action_cursor_first(self) -> None:
        if self._order:
            self._move(self._order[0])

    def action_cursor_last(self) -> None:
        if self._order:
            self._move(self._order[-1])
        self.scroll_end(animate=False, immediate=True)  # the lines after the last row too

    def action_page(self, direction: int) -> None:
        self._step(direction * max(1, self.size.height - 1))

    def action_open(self) -> None:
        if self.cursor is not None:
            self.post_message(self.Selected(self.cursor))

    def action_pan(self, direction: int) -> None:
        """A quarter of the chart's width earlier or later; never before the column before now."""
        self.pan = max(0, self.pan + direction * max(1, self.window.width // 4))
        self._redraw()

    def action_zoom(self, direction: int) -> None:
        """The next coarser (1) or finer (-1) time per column."""
        current = self.step or self.window.step
        at = min(range(len(T.STEPS)), key=lambda i: abs(T.STEPS[i] - current))
        self.step = float(T.STEPS[max(0, min(len(T.STEPS) - 1, at + direction))])
        self.pan = 0
        self._redraw()

    def action_fit(self) -> None:
        self.step, self.pan = None, 0
        self._redraw()

    def _redraw(self) -> None:
        self._window()
        self.refresh()


class TimelineView(View):
    """The queue over time: a title with the counts, the legend, the times, the chart, the row under the cursor."""

    title = "Timeline"
    sources = ("jobs", "forecast", "reservations")
    kind = "job"

    DEFAULT_CSS = """
    TimelineView > .timeline-legend { height: auto; padding: 0 1; color: $text-muted; }
    TimelineView > .timeline-axis { height: 1; padding: 0 1; }
    TimelineView > .timeline-status { height: 1; padding: 0 1; background: $boost; }
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.table = TimelineChart(id=f"{id}-chart")  # type: ignore[assignment]
        self.rows = T.Rows()
        self._jobs_seen = -1  # the feed's jobs read at the last update (-1: none yet: look at every job)
        self._notes: dict[str, str] = {}
        self._counts = (0, 0, 0)
        self._legend_palette: tuple[str, ...] = ()
        self._shown: tuple[Feed, float, int, int] | None = None  # what the title was last made of

    @property
    def chart(self) -> TimelineChart:
        assert isinstance(self.table, TimelineChart)
        return self.table

    def compose(self) -> ComposeResult:
        yield Static(self.title, classes="view-title")
        yield Static("", classes="timeline-legend")
        yield Static("", classes="timeline-axis")
        yield self.table
        yield Static("", classes="timeline-status")

    def update_view(self, feed: Feed, now: float) -> None:
        changed = feed.jobs_changed_since(self._jobs_seen)
        self._jobs_seen = feed.jobs_read
        groups = self.rows.groups(feed.jobs, feed.forecast, feed.reservations, now, changed)
        bars = [r for g in groups for r in g.rows if isinstance(r, T.Bar)]
        self._notes = {r.key: r.note for r in bars}
        self._counts = (
            sum(1 for r in bars if r.kind == "running"),
            sum(1 for r in bars if r.kind == "expected"),
            sum(1 for r in bars if r.kind == "none"),
        )
        matches = None
        if self.pattern is not None:
            pattern = self.pattern
            matches = {r.key for r in bars if pattern.search(f"{r.label} {r.note}")}
        self.marked &= self._notes.keys()
        palette = "dark" if self.app.current_theme.dark else "light"
        self.chart.show(groups, now, marked=self.marked, matches=matches, palette=palette)
        self._axis()
        self._status(self.chart.cursor)
        roles = tuple(R.style(role) for _, role, _ in T.SYMBOLS.values())
        if roles != self._legend_palette:  # the first update, or the theme changed
            self._legend_palette = roles
            legend = Text.assemble(*((text, R.style(role)) for text, role in T.legend()))
            self.query_one(".timeline-legend", Static).update(legend)
        self._shown = (feed, now, len(matches) if matches is not None else len(bars), len(bars))
        self._title(*self._shown)

    def summary(self, feed: Feed, now: float) -> Text:
        running, expected, unknown = self._counts
        text = f"{running} running · {expected} expected · {unknown} with no expected start"
        window = self.chart.window
        text += f" · {T.step_words(window.step)} a column"
        if feed.forecast is not None and not feed.forecast.get("complete", True):
            text += " · worked out to " + T.clock(float(feed.forecast["until"]), now)
        return Text(text)

    def restyle(self) -> None:
        self._legend_palette = ()

    def on_timeline_chart_moved(self, message: TimelineChart.Moved) -> None:
        self._axis()
        if self._shown is not None:  # the window's time a column is in the title
            self._title(*self._shown)
        self._status(self.chart.cursor)  # not the message's: a later move may have been made since it was sent

    def _axis(self) -> None:
        axis = T.axis(self.chart.window, self.chart.now)
        set_line(self.query_one(".timeline-axis", Static), Text(" " * (T.LABEL_COLUMNS + 1) + axis, style="dim"))

    def _status(self, key: str | None) -> None:
        status = self.query_one(".timeline-status", Static)
        set_line(status, self._notes.get(key, "") if key is not None else "nothing running or queued")
