"""The command line of the lab server: ``python -m ftconsole.lab serve|up|down|status``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from ftconsole.lab.files import LabPaths
from ftconsole.lab.server import lab_down, lab_status, lab_up, serve
from ftconsole.scheduler.errors import FtError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ftconsole.lab", description="the ftconsole lab cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("serve", "up", "down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", help="lab folder (default: $FTCONSOLE_LAB_DIR or ~/.local/state/ftconsole/lab)")
        if name in ("serve", "up"):
            p.add_argument("--layout", help="lab layout file (default: config/lab.yaml)")
            p.add_argument("--nodes", type=int, help="N nodes named lab01.. instead of the layout's")
        if name in ("up", "status"):
            p.add_argument("--json", action="store_true")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        root = LabPaths.of(args.dir).root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chdir(root)
        asyncio.run(serve(root, args.layout, args.nodes))
        return 0
    if args.command == "down":
        print("lab stopped" if lab_down(args.dir) else "lab was not running")
        return 0
    info = lab_up(args.dir, args.layout, args.nodes) if args.command == "up" else lab_status(args.dir)
    if args.json:
        print(json.dumps(info.to_json() if info else {"running": False}, indent=1))
    elif info is None:
        print("lab is not running")
    else:
        print(f"lab running: pid {info.pid}, {len(info.nodes)} nodes, config {info.config_path}")
        for n in info.nodes:
            print(f"  {n.name:<8} {n.host}:{n.port:<6} {n.pool:<8} {'up' if n.up else 'DOWN'}")
    return 0 if info is not None else 3


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    try:
        return _run(args)
    except FtError as exc:
        print(f"{exc.title}: {exc}", file=sys.stderr)
        return exc.exit_code
