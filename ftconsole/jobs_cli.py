"""The job commands of the CLI: serve, submit, predict, jobs, show, stop, delete, clone, priority, extend, scale,
release, logs, events, cluster, alerts. They talk to the scheduler through `scheduler.serve.client`, over its socket.

With no scheduler serving, a command that changes a job (`WRITE_OPS`: submit, stop, delete, clone, priority,
extend, scale, release) is refused, saying how to start one, unless `--local` asks for it on purpose: then the
change is written to the store from this process and waits for a scheduler (`submit --local --wait` runs one
here until the job ends). Listings, and the alert and node commands that only change the store, read and write
the store directly when no scheduler serves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ftconsole import starts_cli
from ftconsole.format import age, node_count, print_json, print_table, printable, step_line
from ftconsole.scheduler.decide.arrays import summary
from ftconsole.scheduler.decide.usertext import clean_json
from ftconsole.scheduler.errors import ConfigError, NotRunning, Problem, UsageError
from ftconsole.scheduler.serve.api import WRITE_OPS
from ftconsole.scheduler.serve.client import Client, connect, local_client, scheduler_here
from ftconsole.scheduler.spec import config
from ftconsole.scheduler.spec.config import DEFAULT_CONFIG_PATHS, LoadedConfig, format_duration, load_config

if TYPE_CHECKING:  # the command line starts without the scheduler's spec models (test_import_hygiene)
    from ftconsole.scheduler.spec.jobspec import JobSpec

T = TypeVar("T")

STDIN = Path("/dev/stdin")

# --local's help: the job commands' (WRITE_OPS), and submit's
_LOCAL_HELP = (
    "with no scheduler serving, do it anyway from this process: the change is written to the store and takes "
    "effect when a scheduler starts (`ftconsole serve` or the console)"
)
_LOCAL_SUBMIT_HELP = (
    "with no scheduler serving, queue the job anyway from this process: it waits queued until a scheduler starts; "
    "with --wait, a scheduler runs in this process until the job ends (a one-off local run)"
)

RECENT = "1d"  # `jobs` without a window: the active jobs and those ended this long ago at most


def find_config(explicit: str | None, *, stdin: bool = False) -> Path:
    """The config file, found as `scheduler.config.find_config` finds it; `-` reads stdin where `stdin` allows."""
    if explicit == "-":
        if not stdin:
            raise UsageError("--config -: only `config check` reads a config from stdin; give a file")
        return STDIN
    try:
        return config.find_config(explicit)
    except ConfigError:  # none in any of the places searched
        where = ", ".join(DEFAULT_CONFIG_PATHS)
        message = (
            f"no cluster config found: pass --config FILE, set FTCONSOLE_CONFIG, or create one of {where}. "
            "`ftconsole config example` prints an annotated one, every key with its default, to start from: "
            "mkdir -p ~/.config/ftconsole && ftconsole config example > ~/.config/ftconsole/cluster.yaml "
            "(then set its nodes). For the local lab cluster run `ftconsole lab up`"
        )
        raise ConfigError([Problem("<config>", None, "", message)]) from None


def loaded_config(args: argparse.Namespace) -> LoadedConfig:
    return load_config(find_config(args.config))


def not_serving(loaded: LoadedConfig, command: str) -> NotRunning:
    """The refusal of a job command with no scheduler to act on it: where none answers, and how to start one."""
    local = (
        "or add --local to queue it anyway (it waits until a scheduler starts; with --wait, one runs in this "
        "process until the job ends)"
        if command == "submit"
        else "or add --local to record the change in the store anyway (it takes effect when a scheduler starts)"
    )
    return NotRunning(
        f"no scheduler is serving {loaded.state_dir} (nothing answers on {loaded.socket_path}), so nothing would "
        f"act on this {command}. Start one with `ftconsole serve` (as a service: `ftconsole config systemd`) or "
        f"open the console (`ftconsole`), then run it again; {local}"
    )


def _with_client(args: argparse.Namespace, op: str, action: Callable[[Client], Awaitable[T]]) -> T:
    """`action` with the scheduler's client; with none serving, on the store in this process, where `op` may."""
    loaded = loaded_config(args)

    async def go() -> T:
        client = await connect(loaded)
        if client is not None:
            try:
                return await action(client)
            finally:
                await client.close()
        if op in WRITE_OPS:
            if not getattr(args, "local", False):
                raise not_serving(loaded, op)
            print(
                f"ftconsole: warning: no scheduler is serving {loaded.state_dir} (--local): the change is recorded "
                "and takes effect when `ftconsole serve` or the console starts",
                file=sys.stderr,
            )
        async with local_client(loaded) as local:
            return await action(local)

    return asyncio.run(go())


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _shape(job: dict[str, Any]) -> str:
    gpus = job["gpus_per_node"]
    what = "/".join(job["specs"]) if job["specs"] else f"{gpus} GPU" if gpus is not None else "?"
    return f"{node_count(job)}x{what}"


