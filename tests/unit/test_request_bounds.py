"""Every request is bounded in bytes and in work before it costs anything (issue 40): a job spec's size, its lists,
its texts, an array's tasks times its spec, node set text and the names it makes; the checks are linear; a user's
queued jobs are capped by default. Each refusal names the key at fault."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ftconsole.cli import main
from ftconsole.scheduler.decide.quotas import Limits, submit_refusal
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.spec.arrayspec import MAX_TASKS
from ftconsole.scheduler.spec.config import ClusterConfig, QuotaSettings
from ftconsole.scheduler.spec.jobspec import (
    MAX_AFTER,
    MAX_ARRAY_BYTES,
    MAX_BATCH_TASKS,
    MAX_ENV,
    MAX_ENV_NAME_BYTES,
    MAX_SPEC_BYTES,
    MAX_SPECS,
    MAX_TEXT_BYTES,
    JobSpec,
    parse_jobspec,
)
from ftconsole.scheduler.spec.nodesets import (
    MAX_NAME_CHARS,
    MAX_NODESET_TEXT,
    expand_nodeset,
    nodeset_name_width,
    nodeset_size,
)
from ftconsole.scheduler.spec.sharingspec import DEFAULT_QUEUED_JOBS, UserLimits
from ftconsole.scheduler.spec.specbase import unique

BASE: dict[str, Any] = {"name": "big", "command": "python train.py"}


def refusal(spec: dict[str, Any]) -> tuple[str, str]:
    """(the key path pydantic names, or '' for the whole spec; the message) of the one problem of a new spec."""
    with pytest.raises(ValidationError) as err:
        JobSpec.from_json(spec)
    (problem,) = err.value.errors(include_url=False)
    return ".".join(str(p) for p in problem["loc"]), problem["msg"].removeprefix("Value error, ")


# -- a new spec, over each bound: the key and what is wrong ------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ({"command": "x" * (MAX_TEXT_BYTES + 1)}, "command", f"{MAX_TEXT_BYTES + 1:,} bytes, over the limit of 16,384"),
        ({"command": "é" * (MAX_TEXT_BYTES // 2 + 1)}, "command", "16,386 bytes, over the limit of 16,384"),  # bytes
        (
            {"command": None, "type": "batch", "tasks": [{"name": "a", "command": "x" * 20_000, "output": "a"}]},
            "tasks.0.command",
            "20,000 bytes, over the limit",
        ),
        (
            {
                "command": None,
                "type": "batch",
                "tasks": [{"name": f"t{i}", "command": "x", "output": "o"} for i in range(MAX_BATCH_TASKS + 1)],
            },
            "tasks",
            "1,001 tasks, over the limit of 1,000: split the batch into several jobs",
        ),
        ({"hooks": {"before": "y" * 16_385}}, "hooks.before", "16,385 bytes, over the limit of 16,384"),
        ({"env": {f"V{i}": "1" for i in range(MAX_ENV + 1)}}, "env", "1,001 variables, over the limit of 1,000"),
        ({"env": {"V" * (MAX_ENV_NAME_BYTES + 1): "1"}}, "env", "is 257 bytes, over the limit of 256"),
        ({"env": {"BIG": "v" * 20_000}}, "env", "BIG: its value is 20,000 bytes, over the limit of 16,384"),
        ({"after": {"ok": list(range(1, MAX_AFTER + 2))}}, "after.ok", "1,001 job ids, over the limit of 1,000"),
        ({"after": {"failed": list(range(1, 5000))}}, "after.failed", "4,999 job ids, over the limit of 1,000"),
        ({"specs": [f"s{i}" for i in range(MAX_SPECS + 1)]}, "specs", "65 specs, over the limit of 64"),
        ({"node_names": "n" * 300 + "[1-10]"}, "node_names", "makes names of up to 304 characters, over the limit"),
        ({"node_names": "n[1-20000]"}, "node_names", "names up to 20,000 nodes, over the limit of 10,000"),
    ],
)
def test_each_key_over_its_bound_is_refused_by_name(extra: dict[str, Any], key: str, message: str) -> None:
    where, said = refusal({**BASE, **extra})
    assert where == key and message in said, (where, said)


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        # the whole spec, naming the key that takes most of it
        ({"env": {f"V{i}": "x" * 10_000 for i in range(8)}}, "env", f"over the limit of {MAX_SPEC_BYTES:,} (64 KiB)"),
        ({"after": {"ok": list(range(1, 80_001))}}, "after", "the job spec is 468,"),
        ({"node_names": "n" * 100_000 + "[1-10000]"}, "node_names", "and this key takes 100,011 of them"),
        # an array's tasks times its spec: 10,000 tasks of a 10 kB spec
        ({"array": "0-9999", "env": {"X": "y" * 10_000}}, "array", "10,000 tasks of a spec of 10,"),
        ({"array": 5000, "env": {"X": "y" * 15_000}}, "", ""),  # one task, index 5000: small
    ],
)
def test_the_size_of_a_spec_and_of_an_array_is_refused_naming_the_key(
    extra: dict[str, Any], key: str, message: str
) -> None:
    spec = {**BASE, **extra}
    if not key:
        assert JobSpec.from_json(spec).array == "5000"
        return
    where, said = refusal(spec)
    assert where == "" and said.startswith(f"{key}: ") and message in said, said  # the model's own: key first


def test_an_array_within_its_bound_is_taken() -> None:
    per_task = MAX_ARRAY_BYTES // MAX_TASKS  # 6,710 bytes each for 10,000 tasks
    spec = {**BASE, "array": f"0-{MAX_TASKS - 1}%8", "env": {"X": "y" * (per_task - 400)}}
    assert JobSpec.from_json(spec).array == f"0-{MAX_TASKS - 1}%8"
    with pytest.raises(ValidationError, match="over the limit of 67,108,864"):
        JobSpec.from_json({**spec, "env": {"X": "y" * per_task}})


def test_a_spec_at_its_bounds_is_taken() -> None:
    spec = JobSpec.from_json(
        {
            **BASE,
            "command": "x" * MAX_TEXT_BYTES,
            "env": {f"V{i}": "1" for i in range(MAX_ENV)},
            "after": {"ok": list(range(1, MAX_AFTER + 1))},
        }
    )
    assert len(spec.env) == MAX_ENV and len(spec.after.ok if spec.after else []) == MAX_AFTER


def test_a_stored_spec_is_read_back_whatever_the_bounds() -> None:
    """A job accepted before the bounds (a longer `after`, a larger env) still loads: the store stays readable."""
    old = {**BASE, "command": "x" * 20_000, "after": {"ok": list(range(1, 3000))}, "env": {"A": "v" * 70_000}}
    spec = JobSpec.from_stored(old)
    assert len(spec.after.ok if spec.after else []) == 2999
    with pytest.raises(ValidationError):
        JobSpec.from_json(old)


# -- from a YAML file: file, line and key; the CLI exits 2 ---------------------------------------------------------


def test_a_spec_file_over_its_bound_names_the_line_and_key() -> None:
    text = "name: big\ncommand: x\nenv:\n" + "".join(f"  V{i}: '{'x' * 100}'\n" for i in range(700))
    with pytest.raises(ConfigError) as err:
        parse_jobspec(text, "job.yaml")
    (problem,) = err.value.problems
    assert (problem.file, problem.line, problem.path) == ("job.yaml", 3, "env")
    assert "the job spec is 7" in problem.message and "over the limit of 65,536 (64 KiB)" in problem.message
    array = "name: big\ncommand: x\narray: 0-9999\nenv: {X: '" + "y" * 8000 + "'}\n"
    with pytest.raises(ConfigError) as err:
        parse_jobspec(array, "job.yaml")
    assert [(p.line, p.path) for p in err.value.problems] == [(3, "array")]


@pytest.mark.parametrize("command", ["submit", "predict"])
def test_the_cli_refuses_an_oversized_spec_with_exit_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: big\ncommand: x\nafter:\n  ok: [" + ", ".join(str(i) for i in range(1, 2002)) + "]\n")
    assert main([command, str(job)]) == 2  # before any scheduler is asked
    err = capsys.readouterr().err
    assert f"{job}:4: after.ok: 2,001 job ids, over the limit of 1,000" in err, err


# -- the checks are linear ---------------------------------------------------------------------------------------


def test_unique_is_one_pass() -> None:
    many = list(range(200_000))
    started = time.perf_counter()
    assert unique(many) is many
    assert time.perf_counter() - started < 1.0  # a count per entry: hours
    repeated = r"each entry must be unique: 1, 10, 11, 12, 2, .*, 7 and 2 more given more than once"
    with pytest.raises(ValueError, match=repeated):
        unique(list(range(1, 13)) * 2)


# -- node sets: text, count and name length before anything is expanded ---------------------------------------------


@pytest.mark.parametrize(
    ("expr", "width"),
    [
        ("gpu01", 5),
        ("gpu[01-16]", 8),  # 'gpu' and the range as written, '01-16': no name it makes is longer
        ("gpu[001-128]-ib[0-3]", 16),
        ("a,bbbb,cc", 4),
        ("n[1-8,10-20/2]", 8),  # the longest range as written
        ("n[1-5", 5),  # an unclosed bracket: all its text
        ("x" * 250 + "[1-2]", 253),
    ],
)
def test_the_longest_name_is_bounded_from_the_text(expr: str, width: int) -> None:
    assert nodeset_name_width(expr) == width
    if expr.count("[") == expr.count("]"):
        assert max(len(name) for name in expand_nodeset(expr)) <= width


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("n" * 100_000 + "[1-10000]", "is 100,009 bytes long, over the limit of 65,536"),
        ("n" * 1000 + "[1-10000]", f"makes names of up to 1,007 characters, over the limit of {MAX_NAME_CHARS}"),
        ("n1," * 30_000, "is 90,000 bytes long, over the limit of 65,536"),
        ("é" * 40_000, "is 80,000 bytes long"),  # bytes, not characters
    ],
)
def test_a_node_set_too_long_or_making_too_long_names_is_refused_before_expanding(expr: str, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ValueError, match=re.escape(message)):
        expand_nodeset(expr)
    assert time.perf_counter() - started < 1.0  # expanded, the first made 1 GB in 5 s


def test_a_node_set_at_the_text_bound_is_counted() -> None:
    expr = ",".join(f"gpu{i:05d}" for i in range(MAX_NODESET_TEXT // 9))
    assert len(expr) <= MAX_NODESET_TEXT and nodeset_size(expr) == MAX_NODESET_TEXT // 9
    assert len(expand_nodeset(expr)) == MAX_NODESET_TEXT // 9


# -- the cap of queued jobs per user ---------------------------------------------------------------------------------


def limits_of(settings: QuotaSettings) -> Any:
    def found(key: tuple[str, str]) -> Limits | None:
        limits = settings.limits(key)
        return None if limits is None else Limits(**limits.model_dump())

    return found


@pytest.mark.parametrize(
    ("quotas", "queued", "count", "refused"),
    [
        ({}, 0, MAX_TASKS, None),  # an array of the most tasks fits, alone
        ({}, 1, MAX_TASKS, "user ann has a quota of 10,000 queued jobs (1 queued now): the array's 10,000 tasks"),
        ({}, DEFAULT_QUEUED_JOBS, 1, "user ann is at its quota of 10,000 queued jobs"),
        ({"default_user": {"gpus": 8}}, DEFAULT_QUEUED_JOBS, 1, "user ann is at its quota of 10,000 queued jobs"),
        ({"users": {"ann": {"gpus": 8}}}, DEFAULT_QUEUED_JOBS, 1, "user ann is at its quota of 10,000 queued jobs"),
        ({"default_user": {"queued_jobs": 50}}, 50, 1, "user ann is at its quota of 50 queued jobs"),
        ({"default_user": {"queued_jobs": None}}, 10**6, 1, None),  # null: no limit
        ({"users": {"ann": {"queued_jobs": None}}}, 10**6, 1, None),
        ({"default_user": None}, 10**6, 1, None),  # no user limits at all
    ],
)
def test_a_users_queued_jobs_are_capped_by_default(
    quotas: dict[str, Any], queued: int, count: int, refused: str | None
) -> None:
    settings = ClusterConfig.model_validate({"state_dir": "s", "quotas": quotas}).quotas
    assert settings is not None
    found = submit_refusal("p", "ann", limits_of(settings), {("user", "ann"): queued}, count=count)
    assert found == refused if refused is None else refused in (found or ""), found


def test_with_quotas_a_user_has_the_cap_of_queued_jobs_by_default() -> None:
    config = ClusterConfig.model_validate({"state_dir": "s", "quotas": {"projects": {"p": {"gpus": 8}}}})
    assert config.quotas is not None and config.quotas.limits(("user", "x")) == UserLimits()
    assert UserLimits().queued_jobs == DEFAULT_QUEUED_JOBS == 10_000 and config.quotas.limits(("project", "x")) is None
    assert QuotaSettings().default_user == UserLimits()
