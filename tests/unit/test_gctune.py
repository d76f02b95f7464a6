"""The collector's thresholds and the switch interval of the scheduler's process (scheduler/gctune.py)."""

from __future__ import annotations

import gc
import sys

from ftconsole.scheduler import gctune


def test_serving_sets_the_thresholds_and_a_short_switch_interval() -> None:
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        gctune.serving()
        assert gc.get_threshold() == gctune.THRESHOLDS == (50_000, 20, 10)
        assert sys.getswitchinterval() == gctune.SWITCH_INTERVAL_S == 0.001
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)


def test_between_updates_collects_the_young_generations_and_every_30th_time_all() -> None:
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    collect = gctune.BetweenUpdates()
    gc.callbacks.append(seen)
    try:
        for _ in range(2 * gctune.FULL_EVERY):
            collect()
    finally:
        gc.callbacks.remove(seen)
    assert generations.count(2) == 2 and generations.count(1) == 2 * gctune.FULL_EVERY - 2
    assert generations[gctune.FULL_EVERY - 1] == 2 and set(generations) == {1, 2}


async def test_the_console_collects_after_each_update_with_the_collector_s_own_thresholds_raised(tmp_path) -> None:
    from ftconsole.tui.app import COLLECT_AFTER_S, ConsoleApp
    from tests.console_data import FixedClient, fixed_config

    thresholds = gc.get_threshold()
    app = ConsoleApp(fixed_config(tmp_path), client=FixedClient(), refresh_s=COLLECT_AFTER_S + 0.05)
    async with app.run_test(size=(120, 30)) as pilot:
        for _ in range(400):  # the poll's updates: every 0.3 s, each followed by the collector's work
            if app.between_updates.calls >= 3:
                break
            await pilot.pause(0.05)
        assert app.between_updates.calls >= 3
        assert gc.get_threshold() == gctune.BETWEEN_UPDATES  # a safety net only
    assert gc.get_threshold() == thresholds  # given back when the console ends