def _runtime(job: dict[str, Any]) -> str:
    used = age(job["runtime_s"]) if job["runtime_s"] is not None else "-"
    limit = job["max_runtime_s"]
    return f"{used}/{format_duration(limit)}" if limit else used


# -- serve -----------------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from ftconsole.scheduler.serve.daemon import serve_until_signalled

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    loaded = loaded_config(args)
    print(f"ftconsole serve: state {loaded.state_dir}, API {loaded.socket_path}", file=sys.stderr)
    asyncio.run(serve_until_signalled(loaded))
    return 0


# -- submit, predict -------------------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.spec.jobspec import load_jobspec

    spec = load_jobspec(Path(args.job))  # ConfigError: every problem with its line, exit 2
    if args.begin is not None:
        spec = with_begin(spec, args.begin)
    loaded = loaded_config(args)

    async def submit(client: Client) -> tuple[dict[str, Any], dict[str, Any] | None]:
        job = await client.call("submit", spec=spec.to_json(), **({"hold": True} if args.hold else {}))
        if not args.wait:
            return job, None
        if not args.json:
            print(job["id"], flush=True)
        final = job
        # an array: each of its tasks in turn; it succeeded when every task did
        tasks = (await client.call("show", job=job["id"]))["tasks"] if job.get("array_id") is not None else None
        failed = None
        for task in tasks or [job]:
            async for state in client.stream("wait", job=task["id"]):
                final = state
                if not args.json:
                    detail = f": {state['message']}" if state["message"] else ""
                    print(
                        printable(f"job {state.get('ref') or state['id']} {state['status']}{detail}"), file=sys.stderr
                    )
            if final["status"] != "succeeded" and failed is None:
                failed = final
        if tasks is not None:  # the array's outcome: the first task that did not succeed, else the array's id
            final = {**(failed or final), "id": job["id"]}
        return job, final

    async def go() -> tuple[dict[str, Any], dict[str, Any] | None]:
        client = await connect(loaded)
        if client is not None:
            try:
                return await submit(client)
            finally:
                await client.close()
        if not args.local:
            raise not_serving(loaded, "submit")
        if args.wait:  # a one-off local run: a scheduler in this process until the job ends
            print(
                f"ftconsole: no scheduler is serving {loaded.state_dir}: running one in this process until the job "
                "ends (--local); if this command is stopped, the job waits for the next scheduler",
                file=sys.stderr,
            )
            async with scheduler_here(loaded) as here:
                return await submit(here)
        print(
            f"ftconsole: warning: no scheduler is serving {loaded.state_dir} (--local): the job waits queued until "
            "`ftconsole serve` or the console starts",
            file=sys.stderr,
        )
        async with local_client(loaded) as local:
            return await submit(local)

    job, final = asyncio.run(go())
    shown = final or job
    if args.json:
        out = {"id": shown["id"], "status": shown["status"], "message": shown["message"]}
        if job.get("array_id") is not None:
            out |= {"array": job["array"]}
        print_json(out)
    elif not args.wait:
        print(shown["id"])
    if final is None:
        return 0
    return 0 if final["status"] == "succeeded" else 1


def with_begin(spec: JobSpec, when: str) -> JobSpec:
    """The spec with `begin:` from `--begin WHEN` (over the file's); UsageError (exit 2) naming what is wrong."""
    from ftconsole.scheduler.spec.begin import from_command_line
    from ftconsole.scheduler.spec.jobspec import JobSpec

    try:
        return JobSpec.from_json({**spec.to_json(), "begin": from_command_line(when, time.time())})
    except ValueError as exc:
        raise UsageError(f"--begin {when!r}: {exc}") from None


