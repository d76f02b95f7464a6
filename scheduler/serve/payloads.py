"""What a notification says (pure): the JSON of one alert or of alerts coalesced by the rate limit, the one-line
text a chat hook shows (escaped for it: a user's `<!channel>` reaches the channel as text), and the key that names
a notification wherever it is sent again. `scheduler.serve.notify` sends them; the Alertmanager sync uses the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.scheduler.decide.usertext import clean, clean_json
from ftconsole.scheduler.store.records import StoredAlert

TEXT_MAX = 400  # characters of the one-line summary (`text`)
LISTED_MAX = 100  # alerts listed in a coalesced notification (all are counted, every id is given)
SEVERITY_ORDER = ("info", "warning", "error", "critical")


@dataclass(frozen=True)
class AlertInfo:
    """An alert with what a reader of the notification wants beside it: its job's name and owner."""

    alert: StoredAlert
    job_name: str | None = None
    owner: str | None = None


def one_line(text: str, most: int = TEXT_MAX) -> str:
    """`text` on one line (each run of white space one space), without control characters, at most `most`
    characters long."""
    flat = clean(" ".join(text.split()))
    return flat if len(flat) <= most else flat[: most - 1] + "…"


# Slack's message formatting: "&", "<" and ">" are control characters of its markup (`<!channel>`, `<@U123>`,
# `<https://...|text>`); escaped, they read as themselves. `&` first: the others' escapes start with it.
_CHAT_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))


def chat_escape(text: str) -> str:
    """`text` as a chat hook shows it as written: `<!channel>` reads `&lt;!channel&gt;`, no mention, no link."""
    for raw, escaped in _CHAT_ESCAPES:
        text = text.replace(raw, escaped)
    return text


def alert_text(alert: StoredAlert) -> str:
    """`[ftconsole] ERROR job_failed #12: job 7 (llama, ann) failed: ...` (the message names the job or node), one
    line of at most TEXT_MAX characters before it is escaped for chat (`chat_escape`)."""
    return chat_escape(one_line(f"[ftconsole] {alert.severity.upper()} {alert.kind} #{alert.id}: {alert.message}"))


def alert_payload(info: AlertInfo, cluster_id: str) -> dict[str, Any]:
    """The JSON of one alert: `text` (one line, what a chat hook shows, escaped for it) and the alert's own
    fields, as `ftconsole alerts --json` gives them, with the job's name and owner and the cluster id; no text
    in it has a control character."""
    payload = {
        "text": alert_text(info.alert),
        **info.alert.to_json(),
        "job_name": info.job_name,
        "owner": info.owner,
        "cluster_id": cluster_id,
    }
    return clean_json(payload)


def worst_severity(severities: Iterable[str]) -> str:
    known = [s for s in severities if s in SEVERITY_ORDER]
    return max(known, key=SEVERITY_ORDER.index) if known else "error"


def coalesced_payload(infos: Sequence[AlertInfo], cluster_id: str, *, rate_limit: int) -> dict[str, Any]:
    """The JSON of alerts held back by the rate limit, sent as one: `kind` "coalesced", their `count`, every
    id, the worst severity, a count per kind, and the first `LISTED_MAX` of them in brief; `text` escaped for
    chat, no text with a control character."""
    alerts = [i.alert for i in infos]
    kinds: dict[str, int] = {}
    for a in alerts:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    per_kind = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    noun = "alert" if len(alerts) == 1 else "alerts"
    severity = worst_severity(a.severity for a in alerts)
    text = (
        f"[ftconsole] {severity.upper()} {len(alerts)} more {noun} (over the limit of {rate_limit} a minute): "
        f"{per_kind}; ids {id_ranges([a.id for a in alerts])}; see `ftconsole alerts`"
    )
    payload = {
        "text": chat_escape(one_line(text)),
        "kind": "coalesced",
        "severity": severity,
        "count": len(alerts),
        "kinds": kinds,
        "ids": [a.id for a in alerts],
        "alerts": [
            {
                "id": i.alert.id,
                "time": i.alert.time,
                "kind": i.alert.kind,
                "severity": i.alert.severity,
                "job": i.alert.job,
                "node": i.alert.node,
                "message": i.alert.message,
                "job_name": i.job_name,
                "owner": i.owner,
            }
            for i in infos[:LISTED_MAX]
        ],
        "cluster_id": cluster_id,
    }
    return clean_json(payload)


def notification_key(cluster_id: str, ids: Sequence[int]) -> str:
    """What names one notification wherever and however often it is sent (a restart, another leader): the
    cluster and its alerts, e.g. `ftconsole-3f9c2a1b7d4e-12` or `ftconsole-3f9c2a1b7d4e-12-15.17`."""
    return f"ftconsole-{cluster_id}-" + id_ranges(ids).replace(", ", ".")


def id_ranges(ids: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out: list[str] = []
    for i in sorted(set(ids)):
        if out and i == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)
