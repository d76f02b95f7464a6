"""`begin:` (Slurm's --begin): what a spec may say, and when that is."""

from __future__ import annotations

import datetime

import pytest

from ftconsole.scheduler.errors import JobSpecError
from ftconsole.scheduler.spec.begin import begin_at, parse_begin, waits_for
from ftconsole.scheduler.spec.jobspec import parse_jobspec

T = 1_800_000_000.0


def test_a_time_after_the_submit_or_a_date_and_time() -> None:
    assert begin_at("+2h", T) == T + 7200 and begin_at("+90m", T) == T + 5400
    at = datetime.datetime(2027, 1, 15, 16, 30)
    assert begin_at("2027-01-15T16:30", T) == at.timestamp()  # local time
    assert (
        begin_at("2027-01-15T16:30:00+00:00", T)
        == datetime.datetime(2027, 1, 15, 16, 30, tzinfo=datetime.UTC).timestamp()
    )
    assert parse_begin(datetime.date(2027, 1, 15)) == "2027-01-15"  # YAML reads a date as a date
    assert begin_at(parse_begin(datetime.date(2027, 1, 15)), T) == datetime.datetime(2027, 1, 15).timestamp()


@pytest.mark.parametrize(
    ("value", "said"),
    [("tomorrow", "is not a time"), ("+", "duration after the submit"), ("+0s", "duration after the submit"),
     ("+-5m", "duration after the submit"), (12, "not 12")],
)  # fmt: skip
def test_what_is_refused_says_what_is_wanted(value: object, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_begin(value)


def test_in_a_spec_and_why_a_job_waits() -> None:
    spec = parse_jobspec("name: t\ncommand: python train.py\nbegin: +30m\n")
    assert spec.begin == "+30m" and spec.to_json()["begin"] == "+30m"
    with pytest.raises(JobSpecError, match="begin"):
        parse_jobspec("name: t\ncommand: python train.py\nbegin: soon\n")
    assert waits_for("+30m", T, T + 60).startswith("waiting: not before ")
    assert waits_for("+30m", T, T + 1800) is None  # its time has come


def test_the_command_line_s_times_become_absolute() -> None:
    from ftconsole.scheduler.spec.begin import from_command_line

    assert from_command_line("+2h", T) == "+2h"  # after the submit, wherever the scheduler runs
    at = datetime.datetime.fromisoformat(from_command_line("2027-01-15T16:30", T))
    assert at.tzinfo is not None and at.timestamp() == datetime.datetime(2027, 1, 15, 16, 30).timestamp()
    here = datetime.datetime.fromtimestamp(T).astimezone()
    soon = (here + datetime.timedelta(minutes=5)).strftime("%H:%M")
    gone = (here - datetime.timedelta(minutes=5)).strftime("%H:%M")
    assert 0 < begin_at(from_command_line(soon, T), T) - T <= 300  # later today
    assert 86000 < begin_at(from_command_line(gone, T), T) - T <= 86400  # tomorrow
    with pytest.raises(ValueError, match="is not a time"):
        from_command_line("soon", T)


def test_submit_begin_refuses_a_bad_time_with_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\ncommand: python train.py\n")
    done = subprocess.run([sys.executable, "-m", "ftconsole.cli", "submit", str(spec), "--begin", "soon"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--begin 'soon'" in done.stderr and "is not a time" in done.stderr
