"""`ftconsole usage`: GPU-hours per user or project over a period, like Slurm's sreport (issue 30's history); and
the times `jobs --since/--until` take.

A time is a moment (`2026-11-01`, `2026-11-01T14:00`, local time) or a time ago (`7d`, `12h`, `90m`).
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

from ftconsole.format import age, print_json, print_table
from ftconsole.jobs_cli import _with_client
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.spec.values import parse_duration

DEFAULT_SINCE = "7d"


def parse_when(text: str, now: float) -> float:
    """Seconds since the epoch of `text`: an ISO date or time (local), or a duration ago ("7d")."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    try:
        return now - parse_duration(text)
    except ValueError:
        raise UsageError(
            f"{text!r} is not a time: give a date (2026-11-01, 2026-11-01T14:00) or a time ago (7d, 12h, 90m)"
        ) from None


def window(args: argparse.Namespace, *, default_since: str | None) -> tuple[float | None, float | None]:
    now = time.time()
    since = args.since if args.since is not None else default_since
    start = parse_when(since, now) if since is not None else None
    end = parse_when(args.until, now) if args.until is not None else None
    if start is not None and end is not None and start >= end:
        raise UsageError(f"--since ({since}) must be before --until ({args.until})")
    return start, end


def cmd_usage(args: argparse.Namespace) -> int:
    since, until = window(args, default_since=DEFAULT_SINCE)
    doc = _with_client(args, "usage", lambda c: c.call("usage", since=since, until=until, by=args.by))
    if args.json:
        print_json(doc)
        return 0
    span = age(doc["until"] - doc["since"])
    print(f"GPU-hours by {doc['by']} from {_local(doc['since'])} to {_local(doc['until'])} ({span})")
    rows: list[list[Any]] = [[k, f"{u['gpu_hours']:.2f}", u["jobs"], *_goodput(u)] for k, u in doc["rows"].items()]
    rows.append(["(all)", f"{doc['total']['gpu_hours']:.2f}", doc["total"]["jobs"], *_goodput(doc["total"])])
    print_table([doc["by"].upper(), "GPU-HOURS", "JOBS", "GOODPUT", "LOST GPU-H"], rows)
    if doc.get("quotas"):
        print(f"\nquotas (now; GPU-hours over the last {age(next(iter(doc['quotas'].values()))['period_s'])})")
        quota_rows = [
            [name, *(_of(q, key) for key in ("gpus", "running_jobs", "queued_jobs", "gpu_hours"))]
            for name, q in doc["quotas"].items()
        ]
        print_table([doc["by"].upper(), "GPUS", "RUNNING", "QUEUED", "GPU-HOURS"], quota_rows)
    return 0


def cmd_shares(args: argparse.Namespace) -> int:
    """Slurm's `sshare`, with the last day's and week's GPU-hours and goodput of each project and user."""
    doc = _with_client(args, "shares", lambda c: c.call("shares"))
    if args.json:
        print_json(doc)
        return 0
    fair = doc["fairshare"]
    if fair is None:
        print("fair share: off (scheduler.fairshare)")
    else:
        level = "per user (no projects declared)" if fair["by_user"] else "per project, then per user within it"
        print(f"fair share: {level}, usage halved every {age(fair['half_life_s'])}")
        rows = [[a["project"], a["user"], f"{a['share']:.1%}", f"{a['usage']:.1%}", f"{a['gpu_hours']:.1f}",
                 f"{a['factor']:.3f}"] for a in fair["accounts"]]  # fmt: skip
        print_table(["PROJECT", "USER", "SHARE", "USAGE", "DECAYED GPU-H", "FAIRSHARE"], rows)
    for by in ("project", "user"):
        names = sorted(set(doc["day"][by]) | set(doc["week"][by]) | set(doc["quotas"][by]))
        print(f"\nby {by}: the last day and week")
        rows = []
        for name in names:
            day, week = doc["day"][by].get(name, {}), doc["week"][by].get(name, {})
            quota = doc["quotas"][by].get(name)
            limits = f"{_of(quota, 'gpus')} GPUs, {_of(quota, 'gpu_hours')} GPU-h" if quota else "-"
            rows.append([name, f"{day.get('gpu_hours', 0):.1f}", f"{week.get('gpu_hours', 0):.1f}",
                         _goodput(week)[0] if week else "-", limits])  # fmt: skip
        print_table([by.upper(), "GPU-H 1D", "GPU-H 7D", "GOODPUT 7D", "QUOTA (IN USE/LIMIT)"], rows)
    return 0


