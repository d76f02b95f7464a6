"""The diffing table: only what changed is touched; the cursor stays on its row and at its height."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult

from ftconsole.tui.rows import Column
from ftconsole.tui.table import KeyedTable

COLUMNS = (Column("id", "ID"), Column("state", "STATE", 8), Column("note", "NOTE"))


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield KeyedTable(COLUMNS, id="t")


def rows(n: int, state: str = "ok") -> dict[str, tuple[str | Text, ...]]:
    return {f"r{i:05}": (f"r{i:05}", Text(state, style="green"), "") for i in range(n)}


async def test_apply_adds_updates_reorders_and_keeps_the_cursor() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 20)) as pilot:
        table = app.query_one(KeyedTable)
        data = rows(100)
        order = sorted(data)
        table.apply(data, order)
        await pilot.pause()
        assert table.row_count == 100 and table.keys == order
        table.move_cursor(row=50)
        table.scroll_to(y=45, animate=False, immediate=True)
        await pilot.pause()
        assert table.selected_key() == "r00050"
        offset = table.cursor_row - round(table.scroll_y)

        # one cell changes: one update, no rebuild (the untouched rows keep their very objects)
        untouched = table.get_row("r00001")
        data = dict(data)
        data["r00050"] = ("r00050", Text("bad", style="red"), "disk full")
        table.apply(data, order)
        await pilot.pause()
        assert table.to_rows()["r00050"] == ("r00050", "bad", "disk full")
        assert table.get_row("r00001")[1] is untouched[1]

        # a style alone changes: that counts as a change too
        data["r00051"] = ("r00051", Text("ok", style="bold red"), "")
        table.apply(data, order)
        assert table.get_row("r00051")[1].style == "bold red"

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


async def test_many_removals_keep_order_and_selection() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 20)) as pilot:
        table = app.query_one(KeyedTable)
        data = rows(500)
        table.apply(data, sorted(data))
        table.move_cursor(row=table.get_row_index("r00499"))
        kept = {k: v for k, v in data.items() if k >= "r00300" or k.endswith("7")}  # 270 removals at once
        table.apply(kept, sorted(kept))
        await pilot.pause()
        assert table.row_count == len(kept) and table.selected_key() == "r00499"
        assert table.keys == sorted(kept)
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == sorted(kept)


async def test_text_that_looks_like_markup_is_shown_as_it_is() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        table = app.query_one(KeyedTable)
        table.apply({"a": ("a", "[red]x[/]", "cannot open [/data/x]")}, ["a"])
        await pilot.pause()
        table.apply({"a": ("a", "[b]y", "[/]")}, ["a"])  # updated cells too
        await pilot.pause()
        assert [str(c) for c in table.get_row("a")] == ["a", "[b]y", "[/]"]
        assert all(isinstance(c, Text) for c in table.get_row("a")[1:])  # not left to be read as markup


async def test_columns_grow_for_longer_values_and_fixed_ones_stay() -> None:
    app = TableApp()
    async with app.run_test(size=(100, 10)) as pilot:
        table = app.query_one(KeyedTable)
        table.apply({"a": ("a", "ok", "short")}, ["a"])
        await pilot.pause()
        table.apply({"a": ("a", "a much longer state", "a much longer note")}, ["a"])
        await pilot.pause()
        widths = {str(k.value): c.get_render_width(table) for k, c in table.columns.items()}
        assert widths["state"] == 8 + 2  # fixed: 8 plus cell padding
        assert widths["note"] >= len("a much longer note")
