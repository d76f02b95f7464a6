"""`fault_tolerance` keys of a job spec that the recovery policy reads: what is refused, and why."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ftconsole.scheduler.jobspec import JobSpec


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
