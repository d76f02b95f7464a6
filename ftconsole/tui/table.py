"""A DataTable of keyed rows that is updated by diff, so the cursor and the scroll never jump.

`apply(rows, order)` takes every row that should be shown (by key) and their order. It removes, adds and
updates only what changed (`update_cell` per changed cell), reorders only when the order changed, and puts
the cursor back on the row it was on, at the same height on the screen. A column grows when a value needs
more room and never shrinks on its own (shrinking re-measures the whole column, which is slow on 10,000 rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.widgets import DataTable
from textual.widgets.data_table import CellKey, ColumnKey, RowKey

from ftconsole.tui.rows import Cell, Column, Row


def _same(a: Cell, b: Cell) -> bool:
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return type(a) is type(b) and a == b


def _literal(cell: Cell) -> Cell:
    """A cell shown as it is: DataTable reads a plain string as Rich markup, so a job message `[x]` would break
    it. Only strings with a `[` become Text: Text objects are what the garbage collector walks."""
    return Text(cell) if isinstance(cell, str) and "[" in cell else cell


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


class KeyedTable(DataTable[Cell]):
    DEFAULT_CSS = """
    KeyedTable { height: 1fr; }
    """

    def __init__(self, columns: Sequence[Column], *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.spec = tuple(columns)
        self._keys = [ColumnKey(c.key) for c in self.spec]
        self._shown: dict[str, Row] = {}
        self._order: list[str] = []
        self._row_keys: dict[str, RowKey] = {}  # one RowKey per row, reused: making and hashing them is not free

    def on_mount(self) -> None:
        for c in self.spec:  # once mounted: a label is measured with the app's console
            self.add_column(c.label, key=c.key, width=c.width)

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        """The row keys in display order."""
        return list(self._order)

    def selected_key(self) -> str | None:
        if self.row_count == 0:
            return None
        key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return None if key.value is None else str(key.value)

    def shown(self, key: str) -> Row | None:
        return self._shown.get(key)

    # -- writing -------------------------------------------------------------------------------------------

    def select_key(self, key: str) -> bool:
        if key not in self._shown:
            return False
        self.move_cursor(row=self.get_row_index(key), animate=False)
        return True

    def apply(self, rows: Mapping[str, Row], order: Sequence[str]) -> None:
        selected = self.selected_key()
        screen_offset = self.cursor_row - round(self.scroll_y) if selected is not None else 0
        removed = [k for k in self._shown if k not in rows]
        if removed:
            self._remove(removed)
        added = self._update(rows)
        if removed or added or list(order) != self._order:
            self._reorder(order)
        self._order = list(order)
        if selected is not None and selected in self._shown:
            index = self.get_row_index(selected)
            if index != self.cursor_row:
                self.move_cursor(row=index, animate=False)
                self.scroll_to(y=max(0, index - screen_offset), animate=False, immediate=True)

    def _update(self, rows: Mapping[str, Row]) -> int:
        added = 0
        for key, cells in rows.items():
            old = self._shown.get(key)
            if old is None:
                self.add_row(*map(_literal, cells), key=key)
                # Columns are sized here (_grow), so Textual need not measure every cell of every new row.
                self._new_rows.discard(RowKey(key))
                self._grow(cells)
                added += 1
            elif old is not cells:  # rows rebuilt from unchanged data are the same object (see views)
                for i, (a, b) in enumerate(zip(old, cells, strict=True)):
                    if not _same(a, b):
                        self.update_cell(key, self._keys[i], _literal(b), update_width=self._wider(i, b))
            self._shown[key] = cells
        return added

    def _remove(self, keys: Sequence[str]) -> None:
        # DataTable.remove_row renumbers every row after the one removed (12 ms a row at 10,000 rows); drop the
        # rows here and let _reorder number the rest once, as remove_row would (Textual is pinned).
        for key in keys:
            row_key = RowKey(key)
            for column_key in self._data[row_key]:
                self._updated_cells.discard(CellKey(row_key, column_key))
            del self.rows[row_key]
            del self._data[row_key]
            self._new_rows.discard(row_key)
            del self._shown[key]
            self._row_keys.pop(key, None)
        self._require_update_dimensions = True

    def _reorder(self, order: Sequence[str]) -> None:
        # DataTable.sort hands its key function cell values, never row keys, and costs a sort of all rows; the
        # order is known already, so set it the way sort() does (Textual is pinned; a test checks the order).
        row_keys = self._row_keys
        for key in order:
            if key not in row_keys:
                row_keys[key] = RowKey(key)
        self._row_locations = TwoWayDict({row_keys[key]: i for i, key in enumerate(order)})
        self.cursor_coordinate = self.cursor_coordinate  # clamped to the rows left
        self._update_count += 1
        self.refresh(layout=True)

    def _grow(self, cells: Row) -> None:
        for i, c in enumerate(cells):
            self._set_width(i, _width(c))

    def _wider(self, index: int, cell: Cell) -> bool:
        column = self.columns[self._keys[index]]
        return column.auto_width and _width(cell) > column.content_width

    def _set_width(self, index: int, width: int) -> None:
        column = self.columns[self._keys[index]]
        if column.auto_width and width > column.content_width:
            column.content_width = width
            self._require_update_dimensions = True

    def to_rows(self) -> dict[str, Any]:  # for tests: what the table holds now, in order, as plain text
        return {k: tuple(c.plain if isinstance(c, Text) else c for c in self._shown[k]) for k in self._order}
