"""The kept debugging environment, from tables: until when a failed job's folders stay and its GPUs are held,
what the config and the spec accept, what `show` and the shell say, and how the console marks a hold."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError

from ftconsole.scheduler import debugenv
from ftconsole.scheduler.decide.jobs import Job, JobStatus
from ftconsole.scheduler.spec.config import ClusterConfig, DebugSettings, SchedulerSettings
from ftconsole.scheduler.spec.jobspec import JobSpec
from ftconsole.scheduler.ssh.shell import gone_message
from ftconsole.tui import clusterrows, rows

H = 3600.0
ENDED = 1_000_000.0
DEBUG = DebugSettings()  # retention 4 h, max_retention 7 d, max_hold 4 h
RUNS = SchedulerSettings()  # run_retention 3 d


def failed(debug: dict[str, Any] | None = None, **fields: Any) -> Job:
    spec = JobSpec.model_validate({"name": "j", "command": "false", **({"debug": debug} if debug else {})})
    base = {"status": JobStatus.ERROR, "ended": ENDED, "attempt": 1}
    return Job(
        id=7, name="j", owner="u", uid=1000, spec=spec, priority="normal", project="default", access="none",
        submitted=ENDED - 60, **{**base, **fields},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("case", "job", "settings", "kept", "held"),
    [
        ("the cluster's default", failed(), DEBUG, ENDED + 4 * H, None),
        ("the job's own retention", failed({"retention": "1h"}), DEBUG, ENDED + H, None),
        (
            "held for its retention",
            failed({"retention": "2h", "hold_nodes": True}),
            DEBUG,
            ENDED + 2 * H,
            ENDED + 2 * H,
        ),
        (
            "a hold ends at max_hold",
            failed({"retention": "1d", "hold_nodes": True}),
            DEBUG,
            ENDED + 24 * H,
            ENDED + 4 * H,
        ),
        ("a stored retention over the max", failed({"retention": "30d"}), DEBUG, ENDED + 7 * 24 * H, None),
        ("no hold where max_hold is 0", failed({"hold_nodes": True}), DebugSettings(max_hold=0), ENDED + 4 * H, None),
        ("released", failed({"hold_nodes": True}, debug_released=ENDED + 60), DEBUG, ENDED + 4 * H, None),
        ("deleted", failed({"hold_nodes": True}, deleted=True), DEBUG, ENDED + 4 * H, None),
        ("succeeded: nothing kept for debugging", failed(status=JobStatus.SUCCEEDED), DEBUG, None, None),
        ("stopped by its user", failed({"hold_nodes": True}, status=JobStatus.STOPPED), DEBUG, None, None),
        ("failed before any attempt", failed(attempt=0), DEBUG, None, None),
    ],
)
def test_kept_and_held_until(
    case: str, job: Job, settings: DebugSettings, kept: float | None, held: float | None
) -> None:
    assert debugenv.kept_until(job, settings) == kept, case
    assert debugenv.held_until(job, settings) == held, case


def test_env_until_is_the_later_of_debug_and_run_retention() -> None:
    assert debugenv.env_until(failed(), DEBUG, RUNS) == ENDED + 3 * 24 * H  # run retention is longer
    short = SchedulerSettings(run_retention=60)
    assert debugenv.env_until(failed(), DEBUG, short) == ENDED + 4 * H
    assert debugenv.env_until(failed(status=JobStatus.SUCCEEDED), DEBUG, short) == ENDED + 60
    assert debugenv.env_until(failed(), DEBUG, SchedulerSettings(run_retention=0)) is None  # kept forever


def test_view_says_kept_then_gone_and_drops_a_hold_that_is_over() -> None:
    job = failed({"retention": "2h", "hold_nodes": True})
    short = SchedulerSettings(run_retention=60)
    early = debugenv.view(job, DEBUG, short, ENDED + 60)
    assert early == {
        "kept_until": ENDED + 2 * H, "env_until": ENDED + 2 * H, "env": "kept", "hold_nodes": True,
        "held_until": ENDED + 2 * H, "released": None,
    }  # fmt: skip
    late = debugenv.view(job, DEBUG, short, ENDED + 3 * H)
    assert late is not None and late["env"] == "gone" and late["held_until"] is None
    assert debugenv.view(failed(status=JobStatus.SUCCEEDED), DEBUG, short, ENDED) is None


def test_debug_settings_and_spec_keys_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"retention \(2d\) is over max_retention \(1d\)"):
        ClusterConfig.model_validate({"debug": {"retention": "2d", "max_retention": "1d"}})
    with pytest.raises(ValidationError, match=r"debug\.hold"):
        JobSpec.model_validate({"name": "j", "command": "false", "debug": {"hold": True}})
    with pytest.raises(ValidationError, match="retention"):
        JobSpec.model_validate({"name": "j", "command": "false", "debug": {"retention": "0s"}})


def _shown(job: Job, now: float, runs: SchedulerSettings = RUNS) -> dict[str, Any]:
    return {
        **job.to_json(now),
        "attempts": [{"number": 1, "ended": job.ended}],
        "debug": debugenv.view(job, DEBUG, runs, now),
        "env_until": debugenv.env_until(job, DEBUG, runs),
    }


def test_the_shell_says_whether_an_environment_is_gone_and_what_kept_it() -> None:
    short = SchedulerSettings(run_retention=60)
    job = failed({"retention": "1h"})
    shown = _shown(job, ENDED, short)
    run = {"attempt": 1}
    gone = gone_message(shown, run, short, ENDED + 2 * H)
    assert "the environment of job 7 attempt 1 is gone: it was kept until" in gone
    assert "(debug.retention, as the job failed)" in gone
    there = gone_message(shown, run, short, ENDED + 60)
    assert "it should be kept until" in there and "removed by hand" in there
    ok = dataclasses.replace(job, status=JobStatus.SUCCEEDED)
    assert "(scheduler.run_retention)" in gone_message(_shown(ok, ENDED), run, RUNS, ENDED + 4 * 24 * H)
    off = SchedulerSettings(run_retention=0)
    assert gone_message(_shown(ok, ENDED, off), run, off, ENDED) == ""  # nothing removes it


def test_the_console_marks_gpus_held_for_debugging() -> None:
    node = {
        "name": "n1", "state": "healthy", "gpus": [{"index": 0}, {"index": 1}],
        "held": [{"gpu": 1, "job": 8}], "held_for_debug": [{"gpu": 0, "job": 7, "until": ENDED}],
    }  # fmt: skip
    cells = rows.node_cells(node, ENDED)
    assert "2/2" in cells and "7:debug,8" in cells
    cluster_node = {"name": "n1", "state": "healthy", "gpus": [{"index": 0, "job": 7, "held_for_debug_until": ENDED}]}
    assert clusterrows.cluster_node_cells(cluster_node)[-2] == "0:7(debug)"


def test_config_check_says_what_hang_detection_can_see() -> None:
    from ftconsole.cli import _hang_line

    assert _hang_line(60) == "hang detection: windows of 3m or more (3 probe intervals); the default 30m"
    assert _hang_line(3600).startswith("hang detection: only for jobs that set hang_detect to 3h or more")
