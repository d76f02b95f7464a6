"""The views' table (LineTable): rows applied by key; the cursor stays on its row and at its height; a line is
drawn again only when its row, the cursor or a column's width changed; text is shown as it is."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult

from ftconsole.tui.linetable import LineTable
from ftconsole.tui.rows import Column, Lazy

COLUMNS = (Column("id", "ID"), Column("state", "STATE", 8), Column("note", "NOTE"))


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.chosen: list[str] = []

    def compose(self) -> ComposeResult:
        yield LineTable(COLUMNS, id="t")

    def on_line_table_row_selected(self, event: LineTable.RowSelected) -> None:
        self.chosen.append(event.row_key.value)


def rows(n: int, state: str = "ok") -> dict[str, tuple[str | Text, ...]]:
    return {f"r{i:05}": (f"r{i:05}", Text(state, style="green"), "") for i in range(n)}


def line(table: LineTable, y: int) -> str:
    return "".join(s.text for s in table.render_line(y))


async def test_apply_updates_reorders_and_keeps_the_cursor() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 20)) as pilot:
        table = app.query_one(LineTable)
        data = rows(100)
        order = sorted(data)
        table.apply(data, order)
        await pilot.pause()
        assert table.row_count == 100 and table.keys == order
        assert line(table, 0).split() == ["ID", "STATE", "NOTE"]  # the header, fixed at the top
        table.move_cursor(row=50)
        await pilot.pause()
        table.scroll_to(y=45, animate=False, immediate=True)
        await pilot.pause()
        assert table.selected_key() == "r00050"
        offset = table.cursor_row - round(table.scroll_y)

        data = dict(data)
        data["r00050"] = ("r00050", Text("bad", style="red"), "disk full")
        table.apply(data, order)
        await pilot.pause()
        assert table.to_rows()["r00050"] == ("r00050", "bad", "disk full")
        assert "disk full" in line(table, 1 + 50 - round(table.scroll_y))

        # the row moves to the top: the cursor follows it and stays at the same height on screen
        order = ["r00050", *[k for k in order if k != "r00050"]]
        table.apply(data, order)
        await pilot.pause()
        assert table.keys == order and table.get_row_index("r00050") == 0
        assert table.selected_key() == "r00050"
        assert offset > 0 and table.scroll_y == 0  # as close to its old height as the top allows

        # rows above go away and new ones come: still on the same row
        table.move_cursor(row=table.get_row_index("r00080"))
        await pilot.pause()
        height = table.cursor_row - round(table.scroll_y)
        del data["r00001"], data["r00002"]
        data["r99999"] = ("r99999", Text("new"), "")
        order = [k for k in order if k in data] + ["r99999"]
        table.apply(data, order)
        await pilot.pause()
        assert table.selected_key() == "r00080"
        assert table.cursor_row - round(table.scroll_y) == height  # the row did not jump on the screen
        assert table.row_count == 99 and table.keys[-1] == "r99999"


async def test_a_line_is_drawn_again_only_when_its_row_changed() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 20)) as pilot:
        table = app.query_one(LineTable)
        data = rows(30)
        table.apply(data, sorted(data))
        await pilot.pause()
        first, fifth = table.render_line(2), table.render_line(6)
        data = {**data, "r00005": ("r00005", Text("bad", style="red"), "x")}  # the row on line 6
        table.apply(data, sorted(data))
        await pilot.pause()
        assert table.render_line(2) is first and table.render_line(6) is not fifth
        assert line(table, 6).split()[:3] == ["r00005", "bad", "x"]


async def test_keys_move_the_cursor_and_enter_selects() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 10)) as pilot:
        table = app.query_one(LineTable)
        data = rows(40)
        table.apply(data, sorted(data))
        table.focus()
        await pilot.pause()
        await pilot.press("down", "down", "end", "up")
        assert table.selected_key() == "r00038"
        assert round(table.scroll_y) > 0  # scrolled to keep it in view, under the header
        await pilot.press("home", "pagedown")
        assert table.selected_key() == f"r{table.size.height - 2:05}"
        await pilot.press("enter")
        await pilot.pause()
        assert app.chosen == [table.selected_key()]


async def test_text_that_looks_like_markup_is_shown_as_it_is() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        table = app.query_one(LineTable)
        table.apply({"a": ("a", "[b]x[/]", "cannot open [/data/x]")}, ["a"])
        await pilot.pause()
        assert line(table, 1).split() == ["a", "[b]x[/]", "cannot", "open", "[/data/x]"]


async def test_columns_grow_for_longer_values_and_fixed_ones_cut() -> None:
    app = TableApp()
    async with app.run_test(size=(100, 10)) as pilot:
        table = app.query_one(LineTable)
        table.apply({"a": ("a", "ok", "short")}, ["a"])
        await pilot.pause()
        table.apply({"a": ("a", "a much longer state", "a much longer note")}, ["a"])
        await pilot.pause()
        assert table.widths[1] == 8 and table.widths[2] == len("a much longer note")
        shown = line(table, 1)
        assert "a much …" in shown and "a much longer note" in shown  # the fixed column cut, with an ellipsis
        table.apply({"a": ("a", "ok", "x")}, ["a"])
        assert table.widths[2] == len("a much longer note")  # never shrinks on its own


async def test_lazy_rows_are_built_only_once_drawn_or_read() -> None:
    app = TableApp()
    built: list[int] = []

    def make(i: int) -> tuple[str, ...]:
        built.append(i)
        return (f"r{i:05}", "ok", "a longer note" if i == 990 else "")

    async with app.run_test(size=(60, 20)) as pilot:
        table = app.query_one(LineTable)
        rows = {f"r{i:05}": Lazy(make, i) for i in range(1000)}
        table.apply(rows, sorted(rows))
        await pilot.pause()
        assert sorted(built) == list(range(19))  # the rows on screen, under the header
        assert table.widths[2] == len("NOTE")
        table.move_cursor(row=990)
        await pilot.pause()
        assert 990 in built and table.widths[2] == len("a longer note")  # its column grew once it was drawn
        assert len(table.to_rows()) == 1000 and sorted(built) == list(range(1000))  # read: all built, once each


async def test_a_column_grows_without_laying_the_screen_out_where_the_scrollbars_stay() -> None:
    """A layout draws every widget: it is needed where a scrollbar comes or goes, not where the columns grew under
    scrollbars that stay as they are. Either way the lines show the new widths and a scroll reaches the end."""
    app = TableApp()
    async with app.run_test(size=(60, 10)) as pilot:
        table = app.query_one(LineTable)
        layouts: list[object] = []
        screen = app.screen
        refresh_layout = screen._refresh_layout

        def counted(*args: object, **kwargs: object) -> None:
            layouts.append(args)
            refresh_layout(*args, **kwargs)  # type: ignore[arg-type]

        screen._refresh_layout = counted  # type: ignore[method-assign]

        async def settled() -> None:
            """Frames until no layout came for three of them: a scrollbar that comes lays out over a few frames,
            more of them on a busy machine (bounded)."""
            quiet = 0
            for _ in range(100):
                count = len(layouts)
                await pilot.pause()
                quiet = quiet + 1 if len(layouts) == count else 0
                if quiet >= 3:
                    return

        data = rows(40)
        table.apply(data, sorted(data))
        await settled()
        assert table.show_vertical_scrollbar and not table.show_horizontal_scrollbar

        layouts.clear()  # a longer note, that still fits: no scrollbar comes
        table.apply({**data, "r00001": ("r00001", "ok", "x" * 20)}, sorted(data))
        await pilot.pause()
        assert not layouts and not table.show_horizontal_scrollbar
        assert table.widths[2] == 20 and line(table, 0).split() == ["ID", "STATE", "NOTE"]

        # wider than the view: the horizontal scrollbar comes, which lays the screen out
        table.apply({**data, "r00001": ("r00001", "ok", "y" * 80)}, sorted(data))
        await settled()
        assert layouts and table.show_horizontal_scrollbar

        layouts.clear()  # wider still, under the scrollbar that stays
        table.apply({**data, "r00001": ("r00001", "ok", "z" * 120 + "END")}, sorted(data))
        await pilot.pause()
        assert not layouts and table.show_horizontal_scrollbar and table.show_vertical_scrollbar
        assert table.virtual_size.width == table._total_width()
        table.scroll_to(x=table.max_scroll_x, animate=False, immediate=True)
        await pilot.pause()
        assert line(table, 2).rstrip().endswith("END")  # r00001, under the header and r00000
