"""The `ftconsole` command line.

Every listing takes `--json`. Errors go to stderr as `ftconsole: <title>: <message>`; with `--json` the same
error is also printed on stdout as one JSON document, `{"error": {"title", "message", "exit_code"}}` (and
`problems` for an invalid config or job spec, `usage` for a usage error), so that a script reading stdout
always gets JSON. Exit codes: 0 ok, 1 a failure, 2 bad input (usage, an invalid config or job spec, an object
that does not exist), 3 no scheduler running (scheduler/errors.py). `probe` exits 1 when a probed node is not
healthy, so it works as a check in scripts and monitoring. `probe`, `nodes`, `drain` and `resume` go through
the scheduler when one serves, and act on the store from this process when none does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import shlex
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import ftconsole
from ftconsole import (
    alloc_cli,
    check_cli,
    completion,
    debug_cli,
    jobs_cli,
    reservation_cli,
    run_cli,
    shell_cli,
    state_cli,
    topology_cli,
    usage_cli,
)
from ftconsole.format import (
    error_document,
    error_text,
    print_json,
    print_table,
    printable,
    problem_json,
)
from ftconsole.jobs_cli import find_config, loaded_config
from ftconsole.nodes_cli import cmd_drain, cmd_nodes, cmd_probe, cmd_repair, cmd_resume
from ftconsole.scheduler.errors import ConfigError, FtError, Problem, StoreError, UsageError
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import (
    DEFAULT_CONFIG_PATHS,
    LoadedConfig,
    format_duration,
    load_config,
    sort_problems,
)
from ftconsole.scheduler.spec.configcheck import check_config
from ftconsole.scheduler.spec.detectspec import HANG_WINDOW_S
from ftconsole.scheduler.store.files import STORE_FILE, read_cluster_id
from ftconsole.scheduler.store.schema import SCHEMA_VERSION

PROG = "ftconsole"
# the console's views (tui.app.VIEWS)
CONSOLE_VIEWS = ("jobs", "nodes", "alerts", "events", "cluster", "map", "timeline", "shares")


# The keys of a lab layout (config/lab.yaml, ftconsole/lab) that a cluster config does not have: a config check
# that finds them is pointed at the layout, and says so.
LAB_KEYS = frozenset({"cluster", "faults", "prefix", "base_port", "driver_version"})
LAB_NODE_KEYS = frozenset({"gpus", "gpu_model", "memory_mib"})


def version() -> str:
    """The installed distribution's version, else (run from a source tree) the package's own."""
    return str(ftconsole.__version__)


class VersionAction(argparse.Action):
    """`--version`, reading the version only when asked (argparse's own wants it when the parser is built)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        sys.stdout.write(f"{PROG} {version()}\n")
        parser.exit()


def data_file(name: str) -> str:
    """A file shipped in the package, under ftconsole/data/."""
    return resources.files("ftconsole").joinpath("data", name).read_text(encoding="utf-8")


# -- commands ------------------------------------------------------------------------------------------------


def cmd_config_example(args: argparse.Namespace) -> int:
    sys.stdout.write(data_file("cluster.example.yaml"))
    return 0


def cmd_config_systemd(args: argparse.Namespace) -> int:
    """The shipped unit file, for this install: User, ExecStart (this ftconsole, the config found)."""
    script = Path(sys.executable).parent / "ftconsole"
    program = [str(script)] if script.is_file() else [sys.executable, "-m", "ftconsole.cli"]
    try:
        config = str(find_config(args.config).resolve())
    except ConfigError:
        config = "/etc/ftconsole/cluster.yaml"
        print(
            f"{PROG}: note: no cluster config found: the unit names /etc/ftconsole/cluster.yaml; put it there, or "
            "give --config FILE",
            file=sys.stderr,
        )
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    out = []
    for line in data_file("ftconsole.service").splitlines():
        if line.startswith("User="):
            line = f"User={user}"
        elif line.startswith("ExecStart="):
            line = "ExecStart=" + shlex.join([*program, "--config", config, "serve"])
        out.append(line)
    print("\n".join(out))
    return 0


def cmd_config_reload(args: argparse.Namespace) -> int:
    """The running scheduler applies the config file as it is now (admins only): what changed, or every reason
    why nothing did (exit 2). The scheduler is found at the socket the file names, read as far as it reads: an
    invalid file is still sent there, for the scheduler's own answer."""
    from ftconsole.scheduler.errors import NotRunning
    from ftconsole.scheduler.serve.client import connect
    from ftconsole.scheduler.serve.reload import reload_lines
    from ftconsole.scheduler.spec.config import config_problems

    path = find_config(args.config)
    invalid: ConfigError | None = None
    try:
        loaded = load_config(path)
    except ConfigError as exc:  # the keys that read (state_dir, api.socket) still say where the scheduler is
        invalid = exc
        data, marks, _ = yamlfile.load_all(path)
        _, best, _ = config_problems(data, marks, str(path))
        loaded = LoadedConfig(cluster=best, file=path.resolve())

    async def go() -> dict[str, Any]:
        client = await connect(loaded)
        if client is None:
            if invalid is not None:
                raise invalid
            raise NotRunning(
                f"no scheduler answers on {loaded.socket_path}: the config is read when `ftconsole serve` starts. "
                "If api.socket or state_dir changed in the file, the scheduler still answers at the old socket, and "
                "those changes need a restart (`systemctl restart ftconsole`)"
            )
        try:
            return dict(await client.call("reload"))
        finally:
            await client.close()

    doc = asyncio.run(go())
    if args.json:
        print_json(doc)
    else:
        print("\n".join(reload_lines(doc)), file=sys.stdout if doc["applied"] else sys.stderr)
    return 0 if doc["applied"] else 2


def _lab_layout(path: Path, problems: list[Problem]) -> list[Problem] | None:
    """The problem to give when `path` is a lab layout, which a cluster config's keys cannot read."""
    unknown = [p.path for p in problems if p.message.startswith("unknown key")]
    if not any(key in LAB_KEYS or key.rsplit(".", 1)[-1] in LAB_NODE_KEYS for key in unknown):
        return None
    message = (
        "this is a lab layout (the fake nodes `ftconsole lab up --layout FILE` starts), not a cluster config. "
        "The lab writes its own cluster config, cluster.yaml in its folder (`ftconsole lab status` names it); "
        "for a real cluster start from `ftconsole config example`"
    )
    return [Problem(str(path), None, "", message)]


def cmd_config_check(args: argparse.Namespace) -> int:
    """Every problem in one run, by line; exit 2 with any. With --json, one document whatever is found."""
    path: Path | None = None
    notes: list[str] = []
    store = None
    try:
        path = find_config(args.config, stdin=True)
        checked = check_config(path)  # ConfigError only where nothing can be read past it (YAML syntax)
        problems, notes = checked.problems, checked.notes
        if not any(p.path == "state" or p.path.startswith("state.") for p in problems):
            try:
                store = _store_check(checked.loaded, path, checked.marks)
            except ConfigError as exc:  # the PostgreSQL server: not reached, or its store too new
                problems = sort_problems([*problems, *exc.problems])
    except ConfigError as exc:
        problems = exc.problems
    if problems or store is None or path is None:
        problems = (_lab_layout(path, problems) if path is not None else None) or problems
        if args.json:
            found = [problem_json(p) for p in problems]
            print_json({"ok": False, "file": str(path) if path else None, "problems": found, "notes": notes})
            return 2
        raise ConfigError(problems)
    loaded = checked.loaded
    nodes = loaded.cluster.node_list()
    pools = sorted({n.pool for n in nodes})
    store_line, cluster_id, summary = store
    settings = loaded.cluster.scheduler
    if args.json:
        print_json(
            {"file": str(path), "ok": True, "nodes": len(nodes), "pools": pools, "problems": [],
             "cluster_id": cluster_id, "run_as": settings.run_as, "state": summary, "notes": notes}
        )  # fmt: skip
        return 0
    print(f"{path}: ok ({len(nodes)} nodes in {len(pools)} pool(s): {', '.join(pools) or '-'})")
    print(store_line)
    made = "none yet: made with the store when the scheduler first starts"
    print(f"cluster id: {cluster_id or made} (run folders: {settings.run_root}/<cluster id>/...)")
    if settings.run_as == "submitter":
        print("jobs run as: the user who submitted them (the SSH account switches to it: root, or sudo)")
    else:
        print("jobs run as: the SSH account (run_as: ssh_user)")
    print(_hang_line(loaded.cluster.probes.interval))
    for note in notes:
        print(f"note: {note}")
    return 0


def _store_check(loaded: LoadedConfig, path: Path, marks: yamlfile.Marks) -> tuple[str, str | None, dict[str, Any]]:
    """The store's line of `config check`, its cluster id and its JSON. A PostgreSQL store (`state.url`) is
    asked for: a server that cannot be reached, or a store newer than this ftconsole, is a problem of that key."""
    state = loaded.cluster.state
    if state is None:
        file = loaded.state_dir / STORE_FILE
        return f"state: SQLite, {file}", read_cluster_id(file), {"engine": "sqlite", "path": str(file)}
    from ftconsole.scheduler.store.postgres import redact, server_facts  # asyncpg: only where it is used

    url = redact(state.url)
    try:
        facts = asyncio.run(server_facts(state.url))
        newer = facts.schema_version is not None and facts.schema_version > SCHEMA_VERSION
        if newer:
            raise StoreError(f"the store at {url} has schema version {facts.schema_version}, newer than this "
                             f"ftconsole ({SCHEMA_VERSION}): upgrade ftconsole")  # fmt: skip
    except StoreError as exc:
        line = yamlfile.line_of(marks, ("state", "url"))
        raise ConfigError([Problem(str(path), line, "state.url", str(exc))]) from None
    made = " (no store there yet: the scheduler makes it when it first starts)" if facts.schema_version is None else ""
    summary = {"engine": "postgresql", "url": url, "server_version": facts.version}
    return f"state: PostgreSQL {facts.version}, {url}{made}", facts.cluster_id, summary


def _hang_line(interval: float) -> str:
    """What hang detection can see with these probes: a window needs 3 GPU samples (docs/jobs.md, Hung jobs)."""
    least = format_duration(3 * interval)
    if 3 * interval <= HANG_WINDOW_S:
        default = format_duration(HANG_WINDOW_S)
        return f"hang detection: windows of {least} or more (3 probe intervals); the default {default}"
    return (
        f"hang detection: only for jobs that set hang_detect to {least} or more: probes.interval "
        f"{format_duration(interval)} is too far apart for the default {format_duration(HANG_WINDOW_S)} window"
    )


SHARED_HOME_HELP = "every node's HOME is <lab>/home, as with an NFS /home (default: the layout's shared_home)"


def cmd_lab(args: argparse.Namespace) -> int:
    from ftconsole import lab

    lab_dir = Path(args.dir).expanduser() if args.dir else lab.default_lab_dir()
    if args.lab_command == "fault":
        report = lab.lab_fault(lab_dir, args.node, lab.fault_from_args(args))
        if args.json:
            print_json(report.to_json())
        else:
            print(report.message)
        return 0
    if args.lab_command == "up":
        layout = Path(args.layout) if args.layout else None
        info = lab.lab_up(lab_dir, layout, nodes=args.nodes, shared_home=args.shared_home)
        if args.json:
            print_json(info.to_json())
        else:
            print(f"lab running: {len(info.nodes)} nodes, pid {info.pid}")
            print(f"config: {info.config_path}")
            print(f"try:    ftconsole --config {info.config_path} probe")
        return 0
    if args.lab_command == "down":
        was_running = lab.lab_down(lab_dir)
        if args.json:
            print_json({"stopped": was_running})
        else:
            print("lab stopped" if was_running else "lab was not running")
        return 0
    status = lab.lab_status(lab_dir)
    if args.json:
        print_json(status.to_json() if status else {"running": False})
    elif status is None:
        print("lab is not running")
    else:
        print(f"lab running: pid {status.pid}, config {status.config_path}")
        print_table(
            ["NODE", "PORT", "UP"],
            [[n.name, n.port, "yes" if n.up else "NO"] for n in status.nodes],
        )
    return 0 if status is not None or args.lab_command != "status" else 3


def cmd_demo(args: argparse.Namespace) -> int:
    from ftconsole import lab

    lab_dir = Path(args.dir).expanduser() if args.dir else lab.default_lab_dir()
    info = lab.lab_up(lab_dir, None, nodes=args.nodes, shared_home=args.shared_home)
    print(f"lab cluster up: {len(info.nodes)} nodes; config {info.config_path}", file=sys.stderr)
    loaded = load_config(info.config_path)
    if not args.no_demo_jobs:  # queued now; the console's scheduler places them (ftconsole/lab/demo.py)
        from ftconsole.lab.demo import queue_demo_jobs

        print(asyncio.run(queue_demo_jobs(loaded)).summary(), file=sys.stderr)
    return run_console(loaded, readonly=False, theme=args.theme, view=args.view or "map")


def cmd_console(args: argparse.Namespace) -> int:
    return run_console(loaded_config(args), readonly=args.readonly, theme=args.theme, view=args.view or "jobs")


def run_console(loaded: LoadedConfig, *, readonly: bool, theme: str | None = None, view: str = "jobs") -> int:
    from ftconsole.tui.app import ConsoleApp

    theme = theme or os.environ.get("FTCONSOLE_THEME") or None
    app = ConsoleApp(loaded, readonly=readonly, theme=theme, view=view)
    app.run()
    return app.return_code or 0


# -- parser --------------------------------------------------------------------------------------------------


class BadUsage(UsageError):
    """A usage error argparse found (an unknown command or option, a missing argument), raised to main()."""

    def __init__(self, message: str, prog: str, usage: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.usage = usage


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are raised (BadUsage) instead of printed with an exit, so that main()
    reports them as every other error: argparse's text on stderr, and with --json a JSON document on stdout."""

    def error(self, message: str) -> NoReturn:
        raise BadUsage(message, self.prog, self.format_usage())


def build_parser() -> argparse.ArgumentParser:
    config_help = f"cluster config (default: $FTCONSOLE_CONFIG, else the first of {', '.join(DEFAULT_CONFIG_PATHS)})"
    # --config is accepted before or after the command; the subcommand's copy must not reset it to None.
    common = Parser(add_help=False)
    common.add_argument("--config", "-c", metavar="FILE", default=argparse.SUPPRESS, help=config_help)
    listing = Parser(add_help=False)
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")

    parser = Parser(
        prog=PROG,
        description="Fault-tolerant job scheduler and on-call console for SSH-only GPU clusters. "
        "Without a command, opens the console.",
    )
    parser.add_argument("--config", "-c", metavar="FILE", help=config_help)
    parser.add_argument("--version", action=VersionAction, help="show the version and exit")
    parser.add_argument("--readonly", action="store_true", help="console: hide every action that changes anything")
    parser.add_argument(
        "--theme",
        help="console: light or dark (default: $FTCONSOLE_THEME, else dark), or a Textual theme name; "
        "NO_COLOR=1 turns colour off",
    )
    parser.add_argument("--view", choices=CONSOLE_VIEWS, help="console: the view it opens on (default: jobs)")
    parser.set_defaults(func=cmd_console)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    config = sub.add_parser("config", help="work with the cluster config")
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    check = config_sub.add_parser(
        "check", parents=[common, listing], help="validate the config, list every problem (--config -: from stdin)"
    )
    check.set_defaults(func=cmd_config_check)
    example = config_sub.add_parser("example", help="print the annotated example config, every key with its default")
    example.set_defaults(func=cmd_config_example)
    systemd = config_sub.add_parser(
        "systemd", parents=[common], help="print a systemd unit that runs `ftconsole serve` (run it as its user)"
    )
    systemd.set_defaults(func=cmd_config_systemd)
    reload = config_sub.add_parser(
        "reload",
        parents=[common, listing],
        help="apply the changed config file to the running scheduler, without a restart (admins; as SIGHUP does)",
    )
    reload.set_defaults(func=cmd_config_reload)

    probe = sub.add_parser("probe", parents=[common, listing], help="run the node checks now and print results")
    probe.add_argument("nodeset", nargs="?", help="node set expression, e.g. gpu[01-04] (default: all)")
    probe.add_argument("--checks", metavar="LIST", help="comma-separated check names (default: all)")
    probe.set_defaults(func=cmd_probe)

    nodes = sub.add_parser("nodes", parents=[common, listing], help="node list with state, reasons, GPUs, last checks")
    nodes.add_argument("nodeset", nargs="?", help="node set expression (default: all)")
    nodes.add_argument("--state", action="append", metavar="STATE", help="only nodes in this state (repeatable)")
    nodes.set_defaults(func=cmd_nodes)

    drain = sub.add_parser("drain", parents=[common, listing], help="take nodes out of scheduling, with a reason")
    drain.add_argument("node", help="node name or node set expression")
    drain.add_argument("--reason", "-r", required=True, help="why (shown to everyone on call)")
    drain.set_defaults(func=cmd_drain)

    resume = sub.add_parser("resume", parents=[common, listing], help="put drained or isolated nodes back")
    resume.add_argument("node", help="node name or node set expression")
    resume.add_argument(
        "--test", action="store_true",
        help="run the node tests (node_tests in the config) first: resume only those that pass; exit 1 if any fails",
    )  # fmt: skip
    resume.set_defaults(func=cmd_resume)

    repair = sub.add_parser("repair", parents=[common, listing], help="reset, reboot, test and resume out-of-service "
                            "nodes (repair in the config)")  # fmt: skip
    repair.add_argument("node", help="node name or node set expression (drained or isolated nodes)")
    repair.add_argument("--wait", action="store_true", help="until each repair ends; exit 1 unless all are back")
    repair.set_defaults(func=cmd_repair)

    jobs_cli.add_parsers(sub, common, listing)
    check_cli.add_parser(sub, [common, listing])
    shell_cli.add_parser(sub, common)
    alloc_cli.add_parser(sub, common)
    run_cli.add_parser(sub, common)
    debug_cli.add_parser(sub, [common, listing])
    usage_cli.add_parser(sub, [common, listing])
    reservation_cli.add_parser(sub, [common, listing])
    state_cli.add_parser(sub, [common, listing])
    topology_cli.add_parser(sub, [common, listing])
    completion.add_parser(sub, parser)

    lab_parser = sub.add_parser("lab", help="the local lab cluster (SSH servers on 127.0.0.1)")
    lab_sub = lab_parser.add_subparsers(dest="lab_command", metavar="SUBCOMMAND", required=True)
    for name, text in (("up", "start the lab"), ("down", "stop the lab"), ("status", "is the lab running")):
        p = lab_sub.add_parser(name, parents=[listing], help=text)
        p.add_argument("--dir", help="lab folder (default: $FTCONSOLE_LAB_DIR or ~/.local/state/ftconsole/lab)")
        if name == "up":
            p.add_argument("--nodes", type=int, help="number of nodes (default: the layout's)")
            p.add_argument("--layout", metavar="FILE", help="lab layout file (default: config/lab.yaml)")
            p.add_argument("--shared-home", action=argparse.BooleanOptionalAction, help=SHARED_HOME_HELP)
        p.set_defaults(func=cmd_lab)
    # the same arguments as `python -m ftconsole.lab fault` (ftconsole/lab/command.py: add_fault_arguments)
    fault = lab_sub.add_parser("fault", parents=[listing], help="inject a fault into a lab node, or heal it")
    fault.add_argument("node", metavar="NODE", help="the lab node, e.g. lab03")
    fault.add_argument("--dir", help="lab folder (default: $FTCONSOLE_LAB_DIR or ~/.local/state/ftconsole/lab)")
    what = fault.add_mutually_exclusive_group(required=True)
    what.add_argument("--kill", action="store_true", help="the node dies: SSH refused, its processes killed")
    what.add_argument("--hang", action="store_true", help="the node freezes: SSH silent, its processes stopped")
    what.add_argument("--gpu-ecc", type=int, metavar="GPU", help="GPU index GPU reports an uncorrectable ECC error")
    what.add_argument("--reboot", action="store_true", help="the node reboots: processes killed, a new boot id")
    what.add_argument("--heal", action="store_true", help="undo all of these: SSH answers, processes go on, ECC clear")
    fault.set_defaults(func=cmd_lab)

    demo = sub.add_parser("demo", help="start the local lab cluster and open the console on it")
    demo.add_argument("--dir", help="lab folder")
    demo.add_argument("--nodes", type=int, help="number of nodes (default: the layout's 8)")
    demo.add_argument("--shared-home", action=argparse.BooleanOptionalAction, help=SHARED_HOME_HELP)
    demo.add_argument(
        "--no-demo-jobs",
        action="store_true",
        help="do not queue the demo jobs (ftconsole/lab/demo_jobs/; by default they are queued unless a job of "
        "yours named demo-* is still queued or running)",
    )
    demo.add_argument(
        "--view", choices=CONSOLE_VIEWS, default=argparse.SUPPRESS, help="the view the console opens on (default: map)"
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in (argv[: argv.index("--")] if "--" in argv else argv)  # until the arguments are parsed
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        as_json = bool(getattr(args, "json", False))
        if getattr(args, "nodes", None) is not None and isinstance(args.nodes, int) and args.nodes < 1:
            parser.error("--nodes must be at least 1")
        return int(args.func(args))
    except FtError as exc:
        try:
            return report_error(exc, as_json=as_json)
        except BrokenPipeError:  # `... --json | head`: the reader went before the error was printed whole
            return _reader_gone(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone(1)


def _reader_gone(code: int) -> int:
    """stdout's reader closed it (`| head`): nothing more is written there, and no traceback at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def report_error(exc: FtError, *, as_json: bool) -> int:
    """The error on stderr as text (a usage error as argparse prints it), and with --json on stdout as one
    document too; its exit code."""
    if isinstance(exc, BadUsage):
        document = error_document(exc, usage=exc.usage.strip())
        text = f"{exc.usage.rstrip()}\n{exc.prog}: error: {printable(exc)}"
    else:
        document, text = error_document(exc), error_text(exc)
    if as_json:
        print_json(document)
        sys.stdout.flush()
    print(text, file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
