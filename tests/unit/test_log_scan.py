"""The node side of log watching (supervisor `_scan`): only new complete lines, a bounded tail, and a pattern
that backtracks for ever is cut off by its CPU budget instead of stalling the node's status read."""

from __future__ import annotations

import time
from pathlib import Path

from ftconsole.scheduler.node import supervisor


def write(run_dir: Path, text: str) -> None:
    with open(run_dir / "output.log", "a") as fh:
        fh.write(text)


def test_a_scan_reads_only_the_complete_lines_written_since_the_last(tmp_path: Path) -> None:
    write(tmp_path, "Rank:0 Epoch:[1]\nRank:0 Epoch:[2]\nRank:0 Ep")
    ask = {"from": 0, "patterns": {"progress": r"Rank:(?P<rank>\d+) Epoch:\[(?P<epoch>\d+)\]"}}
    first = supervisor._scan(str(tmp_path), ask)
    assert [m["epoch"] for m in first["matches"]["progress"]] == ["1", "2"]
    assert first["to"] == len("Rank:0 Epoch:[1]\nRank:0 Epoch:[2]\n")  # the partial line waits
    write(tmp_path, "och:[3]\n")
    second = supervisor._scan(str(tmp_path), {**ask, "from": first["to"]})
    assert [(m["epoch"], m["line"]) for m in second["matches"]["progress"]] == [("3", "Rank:0 Epoch:[3]")]


def test_a_huge_log_is_scanned_from_its_end_and_a_replaced_one_from_its_start(tmp_path: Path) -> None:
    write(tmp_path, "Epoch:[0]\n" + "x" * (supervisor.SCAN_BYTES + 10) + "\nEpoch:[9]\n")
    found = supervisor._scan(str(tmp_path), {"from": 0, "patterns": {"p": r"Epoch:\[(?P<epoch>\d+)\]"}})
    assert [m["epoch"] for m in found["matches"]["p"]] == ["9"]
    (tmp_path / "output.log").write_text("Epoch:[1]\n")
    again = supervisor._scan(str(tmp_path), {"from": found["to"], "patterns": {"p": r"Epoch:\[(?P<epoch>\d+)\]"}})
    assert [m["epoch"] for m in again["matches"]["p"]] == ["1"]


def test_a_pattern_that_backtracks_for_ever_is_cut_off(tmp_path: Path) -> None:
    write(tmp_path, "a" * 40 + "!\n")
    started = time.monotonic()
    found = supervisor._scan(str(tmp_path), {"from": 0, "patterns": {"p": r"(a+)+$"}})
    assert "took more than 1s" in found["error"] and time.monotonic() - started < 10
    assert supervisor.signal.getitimer(supervisor.signal.ITIMER_REAL) == (0.0, 0.0)


def test_no_log_yet_says_so(tmp_path: Path) -> None:
    assert "cannot read output.log" in supervisor._scan(str(tmp_path), {"from": 0, "patterns": {}})["error"]
