"""Curves over time for the detail screens, as text: a node's GPUs (utilisation, temperature, memory) and a job's
ranks (their GPUs, their epochs), from the API's `samples` (the scheduler keeps the last probes of each node).

A curve is a sparkline over a fixed span (the last hour), one character a bucket of time: the bar's height is the
bucket's mean against the curve's top (100 % for utilisation, the GPU's memory, the hottest reading), a space a
bucket with no reading. So two curves of the same width line up in time, and a gap says the probes read nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text

from ftconsole.format import age
from ftconsole.tui import rows as R

WIDTH = 60  # buckets a curve has
SPAN_S = 3600.0  # the span a curve covers, ending now
BARS = "▁▂▃▄▅▆▇█"


def buckets(
    times: Sequence[float], values: Sequence[float | None], start: float, end: float, width: int
) -> list[float | None]:
    """The mean of the values in each of `width` equal buckets of [start, end); None where there is none."""
    sums = [0.0] * width
    counts = [0] * width
    step = (end - start) / width if end > start else 1.0
    for t, v in zip(times, values, strict=False):
        if v is None or not start <= t < end + step:  # the last probe may land on `end`
            continue
        i = min(width - 1, int((t - start) / step))
        sums[i] += float(v)
        counts[i] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def spark(points: Sequence[float | None], top: float) -> str:
    """Each point as a bar of 8 heights against `top` (0 at the bottom), a space where there is none."""
    out = []
    for v in points:
        if v is None:
            out.append(" ")
        else:
            out.append(BARS[max(0, min(7, int(v / top * 8))) if top > 0 else 0])
    return "".join(out)


def curve(
    label: str,
    series: Mapping[str, Sequence[Any]],
    key: str,
    now: float,
    *,
    top: float | None = None,
    unit: str = "",
    role: str = "info",
    width: int = WIDTH,
) -> Text:
    """`label  ▁▂▃▅▇  last 87%  (min 3, max 97)` over the last `SPAN_S` of one series of `samples`."""
    values = series.get(key) or []
    times = series.get("time") or []
    known = [float(v) for v in values if v is not None]
    if not known:
        return Text.assemble((f"{label:<6}", "bold"), (" no readings in the last hour", "dim"))
    height = top if top is not None else max(known) or 1.0
    points = buckets(times, values, now - SPAN_S, now, width)
    last = next((v for v in reversed(values) if v is not None), None)
    return Text.assemble(
        (f"{label:<6}", "bold"),
        " ",
        (spark(points, height), R.style(role)),
        f"  now {_num(last)}{unit}",
        (f"  min {_num(min(known))} max {_num(max(known))}", "dim"),
    )


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"


def node_curves(doc: Mapping[str, Any] | None, gpus: Sequence[Mapping[str, Any]], now: float) -> Text:
    """Each GPU of a node over the last hour: utilisation, temperature and memory used."""
    if not doc or not doc.get("gpus"):
        return Text("no samples yet: the probes have not read this node's GPUs", style="dim")
    totals = {g.get("index"): g.get("memory_total_mib") for g in gpus}
    lines: list[Text] = [Text(f"the last hour, {_span_note(WIDTH)}", style="dim")]
    for g in doc["gpus"]:
        i = g["index"]
        total = totals.get(i)
        lines.append(Text(f"GPU {i}", style="bold"))
        lines.append(curve("util", g, "utilization", now, top=100, unit="%", role="ok"))
        lines.append(curve("temp", g, "temperature", now, top=100, unit="C", role="warn"))  # against 100 C
        lines.append(curve("mem", g, "memory_used_mib", now, top=float(total) if total else None, unit=" MiB"))
    return Text("\n").join(lines)


def job_curves(doc: Mapping[str, Any] | None, job: Mapping[str, Any], now: float) -> Text:
    """Each rank of a job's current attempt over the last hour: its GPUs' mean utilisation and memory, and the
    epochs its log showed (with the rate); the job's goodput on top."""
    lines: list[Text] = []
    good = job.get("goodput") or {}
    if good.get("goodput") is not None:
        lines.append(Text(f"goodput {good['text']}"))
    if not doc or not doc.get("ranks"):
        lines.append(Text("no ranks running: nothing to draw", style="dim"))
        return Text("\n").join(lines)
    lines.append(Text(f"try {doc['attempt']}, the last hour, {_span_note(WIDTH)}", style="dim"))
    for r in doc["ranks"]:
        gpus = ",".join(map(str, r["gpus"])) or "none"
        lines.append(Text(f"rank {r['rank']} on {r['node']}, GPUs {gpus}", style="bold"))
        mean = _mean_series(r.get("series") or [])
        if r["gpus"]:
            lines.append(curve("util", mean, "utilization", now, top=100, unit="%", role="ok"))
            lines.append(curve("mem", mean, "memory_used_mib", now, unit=" MiB"))
        lines.append(_epochs_line(r.get("epochs") or [], now))
        if r.get("ratios"):
            ratios = r["ratios"]
            bars = spark(ratios[-WIDTH:], max(ratios) or 1.0)
            last = f"  last {ratios[-1]:.2f}x the hardware time"
            lines.append(Text.assemble(("iter  ", "bold"), " ", bars, last, ("  (an iteration a bar)", "dim")))
    return Text("\n").join(lines)


def _mean_series(series: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The GPUs of one rank as one series: at each probe, the mean over the GPUs that were read."""
    if not series:
        return {"time": []}
    times = series[0].get("time") or []
    out: dict[str, list[Any]] = {"time": list(times)}
    for key in ("utilization", "memory_used_mib"):
        column = []
        for i in range(len(times)):
            read = [s[key][i] for s in series if i < len(s.get(key) or []) and s[key][i] is not None]
            column.append(sum(read) / len(read) if read else None)
        out[key] = column
    return out


def _epochs_line(epochs: Sequence[Sequence[float]], now: float) -> Text:
    """The epochs its log showed: a bar per bucket of how many epochs went by, the rate over the hour."""
    recent = [(t, e) for t, e in epochs if t >= now - SPAN_S]
    if not recent:
        return Text.assemble(("epoch ", "bold"), ("none shown in the last hour (its progress: pattern)", "dim"))
    steps = [(t, float(e - p)) for (t, e), (_, p) in zip(recent[1:], recent[:-1], strict=True)]
    points = buckets([t for t, _ in steps], [s for _, s in steps], now - SPAN_S, now, WIDTH)
    since = recent[-1][0] - recent[0][0]  # between the first and the last seen
    rate = (recent[-1][1] - recent[0][1]) / since * 60 if since > 0 else 0.0
    top = max((p for p in points if p is not None), default=1.0) or 1.0
    return Text.assemble(
        ("epoch ", "bold"),
        " ",
        (spark(points, top), R.style("info")),
        f"  now {int(recent[-1][1])}",
        (f"  {rate:.2f}/min over {age(since)}, last seen {age(now - recent[-1][0])} ago", "dim"),
    )


def _span_note(width: int) -> str:
    return f"one bar per {age(SPAN_S / width)}, oldest on the left"
