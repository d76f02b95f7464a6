"""The GPU samples the scheduler keeps (scheduler/samples.py) and the curves the console draws from them
(ftconsole/tui/curves.py)."""

from __future__ import annotations

import math

from ftconsole.scheduler.decide.detect import hung
from ftconsole.scheduler.samples import KEPT, GpuSamples, NodeSamples
from ftconsole.tui import curves as C


def report(*utils: float | None, temp: float = 40.0) -> dict[str, object]:
    return {
        "gpus": [
            {"index": i, "utilization": u, "temperature": temp, "memory_used_mib": 1000 * i}
            for i, u in enumerate(utils)
        ]
    }


def test_a_node_keeps_its_last_probes_in_a_ring_with_gaps_for_what_a_probe_did_not_read() -> None:
    ring = NodeSamples(2, capacity=4)
    for t in range(6):
        ring.add(float(t), [{"index": 0, "utilization": 10 * t, "temperature": 50.4}, {"index": 1}])
    assert ring.count == 4 and ring.last == 5.0
    assert ring.util_of(0) == [(2.0, 20.0), (3.0, 30.0), (4.0, 40.0), (5.0, 50.0)]  # the oldest two are gone
    assert ring.util_of(1) == []  # never read
    series = ring.series(1, since=4.0)
    assert series == {"time": [4.0, 5.0], "utilization": [None, None], "temperature": [None, None],
                      "memory_used_mib": [None, None]}  # fmt: skip
    assert ring.series(0, since=5.0)["temperature"] == [50]


def test_values_out_of_range_or_of_the_wrong_kind_are_clamped_or_left_out() -> None:
    ring = NodeSamples(1)
    ring.add(1.0, [{"index": 0, "utilization": 140, "temperature": -3, "memory_used_mib": True}])
    ring.add(2.0, [{"index": 0, "utilization": "97", "temperature": math.nan, "memory_used_mib": 512.4}])
    ring.add(3.0, [{"index": 7, "utilization": 50}, {"index": "0", "utilization": 50}])  # no such GPU, no index
    assert ring.series(0) == {"time": [1.0, 2.0, 3.0], "utilization": [100, None, None],
                              "temperature": [0, None, None], "memory_used_mib": [None, 512, None]}  # fmt: skip


def test_as_a_mapping_it_is_what_the_hang_detector_reads() -> None:
    samples = GpuSamples()
    for t in range(10):
        samples.add("n1", 100.0 + t, report(97.0, 97.0 if t < 5 else 40.0 + t))
    assert set(samples) == {"n1:0", "n1:1"} and len(samples) == 2
    assert samples["n1:0"][-1] == (109.0, 97.0)
    util = {k: samples[k] for k in ("n1:0",)}
    assert hung(100.0, util, 109.0, 8.0) is not None  # flat at 97 % and quiet for the window
    assert hung(100.0, {k: samples[k] for k in samples}, 109.0, 8.0) is None  # GPU 1 moved
    assert samples.get("n1:9") is None and samples.get("nope:0") is None


def test_an_older_sample_is_dropped_and_a_node_whose_gpus_changed_starts_again() -> None:
    samples = GpuSamples()
    samples.add("n1", 10.0, report(5.0))
    samples.add("n1", 9.0, report(6.0))  # late: older than what is kept
    assert samples["n1:0"] == [(10.0, 5.0)]
    samples.add("n1", 11.0, report(7.0, 8.0))  # two GPUs now
    assert samples["n1:0"] == [(11.0, 7.0)] and samples["n1:1"] == [(11.0, 8.0)]
    samples.add("n2", 12.0, {"gpus": []})  # no GPUs: nothing kept
    assert "n2:0" not in samples


def test_samples_seeded_from_the_store_then_this_process_s_merge_in_time_order() -> None:
    seeded, live = GpuSamples(), GpuSamples()
    for t in (1.0, 2.0, 3.0):
        seeded.add("n1", t, report(t))
    for t in (3.0, 4.0):  # 3.0 is in both (this process stored it too)
        live.add("n1", t, report(t))
    live.add("n2", 5.0, report(50.0))
    seeded.merge(live)
    assert seeded["n1:0"] == [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0)]
    assert seeded["n2:0"] == [(5.0, 50.0)]


def test_each_running_job_s_utilisation_is_the_mean_of_its_gpus_at_each_of_the_last_probes() -> None:
    samples = GpuSamples()
    for t in range(5):
        samples.add("n1", float(t), report(10.0 * t, 50.0, None))
    samples.add("n2", 4.0, report(90.0))  # one probe kept so far
    util = samples.jobs_util([(7, "n1", (0, 1)), (7, "n2", (0,)), (8, "n1", (2,)), (9, "gone", (0,))], 3)
    assert util == {7: [35.0, 40.0, 60.0]}  # n2 at the last only; job 8's GPU never read; job 9's node has none
    before = samples.generation
    samples.add("n1", 4.0, report(1.0, 1.0, 1.0))  # not newer: not kept, nothing to compute again
    assert samples.generation == before


