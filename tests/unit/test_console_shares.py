"""The Shares view (key 8): each project's and user's due share against its use, its fair-share factor, its
GPU-hours and goodput over the last day and week, its quota; with fair share off, the sums alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.shares import BAR, share_rows, used_bar
from tests.console_data import NOW, SHARES, FixedClient, fixed_config


def test_the_bar_marks_just_its_share_in_the_middle() -> None:
    assert used_bar(0.25, 0.25).plain == "█" * (BAR // 2) + "│" + "·" * (BAR // 2 - 1) + " 1.0x"  # up to the mark
    assert used_bar(0.0, 0.25).plain == "·" * (BAR // 2) + "│" + "·" * (BAR // 2 - 1) + " 0.0x"
    assert used_bar(0.9, 0.25).plain == "█" * (BAR - 1) + "▸ 3.6x"  # past twice its share
    assert used_bar(None, 0.25).plain == "" and used_bar(0.1, 0.0).plain == ""


def test_rows_per_project_then_user_most_used_first() -> None:
    rows, order = share_rows(SHARES)
    assert order == ["title:project", "project:llm", "project:vision", "title:user", "user:ana", "user:bo", "user:cy"]
    llm = [str(c) for c in rows["project:llm"]]
    assert llm[:3] == ["  llm", "75.0%", "82.0%"] and llm[4] == "0.470"  # 2^-1.09: the project's own factor
    assert llm[5:8] == ["380.0", "2410.0", "96.0%"]
    ana = [str(c) for c in rows["user:ana"]]
    assert ana[4] == "0.220 (llm)" and ana[3].endswith("▸ 2.2x")  # the lowest of the user's accounts, and where
    assert str(rows["project:vision"][8]) == "gpus 2/16 · gpu hours 530.0/600"


def test_with_fair_share_off_the_sums_alone() -> None:
    off = {**SHARES, "fairshare": None}
    rows, order = share_rows(off)
    assert order == ["title:project", "project:llm", "project:vision", "title:user", "user:ana", "user:bo"]
    assert [str(c) for c in rows["user:ana"]][1:5] == ["-", "-", "", "-"] and str(rows["user:ana"][6]) == "2410.0"
    assert share_rows(None) == ({}, [])


async def test_the_view_in_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    console = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(160, 20)) as pilot:
        await pilot.press("8")
        await console.refresh_data()
        await pilot.pause()
        assert console.view.table.keys[:2] == ["title:project", "project:llm"]
        title = str(console.query_one("#shares .view-title").render())
        assert "fair share per project, then user, usage halved every 7.0d" in title
        await pilot.press("slash", *"vision", "enter")
        await pilot.pause()
        assert console.view.table.keys == ["project:vision", "user:bo"]  # bo's best factor is in vision
