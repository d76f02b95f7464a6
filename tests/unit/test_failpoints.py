"""Failpoints: the spec's syntax and its errors, counts, each action, and a real SIGKILL in a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftconsole.scheduler import failpoints
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.failpoints import (
    ENV,
    POINTS,
    Action,
    FailpointError,
    FailpointSpecError,
    Kind,
    UnknownFailpoint,
    afailpoint,
    configure,
    failpoint,
    hits,
)

ROOT = Path(__file__).resolve().parents[2]
KNOWN = (
    "known: tick.after_snapshot, place.after_record, launch.before_send, launch.after_send, launch.after_record, "
    "observe.after_read, observe.after_record, stop.after_send, checkpoint.before_signal, recover.after_record"
)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    configure(None)
    yield
    configure(None)


def test_the_registry_starts_with_the_points_of_issue_10() -> None:
    assert set(POINTS) >= {
        "tick.after_snapshot",
        "launch.before_send",
        "launch.after_send",
        "launch.after_record",
        "stop.after_send",
        "place.after_record",
        "observe.after_read",
        "observe.after_record",
    }
    assert all(desc.strip() and "\n" not in desc for desc in POINTS.values())


def test_every_point_is_documented_in_operations() -> None:
    section = (ROOT / "docs" / "operations.md").read_text().split("## Failpoints", 1)[1]
    missing = [name for name in POINTS if f"| `{name}`" not in section]
    assert not missing, f"add these failpoints to the table in docs/operations.md: {missing}"


# -- parsing -----------------------------------------------------------------------------------------------

GOOD = [
    ("", {}),
    ("  ", {}),
    ("launch.after_send=crash", {"launch.after_send": Action(Kind.CRASH)}),
    (
        "launch.after_send=crash,tick.after_snapshot=delay(2)",
        {"launch.after_send": Action(Kind.CRASH), "tick.after_snapshot": Action(Kind.DELAY, 2.0)},
    ),
    (" launch.after_send = error , ", {"launch.after_send": Action(Kind.ERROR)}),
    ("stop.after_send=off", {"stop.after_send": Action(Kind.OFF)}),
    ("stop.after_send=2*error", {"stop.after_send": Action(Kind.ERROR, count=2)}),
    ("stop.after_send=1*crash", {"stop.after_send": Action(Kind.CRASH, count=1)}),
    ("stop.after_send=3*delay(0.5)", {"stop.after_send": Action(Kind.DELAY, 0.5, 3)}),
    ("stop.after_send=delay(0)", {"stop.after_send": Action(Kind.DELAY, 0.0)}),
    ("stop.after_send=delay( 1.5 )", {"stop.after_send": Action(Kind.DELAY, 1.5)}),
]


@pytest.mark.parametrize(("spec", "expected"), GOOD)
def test_good_specs(spec: str, expected: dict[str, Action]) -> None:
    assert failpoints.parse(spec) == expected


BAD = [
    ("launch.after_sent=crash", f"FTCONSOLE_FAILPOINTS: unknown failpoint 'launch.after_sent'; {KNOWN}"),
    ("launch.after_send", "FTCONSOLE_FAILPOINTS: 'launch.after_send' is not NAME=ACTION"),
    ("=crash", "FTCONSOLE_FAILPOINTS: '=crash' is not NAME=ACTION"),
    (
        "launch.after_send=crash,launch.after_send=off",
        "FTCONSOLE_FAILPOINTS: failpoint 'launch.after_send' is given twice",
    ),
    (
        "launch.after_send=panic",
        "FTCONSOLE_FAILPOINTS: launch.after_send: unknown action 'panic'; one of: off, crash, error, "
        "delay(SECONDS), each with an optional count N* (as 2*error)",
    ),
    ("launch.after_send=", "FTCONSOLE_FAILPOINTS: launch.after_send: unknown action ''"),
    ("launch.after_send=delay", "FTCONSOLE_FAILPOINTS: launch.after_send: unknown action 'delay'"),
    (
        "launch.after_send=delay(soon)",
        "FTCONSOLE_FAILPOINTS: launch.after_send: delay needs a number of seconds, 0 or more, as delay(2) or "
        "delay(0.5), not 'delay(soon)'",
    ),
    ("launch.after_send=delay(-1)", "delay needs a number of seconds, 0 or more"),
    ("launch.after_send=delay(inf)", "delay needs a number of seconds, 0 or more"),
    ("launch.after_send=delay(nan)", "delay needs a number of seconds, 0 or more"),
    ("launch.after_send=delay()", "delay needs a number of seconds, 0 or more"),
    (
        "launch.after_send=0*crash",
        "FTCONSOLE_FAILPOINTS: launch.after_send: the count in '0*crash' must be a whole number, 1 or more",
    ),
    ("launch.after_send=x*crash", "the count in 'x*crash' must be a whole number, 1 or more"),
    ("launch.after_send=-1*crash", "the count in '-1*crash' must be a whole number, 1 or more"),
    ("launch.after_send=*crash", "the count in '*crash' must be a whole number, 1 or more"),
    ("launch.after_send=²*crash", "the count in '²*crash' must be a whole number, 1 or more"),
    ("launch.after_send=2*3*crash", "unknown action '3*crash'"),
    ("launch.after_send=cr\nash", "unknown action 'cr\\nash'"),
    ("launch.after_send=2*off", "FTCONSOLE_FAILPOINTS: launch.after_send: 'off' takes no count"),
    ("launch.after_send=crash;stop.after_send=crash", "unknown action 'crash;stop.after_send=crash'"),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(FailpointSpecError) as info:
        failpoints.parse(spec)
    assert message in str(info.value)
    assert isinstance(info.value, FtError)


def test_configure_names_its_source_and_keeps_the_old_points_on_error() -> None:
    configure("launch.after_send=error")
    with pytest.raises(FailpointSpecError, match=r"^failpoints: unknown failpoint 'nope'"):
        configure("stop.after_send=crash,nope=crash")
    with pytest.raises(FailpointError):
        failpoint("launch.after_send")


def test_active_lists_what_acts() -> None:
    configure("stop.after_send=2*delay(0.5),launch.after_send=crash,observe.after_read=off")
    assert failpoints.active() == {"launch.after_send": "crash", "stop.after_send": "2*delay(0.5)"}
    configure(None)
    assert failpoints.active() == {}


# -- hitting points ----------------------------------------------------------------------------------------


def test_unset_points_do_nothing_but_count() -> None:
    for _ in range(3):
        failpoint("launch.after_send")
    assert hits("launch.after_send") == 3
    assert hits("launch.before_send") == 0
    configure(None)
    assert hits("launch.after_send") == 0


async def test_async_points_count_too() -> None:
    await afailpoint("observe.after_read")
    await afailpoint("observe.after_read")
    assert hits("observe.after_read") == 2


def test_error_raises_an_ft_error_naming_the_point() -> None:
    configure("launch.after_record=error")
    with pytest.raises(FailpointError) as info:
        failpoint("launch.after_record")
    assert info.value.name == "launch.after_record"
    assert str(info.value) == "failpoint launch.after_record: injected error"
    assert isinstance(info.value, FtError)
    with pytest.raises(FailpointError):  # without a count, every hit
        failpoint("launch.after_record")
    assert hits("launch.after_record") == 2


async def test_a_count_acts_that_many_times_then_turns_off() -> None:
    configure("stop.after_send=2*error")
    for _ in range(2):
        with pytest.raises(FailpointError):
            await afailpoint("stop.after_send")
    await afailpoint("stop.after_send")
    failpoint("stop.after_send")
    assert hits("stop.after_send") == 4
    assert failpoints.active() == {}


def test_off_does_nothing() -> None:
    configure("stop.after_send=off")
    failpoint("stop.after_send")
    assert hits("stop.after_send") == 1


def test_sync_delay_sleeps() -> None:
    configure("tick.after_snapshot=delay(0.05)")
    start = time.monotonic()
    failpoint("tick.after_snapshot")
    assert time.monotonic() - start >= 0.05


async def test_async_delay_lets_the_loop_run_other_tasks() -> None:
    configure("tick.after_snapshot=delay(0.3)")
    ticks: list[float] = []

    async def other() -> None:
        for _ in range(5):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    start = time.monotonic()
    task = asyncio.create_task(other())
    await afailpoint("tick.after_snapshot")
    done = time.monotonic()
    await task
    assert done - start >= 0.3
    assert len(ticks) == 5 and ticks[-1] < done  # the other task ran to its end while the point slept


def test_an_unregistered_point_in_the_code_is_refused() -> None:
    with pytest.raises(UnknownFailpoint) as info:
        failpoint("launch.after_sned")
    assert str(info.value) == f"unknown failpoint 'launch.after_sned'; {KNOWN}"
    with pytest.raises(UnknownFailpoint):
        hits("launch.after_sned")


async def test_an_unregistered_point_in_async_code_is_refused() -> None:
    with pytest.raises(UnknownFailpoint, match="unknown failpoint 'nope'"):
        await afailpoint("nope")


def test_a_point_registered_later_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POINTS, "test.late", "registered after configure ran")
    failpoint("test.late")
    assert hits("test.late") == 1


# -- the environment and a real crash ----------------------------------------------------------------------

PROGRAM = """
import sys
from ftconsole.scheduler.failpoints import failpoint
print("before", flush=True)
failpoint("launch.after_send")
print("after", flush=True)
"""

ASYNC_PROGRAM = """
import asyncio
from ftconsole.scheduler.failpoints import afailpoint
async def main():
    print("before", flush=True)
    try:
        await afailpoint("launch.after_send")
    finally:
        print("finally", flush=True)
asyncio.run(main())
"""


def _run(program: str, spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if spec is not None:
        env[ENV] = spec
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )


@pytest.mark.parametrize("program", [PROGRAM, ASYNC_PROGRAM], ids=["sync", "async"])
def test_crash_kills_the_process_with_sigkill_at_the_point(program: str) -> None:
    done = _run(program, "launch.after_send=crash")
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout == "before\n"  # nothing after the point runs, not even a finally
    assert "failpoint launch.after_send: crash" in done.stderr


def test_without_the_variable_the_program_runs_through() -> None:
    done = _run(PROGRAM, None)
    assert (done.returncode, done.stdout) == (0, "before\nafter\n"), done.stderr


def test_a_bad_variable_is_refused_at_import() -> None:
    done = _run(PROGRAM, "launch.after_sent=crash")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "FTCONSOLE_FAILPOINTS: unknown failpoint 'launch.after_sent'; known: tick.after_snapshot" in done.stderr
