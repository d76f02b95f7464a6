"""A table of keyed rows drawn through Textual's line API: `KeyedTable`'s interface, for the views with many rows.

`apply(rows, order)` takes every row that should be shown (by key) and their order, as `KeyedTable.apply` does;
the cursor stays on its row, at the same height on the screen. Unlike a DataTable, which renders every visible
cell again after any change (and works out the height of all 10,000 rows), a line is drawn only when it comes
into view or its row, the cursor or a column's width changed: its cells are turned into segments directly, each
cut or padded to its column. A column grows when a value needs more room and never shrinks on its own.
The header stays at the top; `left`/`right` scroll sideways when the columns are wider than the view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ftconsole.tui.rows import Cell, Column, Lazy, Row

_NEVER = object()  # a line not drawn yet
GAP = 2  # columns between two columns (a DataTable's cell padding, one each side)


class RowKey:
    """What `RowSelected.row_key` holds, as a DataTable's: the row's key in `value`."""

    def __init__(self, value: str) -> None:
        self.value = value


class LineView(ScrollView):
    """A widget drawn a line at a time, which reads its styles once a frame: `rich_style` walks the widget's
    ancestors (about 0.1 ms), and a frame draws each of its 45 lines."""

    _frame_styles: tuple[Style, ...] | None = None

    def line_styles(self) -> tuple[Style, ...]:
        """What `frame_styles` holds for the frame being drawn: the widget's own style first."""
        return (self.rich_style,)

    def frame_styles(self) -> tuple[Style, ...]:
        if self._frame_styles is None:
            self._frame_styles = self.line_styles()
        return self._frame_styles

    def render_lines(self, crop: Region) -> list[Strip]:
        self._frame_styles = None  # a new frame: the theme or the focus may have changed since the last
        return super().render_lines(crop)

    def set_virtual_size(self, size: Size) -> None:
        """The scrollable size. Setting `virtual_size` lays the whole screen out again, which draws every widget
        (a frame of 10 to 15 ms at 200x50, 40 ms and more in the Jobs view): needed where a scrollbar may come or
        go, not where a long list only grew or shrank by a few rows (a second's jobs submitted or deleted), or a
        column grew, under scrollbars that stay as they are. There, only the scrollbars are brought up to date
        (textual is pinned: `_scroll_update` is its own way to)."""
        if size == self.virtual_size:
            return
        if not self._bars_stay(size):
            self.virtual_size = size
            return
        self.set_reactive(LineView.virtual_size, size)
        self._scroll_update(size)

    def _bars_stay(self, size: Size) -> bool:
        """Whether each scrollbar surely stays shown, or hidden, at the virtual size `size` (a scrollbar shown
        takes room from the other: one hidden stays so only with that room to spare)."""
        width, height = self.container_size
        styles = self.styles
        if not width or not height:
            return False
        across = _bar_stays(styles.overflow_x, self.show_horizontal_scrollbar, size.width, width,
                            styles.scrollbar_size_vertical)  # fmt: skip
        down = _bar_stays(styles.overflow_y, self.show_vertical_scrollbar, size.height, height,
                          styles.scrollbar_size_horizontal)  # fmt: skip
        return across and down


def _bar_stays(overflow: str, shown: bool, needed: int, room: int, other_bar: int) -> bool:
    if overflow != "auto":  # hidden or scroll: the size does not change it
        return True
    return needed > room if shown else needed <= room - other_bar