def _goodput(row: dict[str, Any]) -> list[str]:
    """The share of the GPU time that did useful work, and the GPU-hours lost to failures ("-" from a scheduler
    that does not say)."""
    ratio = row.get("goodput")
    if ratio is None:
        return ["-", "-"]
    return [f"{ratio:.1%}", f"{row['lost_gpu_hours']:.2f}"]


def _of(quota: dict[str, Any], key: str) -> str:
    """ "12/64": what is in use of a limit ("12" without one)."""
    used = quota["in_use"][key]
    shown = f"{used:.1f}" if isinstance(used, float) else str(used)
    return f"{shown}/{quota['limits'][key]:g}" if key in quota["limits"] else shown


def _local(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def add_window_options(p: argparse.ArgumentParser, *, since_help: str) -> None:
    p.add_argument("--since", metavar="WHEN", help=since_help)
    p.add_argument("--until", metavar="WHEN", help="up to this time (default: now); a date or a time ago")


LIMITS = (("gpus", int), ("running_jobs", int), ("queued_jobs", int), ("gpu_hours", float))


def cmd_quota(args: argparse.Namespace) -> int:
    limits: dict[str, Any] | None = None
    if args.action == "set":
        limits = {key: value for key, _ in LIMITS if (value := getattr(args, key)) is not None}
        limits |= {key: None for key in args.no_limit or []}
        if not limits:
            raise UsageError("quota set needs at least one limit (--gpus, --running-jobs, --queued-jobs, --gpu-hours)")
    doc = _with_client(args, "quota", lambda c: c.call("quota", kind=args.kind, name=args.name, limits=limits))
    if args.json:
        print_json(doc)
        return 0
    shown = {k: v for k, v in (doc["limits"] or {}).items() if v is not None}
    what = ", ".join(f"{k} {v:g}" for k, v in shown.items()) or "no limits"
    source = "set" if doc["set"] else "from the config"
    print(f"quota of {doc['kind']} {doc['name']} ({source}): {what}")
    return 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "usage",
        parents=parents,
        help="GPU-hours per user or project over a period (like sreport)",
        description="GPU-hours each user (or project) used in a period, every job's (deleted ones too): each "
        "rank's GPUs from its start to its end. WHEN is a date (2026-11-01, 2026-11-01T14:00, local time) or a "
        "time ago (7d, 12h).",
    )
    add_window_options(p, since_help=f"from this time (default: {DEFAULT_SINCE} ago); a date or a time ago")
    p.add_argument("--by", choices=["user", "project"], default="user", help="one row per user (default) or project")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser(
        "shares",
        parents=parents,
        help="how the cluster is shared: fair share, use over the last day and week, quotas (like sshare)",
        description="Each project's and user's fair-share standing (the share it is due, the share of the decayed "
        "usage it took, its factor: 1 for no usage, 0.5 for just its share), its GPU-hours and goodput over the "
        "last day and week, and its quota with what it uses now.",
    )
    p.set_defaults(func=cmd_shares)

    p = sub.add_parser(
        "quota",
        parents=parents,
        help="set a project's or user's quota limits (admins), over the config's",
        description="Sets the quota limits of a project or a user over the cluster config's (`quotas`); they take "
        "effect at the next placement pass and stay across restarts. `clear` goes back to the config's. "
        "`ftconsole usage --by project` (or user) shows every limit and what each uses.",
    )
    p.add_argument("action", choices=["set", "clear"])
    p.add_argument("kind", choices=["project", "user"])
    p.add_argument("name", help="the project's or user's name")
    for key, kind in LIMITS:
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, dest=key, type=kind, metavar="N", help=f"set: the most {key.replace('_', ' ')}")
    p.add_argument("--no-limit", action="append", choices=[k for k, _ in LIMITS], metavar="LIMIT",
                   help="set: no limit for this one (repeatable)")  # fmt: skip
    p.add_argument("--local", action="store_true", help="without a scheduler serving: write it to the store")
    p.set_defaults(func=cmd_quota)