def test_a_thousand_nodes_of_8_gpus_hold_about_28_mb() -> None:
    samples = GpuSamples()
    for n in range(1000):
        samples.add(f"n{n}", 1.0, report(*([50.0] * 8)))
    assert samples.nbytes() == 1000 * KEPT * (8 + 8 * 6)
    assert 25e6 < samples.nbytes() < 30e6


def test_buckets_and_sparklines() -> None:
    points = C.buckets([0, 10, 20, 30, 59], [0, 100, None, 50, 100], 0, 60, 6)
    assert points == [0.0, 100.0, None, 50.0, None, 100.0]
    assert C.spark(points, 100) == "▁█ ▅ █"
    assert C.spark([None, 3.0], 0) == " ▁"  # a top of 0 draws the bottom bar


def test_a_curve_line_says_the_last_value_and_the_range() -> None:
    series = {"time": [3000.0, 3300.0, 3590.0], "utilization": [10, None, 90]}
    line = C.curve("util", series, "utilization", 3600.0, top=100, unit="%").plain
    assert line.startswith("util   ") and "now 90%" in line and "min 10 max 90" in line
    bars = line[7 : 7 + C.WIDTH]
    assert bars[-1] == "█" and bars[50] == "▁" and bars.count(" ") == C.WIDTH - 2
    assert "no readings" in C.curve("temp", {"time": [], "temperature": []}, "temperature", 0.0).plain


def test_a_job_s_curves_show_each_rank_and_the_rate_of_its_epochs() -> None:
    now = 10_000.0
    doc = {
        "attempt": 2,
        "ranks": [
            {"rank": 0, "node": "n1", "gpus": [0, 1], "ratios": [1.0, 2.0],
             "series": [{"index": i, "time": [now - 60, now], "utilization": [40, 60 + 20 * i],
                         "memory_used_mib": [100, 200]} for i in (0, 1)],
             "epochs": [[now - 600, 10], [now - 300, 15], [now - 60, 20]]},
            {"rank": 1, "node": "n2", "gpus": [], "series": [], "epochs": []},
        ],
    }  # fmt: skip
    text = C.job_curves(doc, {"goodput": {"goodput": 0.9, "text": "90.0%"}}, now).plain
    assert text.startswith("goodput 90.0%\ntry 2, the last hour")
    assert "rank 0 on n1, GPUs 0,1" in text and "now 70%" in text  # the mean of its two GPUs
    assert "now 20  1.11/min over 9m" in text  # 10 epochs in 540 s
    assert "last 2.00x the hardware time" in text
    assert "rank 1 on n2, GPUs none" in text and "none shown in the last hour" in text


async def test_the_node_and_job_screens_draw_their_curves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from textual.widgets import Static, TabbedContent

    from ftconsole.tui.app import ConsoleApp
    from tests.console_data import NOW, FixedClient, fixed_config

    console = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), clock=lambda: NOW, refresh_s=3600)
    async with console.run_test(size=(140, 50)) as pilot:
        console.open_node("gpu03")
        await pilot.pause(0.5)
        text = str(console.screen.query_one("#curves-text", Static).render())
        assert "GPU 3\nutil   " in text and "now 40%" in text and "now 48C" in text  # its hot, busy GPU
        await pilot.press("escape")
        console.open_job(101)
        await pilot.pause(0.3)
        await pilot.press("3")  # the Curves tab, by its place: its samples are read once it is shown
        await pilot.pause(0.5)
        assert console.screen.query_one(TabbedContent).active == "curves"
        text = str(console.screen.query_one("#curves-text", Static).render())
        assert "rank 0 on gpu01, GPUs 0,1,2,3,4,5,6,7" in text and "rank 1 on gpu02" in text
        assert "now 97%" in text and "epoch " in text and "now 21" in text


def test_the_last_busy_sample_is_found_from_the_newest_back_to_a_bound() -> None:
    """Idle reclaim's question of each GPU: when did it last read at least the threshold, since when it asks."""
    samples = GpuSamples(capacity=4)  # a ring of 4: the oldest go
    for when, util in ((10.0, 90), (20.0, 5), (30.0, 50), (40.0, 3), (50.0, None)):
        samples.add("n1", when, {"gpus": [{"index": 0, "utilization": util}]})
    assert samples.last_at_least("n1", 0, 10, since=0.0) == 30.0
    assert samples.last_at_least("n1", 0, 60, since=0.0) is None  # 90 at 10.0 fell out of the ring
    assert samples.last_at_least("n1", 0, 10, since=35.0) is None  # not looked for before the bound
    assert samples.last_at_least("n1", 1, 10, since=0.0) is None and samples.last_at_least("x", 0, 1, 0.0) is None
