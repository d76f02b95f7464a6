"""The Jobs view's update looks only at what can have changed (the jobs the feed read anew, the running and failed
ones, and those whose alerts, utilisation or mark changed): after each of many random changes its rows, order and
counts are those a view built from nothing makes of the same feed."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ftconsole.tui import rows as R
from ftconsole.tui.app import ConsoleApp
from ftconsole.tui.feed import JOB_LOG, Feed
from ftconsole.tui.views import JobsView
from tests.console_data import fixed_config

T0 = 1_750_000_000.0
STATUSES = ("queued", "queued", "running", "running", "succeeded", "error", "stopped")


class Changing:
    """A feed's source: jobs (some of them arrays' tasks) that start, end, fail, are held, stopped, deleted and
    submitted; alerts that open and close; utilisation that moves."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = T0
        self.jobs: dict[int, dict[str, Any]] = {}
        self.changed: dict[int, dict[str, Any]] = {}
        self.alerts: list[dict[str, Any]] = []
        self.util: dict[str, list[float]] = {}
        self.next_id = 1
        for _ in range(60):
            self.submit()
        for array_id in (1000, 2000):
            for index in range(8):
                self.submit(array_id=array_id, index=index)

    def submit(self, array_id: int | None = None, index: int | None = None) -> None:
        rng = self.rng
        job_id = self.next_id if array_id is None else array_id + (index or 0)
        self.next_id += 1
        status = rng.choice(STATUSES)
        job: dict[str, Any] = {
            "id": job_id, "name": f"job{job_id}", "owner": rng.choice(("ann", "bo")), "status": status,
            "priority": rng.choice(("normal", "urgent")), "project": "p", "access": "project", "mode": "single",
            "nodes": 1, "gpus_per_node": rng.choice((1, 8)), "submitted": self.now - rng.uniform(0, 900),
            "started": None, "ended": None, "message": "", "attempt": 0, "open_alerts": 0, "last_output": None,
            "node_names": [], "held": None, "stop_requested": None, "max_runtime_s": None,
        }  # fmt: skip
        if array_id is not None:
            job |= {"array_id": array_id, "array_index": index, "array": "0-7", "ref": f"{array_id}[{index}]"}
        self.set_status(job, status)
        self.jobs[job_id] = self.changed[job_id] = job

    def set_status(self, job: dict[str, Any], status: str) -> None:
        job["status"] = status
        if status == "queued":  # queued again: as the scheduler shows it, with no clock of its own
            job["started"] = job["ended"] = job["last_output"] = None
        else:
            job["started"] = job["started"] or self.now - self.rng.uniform(0, 600)
            job["last_output"] = self.now - self.rng.choice((1, 30, 700))  # some of them stalled (over 10 min)
        if status not in ("queued", "running"):
            job["ended"] = self.now - self.rng.uniform(0, 400)

    def step(self) -> None:
        rng = self.rng
        self.now += rng.choice((1, 1, 5, 60, 400))  # a failure stops needing attention after a while
        for _ in range(rng.randrange(6)):
            job = dict(rng.choice(list(self.jobs.values())))
            what = rng.randrange(5)
            if what == 0:
                self.set_status(job, rng.choice(STATUSES))
            elif what == 1 and job["status"] != "queued":
                job["last_output"] = self.now
            elif what == 2 and job["status"] == "queued":
                job["held"] = None if job["held"] else {"by": "ann", "at": self.now, "admin": False}
            elif what == 3:
                job["priority"] = rng.choice(("normal", "urgent", "low"))
            else:
                job["open_alerts"] = rng.randrange(2)
            self.jobs[job["id"]] = self.changed[job["id"]] = job
        if rng.random() < 0.2:
            self.submit()
        if rng.random() < 0.15:
            gone = rng.choice(list(self.jobs))
            self.changed[gone] = {**self.jobs.pop(gone), "deleted": True}
        if rng.random() < 0.3:
            running = [j for j in self.jobs.values() if j["status"] in ("running", "error")]
            if running:
                kind = rng.choice(("job_hang", "job_slow", "job_straggler"))
                self.alerts.append({"id": len(self.alerts) + 1, "job": rng.choice(running)["id"], "kind": kind,
                                    "state": "open", "node": None, "message": "m", "time": self.now})  # fmt: skip
        if self.alerts and rng.random() < 0.2:
            rng.choice(self.alerts)["state"] = "resolved"

    async def call(self, op: str, **args: Any) -> Any:
        if op == "jobs_changed":
            jobs = list(self.jobs.values()) if args.get("since") is None else list(self.changed.values())
            self.changed = {}
            return {"cursor": self.now, "jobs": [dict(j) for j in jobs]}
        if op == "alerts":
            return [dict(a) for a in self.alerts]
        if op == "job_util":
            running = [j["id"] for j in self.jobs.values() if j["status"] == "running"]
            return {str(j): [self.rng.choice((0.0, 50.0, 99.0))] for j in running[: self.rng.randrange(4)]}
        raise AssertionError(op)


