"""The hang detector (seed 001) from tables: I/O periods and GPU utilisation windows."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ftconsole.scheduler.decide.detect import Hung, diverged, gpu_flat, hung, slow

NOW = 10_000.0
WINDOW = 600.0


def every(step: float, values: Sequence[float], start: float = NOW - WINDOW + 1) -> list[tuple[float, float]]:
    """Samples at `step` seconds apart from `start`, cycling through `values`."""
    out, t, i = [], start, 0
    while t <= NOW:
        out.append((t, values[i % len(values)]))
        t, i = t + step, i + 1
    return out


FLAT_100 = every(60, [100.0])  # a stuck NCCL collective spins the GPU
FLAT_0 = every(60, [0.0])  # a deadlocked data loader
NOISY = every(60, [20.0, 95.0, 60.0, 5.0])  # training
RISING = every(60, [50 + 0.5 * i for i in range(10)])  # slowly more work (variance low, median moves)
JITTER = every(60, [99.0, 100.0, 99.5, 100.0])  # flat within the noise


@pytest.mark.parametrize(
    ("what", "io_since", "util", "expected"),
    [
        ("I/O moved inside the window: no", NOW - 100, {"n0:0": FLAT_100}, False),
        ("I/O unknown: no", None, {"n0:0": FLAT_100}, False),
        ("quiet for the window, GPU flat at 100%: hung", NOW - WINDOW - 1, {"n0:0": FLAT_100}, True),
        ("quiet, GPU flat at 0%: hung", NOW - 2 * WINDOW, {"n0:0": FLAT_0}, True),
        ("quiet, GPU jittering within 1 point: hung", NOW - 2 * WINDOW, {"n0:0": JITTER}, True),
        ("quiet, GPU noisy: working, no", NOW - 2 * WINDOW, {"n0:0": NOISY}, False),
        ("quiet, GPU slowly rising: no", NOW - 2 * WINDOW, {"n0:0": RISING}, False),
        ("quiet, one GPU flat, the other noisy: no", NOW - 2 * WINDOW, {"n0:0": FLAT_0, "n1:0": NOISY}, False),
        ("quiet, every GPU flat: hung", NOW - 2 * WINDOW, {"n0:0": FLAT_0, "n1:3": FLAT_100}, True),
        ("quiet, no GPUs: I/O alone decides", NOW - 2 * WINDOW, {}, True),
        ("quiet, a GPU never sampled: cannot say", NOW - 2 * WINDOW, {"n0:0": []}, False),
        ("quiet, samples only in the window's second half: cannot say yet", NOW - 2 * WINDOW,
         {"n0:0": every(60, [0.0], start=NOW - WINDOW / 2 + 1)}, False),
        ("quiet, two samples only: cannot say", NOW - 2 * WINDOW, {"n0:0": [(NOW - 500, 0.0), (NOW - 10, 0.0)]},
         False),
        ("old samples before the window are not counted", NOW - 2 * WINDOW,
         {"n0:0": every(60, [50.0], start=NOW - 3 * WINDOW)[:5] + FLAT_0}, True),
    ],
)  # fmt: skip
def test_hung(what: str, io_since: float | None, util: dict[str, list[tuple[float, float]]], expected: bool) -> None:
    verdict = hung(io_since, util, NOW, WINDOW)
    assert (verdict is not None) is expected
    if verdict is not None:
        assert isinstance(verdict, Hung) and verdict.io_since == io_since
        assert [g.gpu for g in verdict.gpus] == sorted(util)


def test_the_verdict_names_the_window_and_the_figures() -> None:
    verdict = hung(NOW - 2 * WINDOW, {"n0:1": FLAT_100}, NOW, WINDOW)
    assert verdict is not None
    text = verdict.describe(WINDOW)
    assert text.startswith("no I/O by any rank for 10m or more; GPU utilisation flat: n0:1 100%")
    assert "variance 0" in text and "median moved +0" in text
    assert hung(NOW - 2 * WINDOW, {}, NOW, WINDOW).describe(WINDOW).endswith("no GPUs to look at")  # type: ignore[union-attr]


def test_gpu_figures() -> None:
    flat = gpu_flat("n0:0", RISING, NOW - WINDOW, NOW)
    assert flat is not None and flat.samples == 10 and flat.variance < 4 and flat.shift > 2 and not flat.flat


@pytest.mark.parametrize(
    ("epochs", "max_lag", "expected"),
    [
        ({}, 1, None),
        ({0: 48}, 0, None),
        ({0: 48, 1: 48, 2: 48}, 0, None),
        ({0: 48, 1: 49}, 1, None),
        ({2: 48, 4: 50}, 1, "ranks 2 epochs apart: rank 2 at 48; rank 4 at 50"),
        ({0: 10, 1: 12, 2: 12, 3: 11}, 1, "ranks 2 epochs apart: rank 0 at 10, rank 3 at 11; ranks 1, 2 at 12"),
    ],
)
def test_diverged(epochs: dict[int, int], max_lag: int, expected: str | None) -> None:
    verdict = diverged(epochs, max_lag)
    assert (verdict.describe() if verdict else None) == expected


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([], False),
        ([2.0, 2.0], False),  # fewer than K
        ([2.0, 2.0, 2.0], True),
        ([2.0, 1.2, 2.0, 2.0], False),  # not in a row
        ([1.0, 1.1, 2.0, 1.6, 1.51], True),
        ([2.0, 2.0, 1.5], False),  # the threshold itself is not over
    ],
)
def test_slow(ratios: list[float], expected: bool) -> None:
    verdict = slow(ratios, 1.5, 3)
    assert (verdict is not None) is expected
    if verdict is not None:
        assert len(verdict.ratios) == 3
        assert "over 1.5x the hardware time for 3 iterations in a row" in verdict.describe()