def cmd_predict(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.spec.jobspec import load_jobspec

    spec = load_jobspec(Path(args.job))
    decision = _with_client(args, "predict", lambda c: c.call("predict", spec=spec.to_json()))
    if args.json:
        print_json({"job": spec.name, **decision})
    elif decision["starts_now"]:
        where = ", ".join(f"{n['node']} (GPUs {','.join(map(str, n['gpus']))})" for n in decision["nodes"])
        print(f"{spec.name}: starts now on {where}")
    elif decision["cause"] in ("dependency", "reservation"):  # not in the queue's order until then
        print(f"{spec.name}: would wait: {printable(decision['reason'])}")
    else:
        ahead = f"; ahead: jobs {', '.join(decision['ahead'])}" if decision["ahead"] else ""
        print(
            printable(f"{spec.name}: would wait (queue position {decision['position']}): {decision['reason']}{ahead}")
        )
    return 0


# -- listing ---------------------------------------------------------------------------------------------------


def cmd_jobs(args: argparse.Namespace) -> int:
    from ftconsole.usage_cli import window

    # the active jobs and those ended in the last day, unless a window or --all says otherwise (squeue's, not
    # sacct's: the history is kept for history.jobs, and reading all of it is what --all is for)
    recent = None if args.all or args.since is not None or args.until is not None else RECENT
    since, until = window(args, default_since=recent)
    filters = {"status": args.status, "name": args.name, "owner": args.owner, "spec": args.spec, "output": args.output}
    if since is not None or until is not None:  # only then: a scheduler from before them refuses no argument
        filters |= {"since": since, "until": until}
    if args.start:  # squeue --start: the queued jobs, each with when it is expected to start
        return starts_cli.print_starts(args, *_with_client(args, "jobs", lambda c: starts_cli.read(c, filters)))
    jobs = _with_client(args, "jobs", lambda c: c.call("jobs", **filters))
    if args.json:
        print_json(jobs)
        return 0
    rows = []
    for group in _grouped(jobs, expand=args.expand):
        j = group[0]
        if len(group) == 1 and (args.expand or j.get("array_id") is None):
            status = j["status"] + (" (stopping)" if j["stop_reason"] and j["status"] == "running" else "")
            rows.append([j.get("ref") or j["id"], j["name"], j["owner"], status, j["priority"], j["mode"], _shape(j),
                         _runtime(j), j["message"] or "-"])  # fmt: skip
            continue
        # an array: one row, its tasks counted by status (--expand: a row each); the message of its first
        # queued task (why the array waits), else of its first
        waiting = next((t for t in group if t["status"] == "queued"), j)
        rows.append([f"{j['array_id']}[{j['array']}]", j["name"], j["owner"], summary(t["status"] for t in group),
                     "/".join(dict.fromkeys(t["priority"] for t in group)), j["mode"], _shape(j), "-",
                     waiting["message"] or "-"])  # fmt: skip
    print_table(["ID", "NAME", "OWNER", "STATUS", "PRIORITY", "MODE", "SHAPE", "RUNTIME", "MESSAGE"], rows)
    return 0


def _grouped(jobs: list[dict[str, Any]], *, expand: bool) -> list[list[dict[str, Any]]]:
    """The jobs in order, the tasks of each array together at the place of its first one (each alone with
    `expand`)."""
    if expand:
        return [[j] for j in jobs]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for j in jobs:
        key = ("array", j["array_id"]) if j.get("array_id") is not None else ("job", j["id"])
        groups.setdefault(key, []).append(j)
    return list(groups.values())


def cmd_show(args: argparse.Namespace) -> int:
    job = _with_client(args, "show", lambda c: c.call("show", job=args.job))
    if args.json:
        print_json(job)
        return 0
    job = clean_json(job)  # its message, conditions and runs' errors hold a job user's words: no control character
    print(f"job {job['id']}: {job['name']}  ({job['status']})")
    for key in ("owner", "priority", "project", "access", "mode", "message", "exit_code"):
        if job.get(key) not in (None, ""):
            print(f"  {key + ':':<11} {job[key]}")
    print(f"  {'shape:':<11} {_shape(job)}")
    print(f"  {'runtime:':<11} {_runtime(job)}")
    if job.get("goodput") and job["goodput"]["goodput"] is not None:
        print(f"  {'goodput:':<11} {job['goodput']['text']}")
    print(f"  {'submitted:':<11} {_when(job['submitted'])}")
    print(f"  {'command:':<11} {job['spec'].get('command', '(batch tasks)')}")
    if job.get("tasks"):
        print(f"  {'array:':<11} {job['array_id']}[{job['array']}]: {summary(t['status'] for t in job['tasks'])}")
        print(f"  {'task:':<11} {job['ref']} (FT_ARRAY_INDEX={job['array_index']})")
    for attempt in job["attempts"]:
        result = attempt["result"] or "in progress"
        print(f"  attempt {attempt['number']} (port {attempt['master_port']}): {result}")
        for run in attempt["runs"]:
            how = run["state"]
            if run["state"] == "exited":
                how += f" ({run['signal']})" if run["signal"] else f" (code {run['exit_code']})"
            gpus = ",".join(map(str, run["gpus"]))
            print(f"    rank {run['rank']}  {run['node']}  GPUs {gpus or '-'}  {how}  {run['run_dir']}")
    for step in job.get("steps") or ():
        print(f"  step {step_line(step)}")
    print("  conditions:")
    for c in job["conditions"]:
        print(f"    {_when(c['time'])}  {c['type']:<10} {c['message']}")
    return 0


# -- actions ---------------------------------------------------------------------------------------------------


def _print_jobs(jobs: list[dict[str, Any]], args: argparse.Namespace, verb: str) -> int:
    if args.json:
        print_json(jobs)
    else:
        for j in jobs:
            stopping = " (stopping)" if j["status"] == "running" and j["stop_reason"] else ""
            print(f"job {j.get('ref') or j['id']} {j['name']}: {verb}, {j['status']}{stopping}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    jobs = _with_client(args, "stop", lambda c: c.call("stop", jobs=args.jobs))
    return _print_jobs(jobs, args, "stop requested")


def cmd_delete(args: argparse.Namespace) -> int:
    jobs = _with_client(args, "delete", lambda c: c.call("delete", jobs=args.jobs))
    return _print_jobs(jobs, args, "deleted")


def cmd_hold(args: argparse.Namespace) -> int:
    jobs = _with_client(args, "hold", lambda c: c.call("hold", jobs=args.jobs))
    if args.json:
        print_json(jobs)
    for j in [] if args.json else jobs:
        held = f"held by {j['held']['by']}" if j["held"] else "not held"
        print(f"job {j.get('ref') or j['id']} {j['name']}: {held}, {j['status']}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    jobs = _with_client(args, "release", lambda c: c.call("release", jobs=args.jobs))
    if args.json:
        print_json(jobs)
    for j in [] if args.json else jobs:
        what = "GPUs held for debugging released" if j["status"] != "queued" else "hold released"
        print(f"job {j.get('ref') or j['id']} {j['name']}: {what}, {j['status']}")
    return 0


def cmd_clone(args: argparse.Namespace) -> int:
    job = _with_client(args, "clone", lambda c: c.call("clone", job=args.job))
    if args.json:
        print_json({"id": job["id"], "status": job["status"], "cloned_from": job["cloned_from"]})
    else:
        print(job["id"])
    return 0


def cmd_priority(args: argparse.Namespace) -> int:
    job = _with_client(args, "priority", lambda c: c.call("priority", job=args.job, level=args.level))
    return _print_jobs([job], args, f"priority {job['priority']}")


def cmd_extend(args: argparse.Namespace) -> int:
    job = _with_client(args, "extend", lambda c: c.call("extend", job=args.job, duration=args.duration))
    return _print_jobs([job], args, f"max_runtime now {format_duration(job['max_runtime_s'])}")


def cmd_scale(args: argparse.Namespace) -> int:
    job = _with_client(args, "scale", lambda c: c.call("scale", job=args.job, nodes=args.nodes))
    return _print_jobs([job], args, f"scaling to {job['nodes']} node(s)")


def cmd_logs(args: argparse.Namespace) -> int:
    if args.json and args.follow:
        raise UsageError(
            "logs --json prints one JSON document once the log is read; --follow prints lines as they come: "
            "give one or the other"
        )

    async def go(client: Client) -> dict[str, Any] | None:
        if not args.json:
            async for chunk in client.stream(
                "logs", job=args.job, rank=args.rank, attempt=args.attempt, follow=args.follow, tail=args.tail
            ):
                sys.stdout.write(chunk)
                sys.stdout.flush()
            return None
        job = await client.call("show", job=args.job)  # which attempt and node the lines come from
        attempts = [a for a in job["attempts"] if args.attempt is None or a["number"] == args.attempt]
        attempt = attempts[-1]["number"] if attempts else args.attempt
        runs = [r for a in attempts[-1:] for r in a["runs"] if r["rank"] == args.rank]
        chunks = [c async for c in client.stream("logs", job=args.job, rank=args.rank, attempt=attempt, tail=args.tail)]
        return {
            "job": job["id"],
            "attempt": attempt,
            "rank": args.rank,
            "node": runs[0]["node"] if runs else None,
            "lines": "".join(chunks).splitlines(),
        }

    document = _with_client(args, "logs", go)
    if document is not None:
        print_json(document)
    return 0


def cmd_job_events(args: argparse.Namespace) -> int:
    events = _with_client(args, "events", lambda c: c.call("events", job=args.job, node=args.node, limit=args.limit))
    if args.json:
        print_json(events)
        return 0
    rows = [[_when(e["time"]), e["node"] or e["job"] or "-", e["kind"], e["message"]] for e in events]
    print_table(["TIME", "OBJECT", "KIND", "MESSAGE"], rows)
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    view = _with_client(args, "cluster", lambda c: c.call("cluster"))
    if args.json:
        print_json(view)
        return 0
    rows = []
    for n in view["nodes"]:
        holders: list[int | str] = sorted({g["job"] for g in n["gpus"] if g["job"] is not None})
        if any(g.get("private") for g in n["gpus"]):
            holders.append("private")
        mem = f"{n['mem_total_mib'] / 1024:.0f}G" if n["mem_total_mib"] else "-"
        rows.append(
            [
                n["name"],
                n["state"],
                n["pool"],
                n["os"] or "-",
                n["kernel"] or "-",
                n["cpus"] or "-",
                mem,
                n["driver_version"] or "-",
                f"{n['gpus_used']}/{n['gpus_total']} {(n['gpu_model'] or '').replace('NVIDIA ', '')}".strip(),
                ",".join(map(str, holders)) or "-",
                n.get("image_runtime") or "-",
            ]
        )
    print_table(["NODE", "STATE", "POOL", "OS", "KERNEL", "CPUS", "MEM", "DRIVER", "GPUS USED", "JOBS", "IMAGES"], rows)
    print()
    print_table(
        ["SPEC", "SHAPE", "NODES", "FREE NODES", "FREE GPUS", "STATE"],
        [
            [s["spec"], f"{s['gpus_per_node']} GPU", s["nodes"], s["nodes_free"], s["gpus_free"], s["state"]]
            for s in view["specs"]
        ],
    )
    if view["queued_demand"]:
        print()
        print_table(["QUEUED DEMAND", "GPUS"], sorted(view["queued_demand"].items()))
    good = view.get("goodput") or {}
    if good.get("goodput") is not None:
        print(f"\ngoodput over the last {age(good['until'] - good['since'])}: {good['text']}")
    return 0


# -- parser ----------------------------------------------------------------------------------------------------


def add_parsers(sub: Any, common: argparse.ArgumentParser, listing: argparse.ArgumentParser) -> None:
    from ftconsole.alerts_cli import cmd_alerts

    parents = [common, listing]
    p = sub.add_parser("serve", parents=[common], help="run the scheduler without a UI (for systemd)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("submit", parents=parents, help="queue a job from a YAML spec; prints its id")
    p.add_argument("job", metavar="JOB.yaml", help="job spec file")
    p.add_argument("--wait", action="store_true", help="wait for the job to end; exit 0 only if it succeeded")
    p.add_argument("--local", action="store_true", help=_LOCAL_SUBMIT_HELP)
    p.add_argument("--begin", metavar="WHEN", help="not before this time: +2h, 16:00, 2026-11-28T16:00 (its begin:)")
    p.add_argument("--hold", action="store_true", help="held from the start: not placed until `release` (sbatch -H)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("predict", parents=parents, help="would a job start now, or its queue position and why")
    p.add_argument("job", metavar="JOB.yaml", help="job spec file")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("jobs", parents=parents, help="the queue, the running jobs, those ended lately (--all: all)")
    p.add_argument("--status", "--state", action="append", metavar="S", help="only this status (repeatable)")
    p.add_argument("--name", help="only names containing this")
    p.add_argument("--owner", help="only this user's jobs")
    p.add_argument("--spec", help="only jobs asking for this node spec")
    p.add_argument("--output", help="only jobs whose output path contains this")
    p.add_argument("--since", metavar="WHEN", help="only jobs not ended before this (a date, or a time ago: 7d)")
    p.add_argument("--until", metavar="WHEN", help="only jobs submitted before this (a date, or a time ago)")
    p.add_argument(
        "--all",
        action="store_true",
        help=f"every job the store keeps (default: the active ones and those ended in the last {RECENT})",
    )
    p.add_argument("--expand", action="store_true", help="a row for each task of an array (12[7]), not one per array")
    p.add_argument("--start", action="store_true", help="the queued jobs' expected starts (if jobs run to their limit)")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("show", parents=parents, help="a job with its attempts, runs and conditions")
    p.add_argument("job", metavar="JOB", help="job id")
    p.set_defaults(func=cmd_show)

    for name, func, text in (
        ("stop", cmd_stop, "stop jobs (SIGTERM to each run's process group, SIGKILL after the grace period)"),
        ("delete", cmd_delete, "delete jobs (stopping them first); their events stay in the timeline"),
        ("hold", cmd_hold, "keep queued jobs from being placed until released (an array: its queued tasks)"),
        ("release", cmd_release, "release held jobs, or the GPUs failed jobs hold for debugging (debug.hold_nodes)"),
    ):
        p = sub.add_parser(name, parents=parents, help=text)
        p.add_argument("jobs", metavar="JOB", nargs="+", help="job ids")
        p.add_argument("--local", action="store_true", help=_LOCAL_HELP)
        p.set_defaults(func=func)

    p = sub.add_parser("clone", parents=parents, help="submit a copy of a job; prints the new id")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--local", action="store_true", help=_LOCAL_HELP)
    p.set_defaults(func=cmd_clone)

    p = sub.add_parser("priority", parents=parents, help="change a queued job's priority")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("level", choices=["normal", "urgent", "very-urgent"], help="new level (very-urgent: admins)")
    p.add_argument("--local", action="store_true", help=_LOCAL_HELP)
    p.set_defaults(func=cmd_priority)

    p = sub.add_parser("extend", parents=parents, help="lengthen a job's max_runtime")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("duration", help="how much longer, e.g. 30m or 2h")
    p.add_argument("--local", action="store_true", help=_LOCAL_HELP)
    p.set_defaults(func=cmd_extend)

    p = sub.add_parser("scale", parents=parents, help="resize an elastic job (fault_tolerance.elastic) to NODES nodes")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("nodes", metavar="NODES", type=int, help="the new number of nodes, within min_nodes..max_nodes")
    p.add_argument("--local", action="store_true", help=_LOCAL_HELP)
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("logs", parents=parents, help="a job's output.log, from its node")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--rank", type=int, default=0, help="which rank (node) of the job (default 0)")
    p.add_argument("--attempt", type=int, help="which attempt (default: the latest)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends (not with --json)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("events", parents=parents, help="the cluster's timeline, or one job's")
    p.add_argument("job", metavar="JOB", nargs="?", help="only this job's events")
    p.add_argument("--node", help="only events of this node")
    p.add_argument("--limit", type=int, default=100, help="at most this many, newest last (default 100)")
    p.set_defaults(func=cmd_job_events)

    p = sub.add_parser("cluster", parents=parents, help="nodes with what holds each GPU, specs idle or tight, demand")
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser(
        "alerts",
        parents=parents,
        help="open alerts; `alerts ack ID...` / `alerts resolve ID...` to acknowledge or resolve them",
        usage="%(prog)s [--all] [--json] | %(prog)s {ack,resolve} ID [ID ...] [--json]",
    )
    p.add_argument("action", nargs="?", choices=["ack", "resolve"], help="acknowledge (on it) or resolve (over)")
    p.add_argument("ids", metavar="ID", nargs="*", help="alert ids, as the listing shows them")
    p.add_argument("--all", action="store_true", help="resolved alerts too")
    p.set_defaults(func=cmd_alerts)