def _seen(view: JobsView, feed: Feed, now: float) -> tuple[list[str], list[Any], str]:
    rows, order = view.build(feed, now)
    order, summary = list(order), str(view.summary(feed, now))  # right for every row, on screen or not
    view.freshen(order)  # every row on screen: the running and failed ones' ages as of now too
    assert view.build(feed, now)[1] == order  # looking at a row's clock moves no row
    assert set(rows) == set(order)
    return order, [R.row_text(rows[k]) for k in order], summary


@pytest.mark.parametrize("seed", range(6))
async def test_each_update_is_what_a_view_built_from_nothing_shows(seed: int) -> None:
    rng = random.Random(seed)
    source = Changing(rng)
    feed = Feed(clock=lambda: source.now)
    view = JobsView(id="jobs")
    for step in range(150):
        if step:
            source.step()
        await feed.refresh(source, ["jobs", "alerts", "job_util"])
        if rng.random() < 0.1:  # a mark, an array opened or closed, now and then
            view.toggle_mark(rng.choice([*map(str, feed.jobs), R.array_key(1000)]))
        if rng.random() < 0.05:
            view.toggle_array(rng.choice((1000, 2000)))
        fresh = JobsView(id="fresh")
        fresh.marked, fresh.expanded = set(view.marked), set(view.expanded)
        assert _seen(view, feed, source.now) == _seen(fresh, feed, source.now), f"seed {seed}, step {step}"


async def test_a_view_further_back_than_the_feed_keeps_builds_everything_again() -> None:
    source = Changing(random.Random(7))
    feed = Feed(clock=lambda: source.now)
    view = JobsView(id="jobs")
    await feed.refresh(source, ["jobs", "alerts", "job_util"])
    view.build(feed, source.now)
    seen = feed.jobs_read
    for _ in range(JOB_LOG + 5):
        job = dict(next(iter(source.jobs.values())))
        job["last_output"] = (job["last_output"] or source.now) + 1
        source.jobs[job["id"]] = source.changed[job["id"]] = job
        await feed.refresh(source, ["jobs"])
    assert feed.jobs_changed_since(seen) is None
    assert feed.jobs_changed_since(feed.jobs_read - 1) == {job["id"]}
    fresh = JobsView(id="fresh")
    assert _seen(view, feed, source.now) == _seen(fresh, feed, source.now)


class Running:
    """200 jobs running since T0 - 30 s, then nothing changes but the clock."""

    embedded = True

    def __init__(self) -> None:
        self.now = T0
        source = Changing(random.Random(1))
        self.jobs = []
        for i in range(1, 201):
            job = dict(next(iter(source.jobs.values())), id=i, name=f"run{i}", priority="normal", held=None)
            job |= {"status": "running", "started": T0 - 30, "last_output": T0 - 5, "ended": None}
            job.pop("array_id", None)
            self.jobs.append(job)

    async def call(self, op: str, **args: Any) -> Any:
        if op == "jobs_changed":
            return {"cursor": self.now, "jobs": [] if args.get("since") is not None else self.jobs}
        return [] if op == "alerts" else {}


async def test_rows_that_come_on_screen_show_their_ages_as_of_the_last_update(tmp_path: Path) -> None:
    """An update brings only the rows on screen to the clock; a scroll brings the rows it shows."""
    source = Running()
    app = ConsoleApp(fixed_config(tmp_path), client=source, clock=lambda: source.now, refresh_s=3600)
    async with app.run_test(size=(160, 30)) as pilot:
        await app.refresh_data()
        source.now += 200  # then nothing changes but the clock: every runtime reads 4m (230 s) now
        await app.refresh_data()
        await pilot.pause()
        table = app.view.table
        first = table.visible_keys()
        assert first and all("4m" in R.row_text(table.shown(k)) for k in first)
        await pilot.press("end")
        await pilot.pause()
        shown = table.visible_keys()
        assert shown and not set(shown) & set(first)
        assert all("4m" in R.row_text(table.shown(k)) and "30s" not in R.row_text(table.shown(k)) for k in shown)


async def test_a_filter_reads_every_row_s_ages_as_of_the_update(tmp_path: Path) -> None:
    """A `/` filter matches every row's text, off screen too: their ages as of the update, not of their last build."""
    source = Running()
    app = ConsoleApp(fixed_config(tmp_path), client=source, clock=lambda: source.now, refresh_s=3600)
    async with app.run_test(size=(160, 30)) as pilot:
        await app.refresh_data()
        app.view.set_filter("4m")
        source.now += 200  # every runtime reads 4m (230 s) now: every row matches
        await app.refresh_data()
        await pilot.pause()
        assert app.view.table.row_count == len(source.jobs) == 200
