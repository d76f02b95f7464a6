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
