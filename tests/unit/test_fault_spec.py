"""`fault_tolerance` keys of a job spec that the recovery policy reads: what is refused, and why."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ftconsole.scheduler.spec.jobspec import JobSpec


def spec(**ft: Any) -> JobSpec:
    return JobSpec.from_json({"name": "j", "command": "train", "fault_tolerance": ft})


def test_restart_backoff_and_time_limit_are_read_as_durations() -> None:
    ft = spec(max_restarts=3, restart_backoff="10s", restart_time_limit="2h").fault_tolerance
    assert (ft.restart_backoff, ft.restart_time_limit) == (10.0, 7200.0)
    assert spec(retries=1, restart_time_limit="30m").fault_tolerance.restart_time_limit == 1800.0
    assert spec().fault_tolerance.restart_backoff == 0.0


@pytest.mark.parametrize(
    ("ft", "message"),
    [
        ({"restart_backoff": "10s"}, "restart_backoff (how long a restart waits) needs max_restarts or retries"),
        ({"restart_time_limit": "1h"}, "restart_time_limit (how long restarts are allowed) needs max_restarts"),
        ({"max_restarts": 1, "restart_time_limit": "0s"}, "restart_time_limit"),
        ({"max_restarts": 1, "restart_backoff": "-1s"}, "restart_backoff"),
        ({"retries": 4}, "retries"),
    ],
)
def test_what_restarts_nothing_is_refused(ft: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=r"fault_tolerance") as caught:
        spec(**ft)
    assert message in str(caught.value)


def test_checkpoint_resume_names_a_catchable_signal_and_an_absolute_folder() -> None:
    resume = spec(checkpoint_resume={"max_resumes": 2, "signal": "USR2", "dir": "~/ckpt"}).fault_tolerance
    assert resume.checkpoint_resume is not None
    assert (resume.checkpoint_resume.signal, resume.checkpoint_resume.dir) == ("SIGUSR2", "~/ckpt")
    with pytest.raises(ValidationError, match="'SIGKILL' is not a signal a job can catch"):
        spec(checkpoint_resume={"max_resumes": 1, "signal": "SIGKILL"})
    with pytest.raises(ValidationError, match="'ckpt' is relative, and every attempt may start elsewhere"):
        spec(checkpoint_resume={"max_resumes": 1, "dir": "ckpt"})


def test_without_strategies_the_plan_follows_the_keys_given() -> None:
    assert spec().fault_tolerance.plan == ()
    assert spec(max_restarts=2, retries=1).fault_tolerance.plan == ("recover-in-place", "recover")
    assert spec(checkpoint_resume={"max_resumes": 1}).fault_tolerance.plan == ("dump", "recover")
    listed = spec(strategies=["recover", "recover-in-place", "exit"], retries=1, max_restarts=1)
    assert listed.fault_tolerance.plan == ("recover", "recover-in-place", "exit")


@pytest.mark.parametrize(
    ("ft", "message"),
    [
        ({"strategies": ["exit", "recover"], "retries": 1}, "strategies[0]: exit ends the job: recover after it"),
        ({"strategies": ["recover-in-place"]}, "strategies[0]: recover-in-place needs max_restarts"),
        ({"strategies": ["exit", "recover"][1:]}, "strategies[0]: recover needs retries"),
        ({"strategies": ["dump", "exit"]}, "strategies[0]: dump needs checkpoint_resume"),
        ({"strategies": ["recover"], "retries": 1, "max_restarts": 2}, "max_restarts: max_restarts is used by"),
        ({"strategies": ["recover-in-place"], "max_restarts": 2, "retries": 1}, "retries: retries is used by"),
        ({"strategies": ["recover"], "checkpoint_resume": {"max_resumes": 1}}, "checkpoint_resume is used by dump"),
        ({"strategies": ["dump"], "checkpoint_resume": {"max_resumes": 1}}, "max_resumes counts resumes"),
        ({"strategies": ["recover", "recover"], "retries": 1}, "recover given more than once"),
        ({"strategies": ["retry"], "retries": 1}, "strategies.0"),
        ({"strategies": []}, "strategies"),
    ],
)
def test_a_strategy_without_its_budget_or_a_budget_without_its_strategy_is_refused(
    ft: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=r"fault_tolerance") as caught:
        spec(**ft)
    assert message in str(caught.value)


def test_with_strategies_restart_exit_codes_needs_no_max_restarts() -> None:
    ft = spec(strategies=["recover"], retries=2, restart_exit_codes=[137]).fault_tolerance
    assert ft.restart_exit_codes == [137]


@pytest.mark.parametrize(
    ("ft", "refused"),
    [
        ({}, True),
        ({"max_restarts": 2}, True),  # restarts in place: the same nodes, which is what a reschedule avoids
        ({"retries": 1}, False),
        ({"checkpoint_resume": {"max_resumes": 2}}, False),
    ],
)
def test_performance_action_reschedule_needs_resubmits(ft: dict[str, Any], refused: bool) -> None:
    data = {"name": "j", "command": "train", "fault_tolerance": ft, "performance": {"action": "reschedule"}}
    if not refused:
        assert JobSpec.from_json(data).performance.action == "reschedule"  # type: ignore[union-attr]
        return
    with pytest.raises(ValidationError, match=r"performance\.action: performance\.action reschedule needs fault_t"):
        JobSpec.from_json(data)


def test_performance_action_is_alert_or_reschedule() -> None:
    base = {"name": "j", "command": "train", "fault_tolerance": {"retries": 1}}
    assert JobSpec.from_json({**base, "performance": {}}).performance.action == "alert"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match=r"performance\.action"):
        JobSpec.from_json({**base, "performance": {"action": "restart"}})
