"""The Shares view (key 8): how the cluster is shared, per project and per user (the `shares` op: Slurm's
`sshare` with sreport's sums).

For each project, then each user: the share of the cluster it is due and the share of the (decayed) usage it
took, drawn as a bar against it; its fair-share factor (1 for no usage, 0.5 for just its share, less for more);
its GPU-hours over the last day and week; its goodput over the week (useful GPU time against what failures lost);
and its quota, what it uses of each limit now. Most used over the week first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text

from ftconsole.format import age
from ftconsole.tui import rows as R
from ftconsole.tui.feed import Feed
from ftconsole.tui.views import View

SHARE_COLUMNS = (
    R.Column("who", "WHO", min_width=14),
    R.Column("due", "DUE"),
    R.Column("used", "USED"),
    R.Column("bar", "USED AGAINST DUE", 26),
    R.Column("factor", "FAIR SHARE"),
    R.Column("day", "GPU-H 1D"),
    R.Column("week", "GPU-H 7D"),
    R.Column("goodput", "GOODPUT 7D"),
    R.Column("quota", "QUOTA: IN USE/LIMIT"),
)
BAR = 20  # columns of the used-against-due bar: its middle mark is "just its share"


def used_bar(used: float | None, due: float | None) -> Text:
    """`used` against `due` on BAR columns: the middle mark (`│`) is just its share, `▸` at the end past twice it."""
    if used is None or not due:
        return Text("")
    ratio = used / due
    filled = min(BAR, round(ratio * BAR / 2))
    cells = ["█" if i < filled else "│" if i == BAR // 2 else "·" for i in range(BAR)]
    if ratio > 2.0:
        cells[-1] = "▸"
    text = Text("".join(cells), style=R.style("ok" if ratio <= 1.0 else "warn" if ratio <= 2.0 else "bad"))
    text.append(f" {ratio:.1f}x", style=R.style("muted"))
    return text


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _hours(row: Mapping[str, Any] | None) -> str:
    return "-" if not row else f"{row.get('gpu_hours', 0.0):.1f}"


def _goodput(row: Mapping[str, Any] | None) -> Text | str:
    ratio = None if not row else row.get("goodput")
    if ratio is None:
        return "-"
    return R.styled(f"{ratio:.1%}", "ok" if ratio >= 0.95 else "warn" if ratio >= 0.8 else "bad")


def _quota(quota: Mapping[str, Any] | None) -> str:
    """`gpus 12/64 · gpu_hours 40.1/500`: what is in use of each limit set."""
    if not quota:
        return "-"
    parts = []
    for key, limit in quota.get("limits", {}).items():
        used = quota.get("in_use", {}).get(key, 0)
        shown = f"{used:.1f}" if isinstance(used, float) else str(used)
        parts.append(f"{key.replace('_', ' ')} {shown}/{limit:g}")
    return " · ".join(parts) or "-"


def _factor(value: float | None, note: str = "") -> Text | str:
    if value is None:
        return "-"
    return R.styled(f"{value:.3f}{note}", "ok" if value >= 0.5 else "warn" if value >= 0.25 else "bad")


def share_rows(doc: Mapping[str, Any] | None) -> tuple[dict[str, R.Row], list[str]]:
    """The view's rows (`project:NAME`, `user:NAME`, and a title row before each kind) and their order."""
    if not doc:
        return {}, []
    fair = doc.get("fairshare") or None
    accounts = (fair or {}).get("accounts") or []
    by_project: dict[str, dict[str, float]] = {}
    by_user: dict[str, dict[str, Any]] = {}
    for a in accounts:
        p = by_project.setdefault(a["project"], {"due": 0.0, "used": 0.0, "factor": 2.0 ** -a["project_ratio"]})
        p["due"] += a["share"]
        p["used"] += a["usage"]
        u = by_user.setdefault(a["user"], {"due": 0.0, "used": 0.0, "factor": None, "where": ""})
        u["due"] += a["share"]
        u["used"] += a["usage"]
        if u["factor"] is None or a["factor"] < u["factor"]:  # the lowest of the user's accounts, and where
            u["factor"], u["where"] = a["factor"], a["project"]
    rows: dict[str, R.Row] = {}
    order: list[str] = []
    for kind, standing in (("project", by_project), ("user", by_user)):
        day, week = doc.get("day", {}).get(kind, {}), doc.get("week", {}).get(kind, {})
        quotas = doc.get("quotas", {}).get(kind, {})
        if kind == "project" and fair is not None and fair.get("by_user"):
            standing = {}  # one level (no projects declared): a project is a label, with no share of its own
        names = set(standing) | set(day) | set(week) | set(quotas)
        if not names:
            continue
        title = f"{kind}s"
        rows[f"title:{kind}"] = (Text(title, style="bold"), *([""] * (len(SHARE_COLUMNS) - 1)))
        order.append(f"title:{kind}")
        ranked = sorted(names, key=lambda n: (-(week.get(n) or {}).get("gpu_hours", 0.0), n))
        for name in ranked:
            s = standing.get(name)
            due, used = (s["due"], s["used"]) if s else (None, None)
            note = f" ({s['where']})" if kind == "user" and s and len(by_project) > 1 and s["where"] else ""
            rows[f"{kind}:{name}"] = (
                f"  {name}",
                _percent(due),
                _percent(used),
                used_bar(used, due),
                _factor(s["factor"] if s else None, note),
                _hours(day.get(name)),
                _hours(week.get(name)),
                _goodput(week.get(name)),
                _quota(quotas.get(name)),
            )
            order.append(f"{kind}:{name}")
    return rows, order


class SharesView(View):
    """Fair share, use and quotas per project and user."""

    title = "Shares"
    columns = SHARE_COLUMNS
    sources = ("shares",)
    kind = "share"

    def build(self, feed: Feed, now: float) -> tuple[dict[str, R.Row], list[str]]:
        return share_rows(feed.shares)

    def summary(self, feed: Feed, now: float) -> Text:
        fair = (feed.shares or {}).get("fairshare")
        if not feed.shares:
            return Text("")
        if fair is None:
            return Text("fair share off (scheduler.fairshare) · GPU-hours over the last day and week, quotas")
        level = "per user" if fair.get("by_user") else "per project, then user"
        return Text(f"fair share {level}, usage halved every {age(fair['half_life_s'])} · used against due")