class LineTable(LineView, can_focus=True):
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "line-table--header", "line-table--cursor", "line-table--even-row",
    }  # fmt: skip
    DEFAULT_CSS = """
    LineTable {
        height: 1fr;
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .line-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .line-table--header { background-tint: $foreground 5%; }
        }
        &:dark > .line-table--even-row { background: $surface-darken-1 40%; }
        & > .line-table--header { text-style: bold; background: $panel; color: $foreground; }
        &:ansi > .line-table--header { background: ansi_bright_blue; color: ansi_default; }
        & > .line-table--even-row { background: $surface-lighten-1 50%; }
        & > .line-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False),
        Binding("up", "cursor_up", "Cursor up", show=False),
        Binding("down", "cursor_down", "Cursor down", show=False),
        Binding("left", "scroll_left", "Scroll left", show=False),
        Binding("right", "scroll_right", "Scroll right", show=False),
        Binding("home", "cursor_first", "First", show=False),
        Binding("end", "cursor_last", "Last", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
    ]

    class RowSelected(Message):
        """`enter` (or a click on the row under the cursor) on a row."""

        def __init__(self, table: LineTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.row_key = RowKey(key)

        @property
        def control(self) -> LineTable:
            return self.table

    class Scrolled(Message):
        """Other rows came on screen (a scroll): a view that keeps only the rows on screen up to date with the
        clock looks at them (`JobsView`)."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled())

    def __init__(self, columns: Sequence[Column], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.spec = tuple(columns)
        self.columns: dict[Any, Any] = {}  # a DataTable's, which the views read to set least widths: none here
        self.widths = [c.width if c.width is not None else max(cell_len(c.label), c.min_width) for c in self.spec]
        self._auto = [i for i, c in enumerate(self.spec) if c.width is None]
        self._shown: dict[str, Row | Lazy] = {}
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self.cursor_row = 0
        self._strips: dict[int, tuple[Any, Strip]] = {}  # line -> (what it was drawn of, the strip)
        self._drawn: dict[int, tuple[str, Row | Lazy, bool] | None] = {}  # line -> its key, row and cursor, drawn
        self._styles: tuple[Any, ...] = ()
        self._header: tuple[Any, Strip] | None = None

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    @property
    def row_count(self) -> int:
        return len(self._order)

    def selected_key(self) -> str | None:
        return self._order[self.cursor_row] if self._order else None

    def shown(self, key: str) -> Row | None:
        row = self._shown.get(key)
        return None if row is None else self._cells(row)

    def visible_keys(self) -> list[str]:
        """The keys of the rows on screen now (under the header)."""
        top = round(self.scroll_y)
        return self._order[top : top + max(0, self.size.height - 1)]

    def get_row_index(self, key: str) -> int:
        return self._index[key]

    def to_rows(self) -> dict[str, Any]:  # for tests: what the table holds now, in order, as plain text
        return {k: tuple(map(_plain, self._cells(self._shown[k]))) for k in self._order}

    # -- writing -------------------------------------------------------------------------------------------

    def select_key(self, key: str) -> bool:
        if key not in self._index:
            return False
        self._move(self._index[key])
        return True

    def apply(self, rows: Mapping[str, Row | Lazy], order: Sequence[str]) -> None:
        selected = self.selected_key()
        screen_offset = self.cursor_row - round(self.scroll_y)
        grew = False
        for key, cells in rows.items():
            old = self._shown.get(key)
            if old is not cells and not isinstance(cells, Lazy):  # unchanged data: the same object (see views)
                grew |= self._grow(cells)
        self._shown = dict(rows)
        if list(order) != self._order:
            self._order = list(order)
            self._index = {key: i for i, key in enumerate(self._order)}
        if grew:
            self._strips.clear()
            self._header = None
        self.set_virtual_size(Size(self._total_width(), len(self._order) + 1))
        scrolled = False
        if selected is not None and selected in self._index:
            self.cursor_row = self._index[selected]
            if round(self.scroll_y) != max(0, self.cursor_row - screen_offset):
                self.scroll_to(y=max(0, self.cursor_row - screen_offset), animate=False, immediate=True)
                scrolled = True
        else:
            self.cursor_row = max(0, min(self.cursor_row, len(self._order) - 1))
        if grew or scrolled:
            self.refresh()
        else:
            self._refresh_changed()

    def _refresh_changed(self) -> None:
        """Draw again the lines on screen whose row, place or cursor changed since they were drawn: a frame
        costs what changed, not the whole table (the compositor's work is about 0.2 ms a line)."""
        top, height = round(self.scroll_y), max(0, self.size.height - 1)
        order, shown, drawn = self._order, self._shown, self._drawn
        if len(drawn) > 4 * height + 64:  # the lines drawn once and scrolled away: their rows let go
            self._drawn = drawn = {i: d for i, d in drawn.items() if top <= i < top + height}
        for index in range(top, top + height):
            key = order[index] if index < len(order) else None
            now = None if key is None else (key, shown[key], index == self.cursor_row)
            if drawn.get(index, _NEVER) != now:
                self.refresh_line(index + 1)  # the header is line 0

    def replace(self, key: str, row: Row | Lazy) -> None:
        """One row's new cells, in its place (the order stays): its line is drawn again."""
        if key not in self._index:
            return
        self._shown[key] = row
        if not isinstance(row, Lazy) and self._grow(row):
            self._strips.clear()
            self._header = None
            self.set_virtual_size(Size(self._total_width(), len(self._order) + 1))
            self.refresh()
            return
        self.refresh_line(self._index[key] + 1)  # the header is line 0

    def _cells(self, row: Row | Lazy) -> Row:
        """A row's cells; a lazy row's built now, and its columns grown for them (drawn again where they grew)."""
        if not isinstance(row, Lazy):
            return row
        made = row.cells()
        if self._grow(made):
            self._strips.clear()
            self._header = None
            self.set_virtual_size(Size(self._total_width(), len(self._order) + 1))
            self.refresh()
        return made

    def _grow(self, cells: Row) -> bool:
        grew = False
        widths = self.widths
        for i in self._auto:  # the columns sized to their content
            cell = cells[i]
            width = (len(cell) if cell.isascii() else cell_len(cell)) if isinstance(cell, str) else cell.cell_len
            if width > widths[i]:
                widths[i] = width
                grew = True
        return grew

    def _total_width(self) -> int:
        return sum(self.widths) + GAP * len(self.widths)

    # -- drawing -------------------------------------------------------------------------------------------

    def line_styles(self) -> tuple[Style, ...]:
        return (
            self.rich_style,
            self.get_component_rich_style("line-table--header"),
            self.get_component_rich_style("line-table--cursor"),
            self.get_component_rich_style("line-table--even-row"),
        )

    def render_line(self, y: int) -> Strip:
        styles = self.frame_styles()
        if styles != self._styles:  # the theme or the focus changed
            self._styles = styles
            self._strips.clear()
            self._header = None
        base, header, cursor, even = styles
        width = self.size.width
        scroll_x = round(self.scroll_x)
        if y == 0:
            if self._header is None or self._header[0] != (scroll_x, width):
                labels = self._line(tuple(Text(c.label) for c in self.spec), base + header)
                self._header = ((scroll_x, width), labels.crop_extend(scroll_x, scroll_x + width, base + header))
            return self._header[1]
        index = round(self.scroll_y) + y - 1
        if index >= len(self._order):
            self._drawn[index] = None
            return Strip.blank(width, base)
        key = self._order[index]
        row = self._shown[key]
        cells = self._cells(row)
        selected = index == self.cursor_row
        self._drawn[index] = (key, row, selected)
        style = base + cursor if selected else base + even if index % 2 else base
        what = (cells, selected, index % 2, scroll_x, width)
        kept = self._strips.get(index)
        if kept is not None and kept[0] == what:
            return kept[1]
        strip = self._line(cells, style).crop_extend(scroll_x, scroll_x + width, style)
        self._strips[index] = (what, strip)
        return strip

    def _line(self, cells: Row, style: Style) -> Strip:
        segments: list[Segment] = []
        pad = Segment(" ", style)
        for cell, width in zip(cells, self.widths, strict=True):
            segments.append(pad)
            if isinstance(cell, Text):
                text = cell.copy()
                text.truncate(width, overflow="ellipsis", pad=True)
                segments += [
                    Segment(s.text, style + s.style if s.style else style) for s in text.render(self.app.console)
                ]
            else:
                size = cell_len(cell)
                shown = cell if size == width else set_cell_size(cell, width) if size < width else ""
                if size > width:  # cut, as a Text is: the last column shows that there is more
                    shown = set_cell_size(cell, width - 1) + "…" if width > 0 else ""
                segments.append(Segment(shown, style))
            segments.append(pad)
        return Strip(segments)

    # -- the cursor ----------------------------------------------------------------------------------------

    def _move(self, row: int) -> None:
        if not self._order:
            return
        row = max(0, min(len(self._order) - 1, row))
        if row != self.cursor_row:
            was, self.cursor_row = self.cursor_row, row
            self.refresh_line(was + 1)  # the lines it leaves and comes to (the header is line 0)
            self.refresh_line(row + 1)
        top = round(self.scroll_y)
        rows = max(1, self.size.height - 1)  # under the header
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + rows:
            self.scroll_to(y=row - rows + 1, animate=False, immediate=True)

    def move_cursor(self, *, row: int, animate: bool = False) -> None:
        self._move(row)

    def action_cursor_up(self) -> None:
        self._move(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._move(self.cursor_row + 1)

    def action_cursor_first(self) -> None:
        self._move(0)

    def action_cursor_last(self) -> None:
        self._move(len(self._order) - 1)

    def action_page(self, direction: int) -> None:
        self._move(self.cursor_row + direction * max(1, self.size.height - 2))

    def action_select_cursor(self) -> None:
        key = self.selected_key()
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        row = round(self.scroll_y) + offset.y - 1
        if 0 <= row < len(self._order):
            again = row == self.cursor_row
            self._move(row)
            if again or event.chain >= 2:
                self.action_select_cursor()


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell
