"""What the console's views show: cells, order and marks from the scheduler's JSON (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.text import Text

from ftconsole.tui import rows as R

NOW = 1_800_000_000.0


def job(**over: Any) -> dict[str, Any]:
    base = {
        "id": 7,
        "name": "train",
        "owner": "ana",
        "status": "running",
        "priority": "normal",
        "mode": "pytorch",
        "nodes": 2,
        "gpus_per_node": 8,
        "attempt": 1,
        "submitted": NOW - 4000,
        "started": NOW - 3600,
        "ended": None,
        "max_runtime_s": 7200,
        "stop_requested": None,
        "message": "",
        "last_output": NOW - 5,
        "open_alerts": 0,
        "node_names": ["node01", "node02"],
    }
    return base | over


def plain(row: R.Row | R.Lazy) -> list[str]:
    return [c.plain if isinstance(c, Text) else c for c in R.cells_of(row)]


@pytest.mark.parametrize(
    ("over", "state"),
    [
        ({}, "running"),
        ({"stop_requested": NOW - 1}, "stopping"),
        ({"last_output": NOW - R.STALL_AFTER_S - 1}, "stalled"),
        ({"last_output": None, "started": NOW - R.STALL_AFTER_S - 1}, "stalled"),  # never printed at all
        ({"status": "queued", "started": None}, "queued"),
        ({"status": "error", "ended": NOW - 10}, "error"),
    ],
)
def test_job_state(over: dict[str, Any], state: str) -> None:
    assert R.job_state(job(**over), NOW) == state


def test_job_cells() -> None:
    cells = dict(zip([c.key for c in R.JOB_COLUMNS], plain(R.job_cells(job(), NOW)), strict=True))
    assert cells["id"] == "7"
    assert cells["status"] == "running"
    assert cells["shape"] == "2x8"
    assert cells["runtime"] == "1.0h/2.0h"
    assert cells["output"] == "5s"
    assert cells["where"] == "node[01-02]"
    assert cells["mark"] == " "
    assert plain(R.job_cells(job(), NOW, marked=True))[0] == R.MARK
    alerted = dict(zip([c.key for c in R.JOB_COLUMNS], plain(R.job_cells(job(open_alerts=2), NOW)), strict=True))
    assert alerted["alerts"] == "!2"
    util = [None, 0, 50, 100]  # its GPUs at the last probes: a sparkline while it runs
    busy = dict(zip([c.key for c in R.JOB_COLUMNS], plain(R.job_cells(job(), NOW, util=util)), strict=True))
    assert busy["util"] == " ▁▄█"  # 0 % is the lowest bar, no reading a gap
    queued = R.job_cells(job(status="queued"), NOW, util=util)
    assert dict(zip([c.key for c in R.JOB_COLUMNS], plain(queued), strict=True))["util"] == ""


@pytest.mark.parametrize(
    ("over", "shape"),
    [
        ({"nodes": 3}, "2/3x8"),  # an elastic job running on fewer nodes than it asks for
        ({"nodes": 3, "status": "queued", "node_names": []}, "3x8"),
        ({"nodes": 1, "status": "succeeded"}, "1x8"),  # ended: what it asked for
    ],
)
def test_job_shape_shows_nodes_held_of_nodes_asked(over: dict[str, Any], shape: str) -> None:
    cells = dict(zip([c.key for c in R.JOB_COLUMNS], plain(R.job_cells(job(**over), NOW)), strict=True))
    assert cells["shape"] == shape


def test_same_data_same_second_gives_equal_cells() -> None:
    assert R.job_cells(job(), NOW) == R.job_cells(job(), NOW)
    assert R.job_cells(job(), NOW) != R.job_cells(job(), NOW + 60)  # the runtime moved on


def test_jobs_that_need_attention_come_first() -> None:
    jobs = [
        job(id=1, status="succeeded", ended=NOW - 100, last_output=None),
        job(id=2, status="queued", started=None, priority="normal", submitted=NOW - 50),
        job(id=3, status="queued", started=None, priority="urgent", submitted=NOW - 10),
        job(id=4),
        job(id=5, last_output=NOW - 2 * R.STALL_AFTER_S),  # stalled
        job(id=6, status="error", ended=NOW - 60),  # just failed
        job(id=8, status="error", ended=NOW - 2 * R.FAILED_RECENT_S),  # failed long ago: with the ended
        job(id=9, open_alerts=1),
    ]
    order = [j["id"] for j in sorted(jobs, key=lambda j: R.job_order(j, NOW))]
    assert order[:3] == [6, 5, 9]  # the latest trouble first
    assert order[3:] == [4, 3, 2, 1, 8]


def test_nodes_worst_first_and_cells() -> None:
    nodes = [
        {"name": "b", "state": "healthy"},
        {"name": "a", "state": "healthy"},
        {"name": "z", "state": "unreachable"},
        {"name": "d", "state": "drained"},
    ]
    assert [n["name"] for n in sorted(nodes, key=R.node_order)] == ["z", "d", "a", "b"]
    node = {
        "name": "node01",
        "state": "degraded",
        "pool": "h100",
        "gpus": [{"index": i, "name": "NVIDIA H100", "utilization": u} for i, u in enumerate([100, 50, 0, None])],
        "held": [{"gpu": 0, "job": 12}, {"gpu": 1, "job": 12}, {"gpu": 2, "job": 3}],
        "faults": 2,
        "last_probe": NOW - 30,
        "reasons": ["gpu2: 91C"],
    }
    cells = dict(zip([c.key for c in R.NODE_COLUMNS], plain(R.node_cells(node, NOW, [0, 50, 100, None])), strict=True))
    assert cells["gpus"] == "4x H100"
    assert cells["used"] == "3/4"
    assert cells["jobs"] == "3,12"
    assert cells["util"] == "50%"
    assert cells["spark"] == "▁▄█ "  # 0 % the lowest bar, no reading a gap
    assert cells["faults"] == "2"
    assert cells["probed"] == "30s"
    assert cells["reasons"] == "gpu2: 91C"


def test_unprobed_node_reads_never() -> None:
    cells = plain(R.node_cells({"name": "n", "state": "unknown"}, NOW))
    assert "never" in cells and "unknown" in cells


def test_alerts_open_first_by_severity() -> None:
    alerts = [
        {"id": 1, "state": "acknowledged", "severity": "critical", "time": NOW},
        {"id": 2, "state": "open", "severity": "warning", "time": NOW},
        {"id": 3, "state": "open", "severity": "critical", "time": NOW - 10},
        {"id": 4, "state": "open", "severity": "critical", "time": NOW - 5},
    ]
    assert [a["id"] for a in sorted(alerts, key=R.alert_order)] == [4, 3, 2, 1]
    row = plain(R.alert_cells({**alerts[0], "kind": "host_key", "node": "n1", "message": "m", "acked_by": "bo"}, NOW))
    assert row[5] == "ack bo" and row[6] == "n1"


def test_filter() -> None:
    pattern = R.compile_filter("TRAIN|node0[2]")
    assert pattern is not None and pattern.search(R.row_text(R.job_cells(job(), NOW)))
    assert R.compile_filter("") is None
    with pytest.raises(ValueError, match="not a regular expression"):
        R.compile_filter("(")


@pytest.mark.parametrize(
    ("names", "text"),
    [([], ""), (["n1"], "n1"), (["node01", "node02", "node04"], "node[01-02,04]"), (["x"] * 3, "x")],
)
def test_compress_names(names: list[str], text: str) -> None:
    assert R.compress_names(names) == text


# -- arrays: one row each, a row per task when expanded ------------------------------------------------------------

WAITS = "array 12 runs at most 2 tasks at once (2 running)"


def task(id_: int, index: int, status: str, **over: Any) -> dict[str, Any]:
    return job(id=id_, array_id=12, array_index=index, array="0-4%2", ref=f"12[{index}]", status=status, **over)


def array_tasks() -> list[dict[str, Any]]:
    return [
        task(12, 0, "succeeded", ended=NOW - 100, message="done"),
        task(13, 1, "running", node_names=["node03"]),
        task(14, 2, "running", node_names=["node04"]),
        task(15, 3, "queued", started=None, last_output=None, node_names=[], message=WAITS, priority="urgent"),
        task(16, 4, "queued", started=None, last_output=None, node_names=[], message="other"),
    ]


def cells_of(row: R.Row) -> dict[str, str]:
    return dict(zip([c.key for c in R.JOB_COLUMNS], plain(row), strict=True))


@pytest.mark.parametrize(
    ("states", "text"),
    [
        (["running"] * 8 + ["queued"] * 80 + ["succeeded"] * 12, "8▶ 80○ 12✓"),
        (["succeeded", "error", "stalled", "stopping", "stopped", "expired"], "1! 1✗ 1▷ 1✓ 1■ 1⊘"),  # trouble first
        (["queued", "preempted"], "1○ 1?"),  # a status this console does not know yet still counts
    ],
)
def test_array_status_counts_tasks_by_state(states: list[str], text: str) -> None:
    assert R.array_status(states).plain == text


def test_array_status_counts_in_their_states_style() -> None:
    cell = R.array_status(["queued", "error", "running"])
    assert [(cell.plain[s.start : s.end], str(s.style)) for s in cell.spans] == [
        ("1✗", R.style("bad")), ("1▶", R.style("ok")), ("1○", R.style("warn"))
    ]  # fmt: skip


def test_array_keys_never_meet_job_keys() -> None:
    assert R.array_key(12) == "array:12" and R.array_of_key("array:12") == 12
    assert R.array_of_key("12") is None and R.array_of_key("array:x") is None and R.array_of_key("12[3]") is None


def test_collapsed_array_row() -> None:
    tasks = array_tasks()
    cells = cells_of(R.array_cells(tasks, NOW, found={13: ("hung?",)}))
    assert cells["mark"] == R.FOLDED
    assert cells["id"] == "12[0-4%2]"
    assert (cells["name"], cells["owner"], cells["mode"], cells["shape"]) == ("train", "ana", "pytorch", "2x8")
    assert cells["status"] == "2▶ 2○ 1✓"
    assert cells["priority"] == "urgent/normal"  # the most urgent first
    assert (cells["attempt"], cells["runtime"], cells["output"]) == ("-", "-", "-")
    assert cells["alerts"] == "hung?"
    assert cells["where"] == "node[03-04]"  # where its tasks run
    assert cells["message"] == WAITS  # its first queued task's: why the array waits
    # in any order, the same row; with no queued task, the first task's message
    assert R.array_cells(list(reversed(tasks)), NOW) == R.array_cells(tasks, NOW)
    ended = [t | {"status": "succeeded", "ended": NOW - 5} for t in tasks]
    assert cells_of(R.array_cells(ended, NOW))["message"] == "done"
    assert cells_of(R.array_cells(tasks, NOW, marked=True))["mark"] == R.MARK
    assert cells_of(R.array_cells(tasks, NOW, expanded=True))["mark"] == R.UNFOLDED


def test_an_array_sorts_where_its_most_pressing_task_does() -> None:
    tasks = array_tasks()
    assert R.array_lead(tasks, NOW)["id"] == 13
    stalled = [*tasks[:3], tasks[3], tasks[4] | {"status": "running", "last_output": NOW - 2 * R.STALL_AFTER_S}]
    assert R.array_lead(stalled, NOW)["id"] == 16
    assert R.job_order(R.array_lead(stalled, NOW), NOW)[0] == 0  # with the jobs that need attention


def test_a_task_row_shows_its_name() -> None:
    assert cells_of(R.job_cells(array_tasks()[1], NOW))["id"] == "12[1]"
    assert cells_of(R.job_cells(job(ref="7"), NOW))["id"] == "7"


def test_jobs_view_folds_arrays_and_expands_them() -> None:
    from ftconsole.tui.feed import Feed
    from ftconsole.tui.views import JobsView

    feed = Feed(clock=lambda: NOW)
    plain_jobs = [
        job(id=3, status="queued", started=None, last_output=None, priority="very-urgent"),
        job(id=5, status="succeeded", ended=NOW - 50),
        job(id=20),  # running, after the array's running task 13
    ]
    feed.jobs = {j["id"]: j for j in [*array_tasks(), *plain_jobs]}
    view = JobsView(id="jobs")
    rows, order = view.build(feed, NOW)
    assert order == ["array:12", "20", "3", "5"]  # one row for the array, where task 13 (running) sorts
    assert plain(rows["array:12"])[1] == "12[0-4%2]" and rows["20"] is view.build(feed, NOW)[0]["20"]  # cached

    view.toggle_array(12)
    rows, order = view.build(feed, NOW)
    assert order == ["array:12", "13", "14", "15", "16", "12", "20", "3", "5"]  # its tasks, most pressing first
    assert [plain(rows[k])[1] for k in order[1:6]] == ["12[1]", "12[2]", "12[3]", "12[4]", "12[0]"]
    assert plain(rows["array:12"])[0] == R.UNFOLDED
    assert view.summary(feed, NOW).plain.endswith("8 jobs")  # the summary counts tasks as jobs

    view.toggle_array(12)
    assert view.build(feed, NOW)[1] == ["array:12", "20", "3", "5"]
