"""`ftconsole check JOB.yaml`: check a job spec offline, every problem in one run, writing nothing.

The spec is validated as `submit` validates it (`parse_jobspec`). Against the cluster config, where one is found
(`--config`, $FTCONSOLE_CONFIG or the usual places), it is then checked as the scheduler admits a submitted job
(`Rules.admissible`: named specs and nodes, priority, project and its members, the hang window, debug, data_prep,
mounts), for the user running the command; and against the config's quotas, for what no later state can change:
a job larger than a GPU quota, an array with more tasks than a queued-jobs quota. What needs the scheduler's
state (jobs queued and running, reservations, dependencies, limits an admin set with `ftconsole quota`) is not
checked: `submit` checks it. No store is opened and no scheduler is asked: nothing is written, anywhere.

Exit 0: no problem; 2: problems (listed by line, or with --json as one document).
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ftconsole.format import print_json
from ftconsole.jobs_cli import find_config
from ftconsole.scheduler.errors import ConfigError, FtError, JobSpecError, Problem
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import LoadedConfig, load_config, sort_problems

# the job spec's models and the scheduler's admission are imported by `check` when it runs: every other command
# builds this one's parser, and starts sooner without them
if TYPE_CHECKING:
    from ftconsole.scheduler.decide import quotas
    from ftconsole.scheduler.spec.jobspec import JobSpec

STDIN_NAME = "<stdin>"


def _caller() -> Any:
    from ftconsole.scheduler.caller import Caller

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), user=user)


def _key_named(message: str, marks: yamlfile.Marks) -> tuple[Any, ...]:
    """The key of the job file that a refusal names (the longest found as a word in it), else ()."""
    text = re.sub(r"^job [^:]*: ", "", message)  # "job NAME: ..." names the job, not a key
    keys = sorted((loc for loc in marks if loc), key=lambda loc: -len(yamlfile.dotted(loc)))
    for loc in keys:
        if re.search(rf"(?<![\w.]){re.escape(yamlfile.dotted(loc))}(?!\w)", text):
            return loc
    return ()


def admission_problems(spec: JobSpec, loaded: LoadedConfig, file: str, marks: yamlfile.Marks) -> list[Problem]:
    """What the scheduler would refuse of `spec` at submit, by its config alone; none of it writes."""
    from ftconsole.scheduler.decide import quotas
    from ftconsole.scheduler.decide.requests import candidates
    from ftconsole.scheduler.nodeops import ClusterService
    from ftconsole.scheduler.rules import Rules
    from ftconsole.scheduler.spec import arrayspec

    def problem(loc: tuple[Any, ...], message: str) -> Problem:
        return Problem(file, yamlfile.line_of(marks, loc) if loc else None, yamlfile.dotted(loc), message)

    caller = _caller()
    # the scheduler's own admission; it reads the config only: no store, no transport, no placer
    rules = Rules(ClusterService(loaded, cast(Any, None), cast(Any, None)), placer=cast(Any, None))
    refusals = rules.refusals(caller, spec, spec.priority.value)  # every one, not only the first
    out = [problem(_key_named(exc.message, marks), exc.message) for exc in refusals]
    config = loaded.cluster
    try:
        gpus = spec.nodes * max(c.gpus_per_node for c in candidates(spec, config))
    except FtError:  # a spec the config does not have: said above
        return out
    count = 1 if spec.array is None else len(arrayspec.parse(spec.array).indexes)

    def limits_of(key: quotas.Key) -> quotas.Limits | None:
        if config.quotas is None or not quotas.applies(key, config.projects):
            return None
        found = config.quotas.limits(key)
        return None if found is None else quotas.Limits(**found.model_dump())

    for key in (("project", spec.project), ("user", caller.user)):
        limits = limits_of(key)
        why = quotas.over(key, limits, quotas.InUse(), quotas.InUse(), gpus) if limits is not None else None
        if why is not None:
            where = next((k for k in ("gpus_per_node", "specs", "spec", "nodes") if (k,) in marks), "nodes")
            out.append(problem((where,), f"job {spec.name} takes {gpus} GPUs at once, more than a quota allows "
                                         f"({why}): it would never start"))  # fmt: skip
    refused = quotas.submit_refusal(spec.project, caller.user, limits_of, {}, count=count)
    if refused is not None:
        out.append(problem(("array",) if spec.array is not None else (), f"a submit would be refused: {refused}"))
    return out


def _config(args: argparse.Namespace) -> tuple[LoadedConfig | None, list[Problem], str | None]:
    """The cluster config found (None: none anywhere), its problems, and its path."""
    try:
        path = find_config(args.config)
    except ConfigError:  # none in any of the places searched: the spec is checked alone
        return None, [], None
    try:
        return load_config(path), [], str(path)
    except ConfigError as exc:
        return None, exc.problems, str(path)


def cmd_check(args: argparse.Namespace) -> int:
    from ftconsole.scheduler.spec.jobspec import parse_jobspec

    file = STDIN_NAME if args.job == "-" else args.job
    problems: list[Problem] = []
    spec: JobSpec | None = None
    marks: yamlfile.Marks = {}
    try:
        text = sys.stdin.read() if args.job == "-" else yamlfile.read(Path(args.job))
        marks = yamlfile.parse_all(text, file)[1]
        spec = parse_jobspec(text, file)
    except ConfigError as exc:  # the spec's problems, all of them (a JobSpecError), or a file that cannot be read
        problems += exc.problems
    loaded, config_problems, config_path = _config(args)
    if spec is not None and loaded is not None:
        problems += admission_problems(spec, loaded, file, marks)
    notes = []
    if config_path is None:
        notes.append("no cluster config found: the spec was checked alone (its named specs, pools, project and "
                     "quotas were not); give --config FILE to check it against one")  # fmt: skip
    # the job file's first, then the config's; each by line
    problems = sort_problems([p for p in problems if p.file == file]) + sort_problems(config_problems)
    if args.json:
        print_json({"ok": not problems, "file": file, "config": config_path, "job": spec.name if spec else None,
                    "problems": [_problem_json(p) for p in problems], "notes": notes})  # fmt: skip
        return 2 if problems else 0
    if problems:
        raise JobSpecError(problems) if any(p.file == file for p in problems) else ConfigError(problems)
    assert spec is not None
    against = f"against {config_path}" if config_path is not None else "alone"
    print(f"{file}: ok (job {spec.name}, checked {against})")
    for note in notes:
        print(f"note: {note}")
    return 0


def _problem_json(problem: Problem) -> dict[str, Any]:
    return {"file": problem.file, "line": problem.line, "key": problem.path, "message": problem.message}


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        parents=parents,
        help="check a job spec offline, against the cluster config where one is found; writes nothing",
        description="Validates a job spec as `submit` does and, where a cluster config is found, as the scheduler "
        "admits it (named specs, nodes, pools, project, priority, quotas that no later state can change), for "
        "you. Every problem in one run; exit 2 with any. Nothing is written and no scheduler is asked: what "
        "depends on the queue (dependencies, reservations, queued-job counts) is checked at submit.",
    )
    p.add_argument("job", metavar="JOB.yaml", help="the job spec; - reads it from stdin")
    p.set_defaults(func=cmd_check)
