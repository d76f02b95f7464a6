"""Where a job's alert points, for the job screen opened from it: the event that holds the detector's figures,
and the rank, node and attempt that stand out (`alert_evidence`), as one text at the head of the screen
(`evidence_text`)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from ftconsole.tui.rows import SEVERITY_STYLE, style

# An alert kind -> the kind of the job event that holds its evidence, where the event does not name the alert
# in its `data` (the detectors' events do: {"attempt", "alert", "rank", "node"}).
ALERT_EVENT_KIND = {
    "job_hung": "SuspectedHung",
    "job_straggler": "Straggling",
    "job_slow": "Slow",
    "job_rank_error": "RankError",
    "job_failed": "Failed",
}


@dataclass(frozen=True)
class Evidence:
    """Where a job alert points: the event with its figures (None when the job has none), and the rank, node
    and attempt that stand out, as the event's `data` names them (None when it does not)."""

    alert: Mapping[str, Any]
    event: Mapping[str, Any] | None
    rank: int | None = None
    node: str | None = None
    attempt: int | None = None


def alert_evidence(alert: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> Evidence:
    """From a job's events (`show`'s or `events job=ID`): the latest event that names the alert's kind in its
    data, else the latest of the kind that goes with the alert (`ALERT_EVENT_KIND`)."""
    kind = str(alert["kind"])
    events = list(events)
    found = [e for e in events if (e.get("data") or {}).get("alert") == kind]
    if not found:
        found = [e for e in events if e["kind"] == ALERT_EVENT_KIND.get(kind)]
    event = max(found, key=lambda e: (float(e["time"]), int(e.get("id") or 0)), default=None)
    data = (event or {}).get("data") or {}
    return Evidence(
        alert=alert,
        event=event,
        rank=_int(data.get("rank")),
        node=str(data["node"]) if data.get("node") else None,
        attempt=_int(data.get("attempt")),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def evidence_text(ev: Evidence) -> Text:
    """The job screen's head when it is opened from an alert: the alert, its evidence, where to look."""
    alert = ev.alert
    severity = str(alert.get("severity") or "")
    out = Text()
    out.append(str(alert["kind"]), style(SEVERITY_STYLE.get(severity, "strong")))
    out.append(f"  {severity} · {alert.get('state')}  alert {alert['id']}", style("strong"))
    if ev.event is None:
        out.append(f"  no {ALERT_EVENT_KIND.get(str(alert['kind']), 'matching')} event found; the alert says:\n")
        out.append(str(alert["message"]))
        return out
    when = time.strftime("%H:%M:%S", time.localtime(float(ev.event["time"])))
    out.append(f"  {ev.event['kind']} at {when}\n")
    out.append(str(ev.event["message"]))
    if ev.rank is not None:
        where = (
            f"rank {ev.rank}"
            + (f" on {ev.node}" if ev.node else "")
            + (f" (attempt {ev.attempt})" if ev.attempt is not None else "")
        )
        out.append("\nstands out: ", style("strong"))
        out.append(where, style("warn_strong"))
        out.append("   s: a shell there   l: its log", style("muted"))
    return out
