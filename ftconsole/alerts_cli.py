"""`ftconsole alerts`: the open and acknowledged alerts (`--all`: resolved ones too), and `ack`/`resolve` of some."""

from __future__ import annotations

import argparse
from typing import Any

from ftconsole.format import print_json, print_table
from ftconsole.jobs_cli import _when, _with_client
from ftconsole.scheduler.errors import UsageError


def cmd_alerts(args: argparse.Namespace) -> int:
    if args.action is None:  # (ids without an action are refused by argparse: "invalid choice")
        return _list_alerts(args)
    if not args.ids:
        raise UsageError(f"alerts {args.action} needs at least one alert id")
    op = args.action  # the API ops have the same names
    alerts = _with_client(args, op, lambda c: c.call(op, alerts=args.ids))
    if args.json:
        print_json(alerts)
        return 0
    for a in alerts:
        by = a["acked_by"] if a["state"] == "acknowledged" else a["resolved_by"]
        print(f"alert {a['id']} {a['kind']} ({_alert_object(a)}): {a['state']}" + (f" by {by}" if by else ""))
    return 0


def _alert_object(alert: dict[str, Any]) -> str:
    return f"job {alert['job']}" if alert["job"] is not None else alert["node"] or "-"


def _list_alerts(args: argparse.Namespace) -> int:
    alerts = _with_client(args, "alerts", lambda c: c.call("alerts", all=args.all))
    if args.json:
        print_json(alerts)
        return 0
    rows = [
        [
            a["id"],
            _when(a["time"]),
            a["severity"],
            a["kind"],
            _alert_object(a),
            a["state"] + (f" ({a['acked_by']})" if a["state"] == "acknowledged" else ""),
            a["message"],
        ]
        for a in alerts
    ]
    print_table(["ID", "TIME", "SEVERITY", "KIND", "OBJECT", "STATE", "MESSAGE"], rows)
    return 0
