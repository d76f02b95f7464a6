"""The command line of the lab server: ``python -m ftconsole.lab serve|up|down|status|fault``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from ftconsole.lab.faults import Fault
from ftconsole.lab.files import LabPaths
from ftconsole.lab.records import LabInfo
from ftconsole.lab.server import lab_down, lab_fault, lab_status, lab_up, serve
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
            p.add_argument(
                "--shared-home",
                action=argparse.BooleanOptionalAction,
                help="every node's HOME is <lab>/home, as with an NFS /home (default: the layout's shared_home)",
            )
        if name in ("up", "status"):
            p.add_argument("--json", action="store_true")
    fault = sub.add_parser("fault", help="inject a fault into a lab node, or heal it")
    fault.add_argument("--dir", help="lab folder (default: $FTCONSOLE_LAB_DIR or ~/.local/state/ftconsole/lab)")
    fault.add_argument("--json", action="store_true")
    add_fault_arguments(fault)
    return parser


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """NODE and exactly one of --kill, --hang, --gpu-ecc GPU, --reboot, --heal (`ftconsole lab fault` too)."""
    parser.add_argument("node", metavar="NODE", help="the lab node, e.g. lab03")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--kill", action="store_true", help="the node dies: SSH refused, its processes killed")
    what.add_argument("--hang", action="store_true", help="the node freezes: SSH silent, its processes stopped")
    what.add_argument("--gpu-ecc", type=int, metavar="GPU", help="GPU index GPU reports an uncorrectable ECC error")
    what.add_argument("--reboot", action="store_true", help="the node reboots: processes killed, a new boot id")
    what.add_argument("--heal", action="store_true", help="undo all of these: SSH answers, processes go on, ECC clear")


def fault_from_args(args: argparse.Namespace) -> Fault:
    if args.kill:
        return Fault.kill()
    if args.hang:
        return Fault.hang()
    if args.gpu_ecc is not None:
        return Fault.gpu_ecc(args.gpu_ecc)
    if args.reboot:
        return Fault.reboot()
    return Fault.heal()


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        root = LabPaths.of(args.dir).root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chdir(root)
        asyncio.run(serve(root, args.layout, args.nodes, args.shared_home))
        return 0
    if args.command == "fault":
        report = lab_fault(args.dir, args.node, fault_from_args(args))
        print(json.dumps(report.to_json(), indent=1) if args.json else report.message)
        return 0
    if args.command == "down":
        print("lab stopped" if lab_down(args.dir) else "lab was not running")
        return 0
    if args.command == "up":
        info: LabInfo | None = lab_up(args.dir, args.layout, args.nodes, shared_home=args.shared_home)
    else:
        info = lab_status(args.dir)
    if args.json:
        print(json.dumps(info.to_json() if info else {"running": False}, indent=1))
    elif info is None:
        print("lab is not running")
    else:
        homes = ", one home shared by all nodes" if info.shared_home else ""
        print(f"lab running: pid {info.pid}, {len(info.nodes)} nodes{homes}, config {info.config_path}")
        for n in info.nodes:
            state = "up" if n.up else "HUNG" if n.state == "hung" else "DOWN"
            print(f"  {n.name:<8} {n.host}:{n.port:<6} {n.pool:<8} {state}")
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
