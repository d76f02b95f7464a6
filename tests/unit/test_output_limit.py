"""A rank's output cap (`output_limit`): sizes as the spec and the config write them, who may ask for what, the
node side's cut of output.log (scheduler/node/supervisor_output.py) and its reads in offsets of the whole output,
the channel's follow across a cut, and the supervisor keeping a real run's output.log under the limit."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ftconsole.scheduler.errors import ConfigError, PermissionDenied
from ftconsole.scheduler.node import channel
from ftconsole.scheduler.node import supervisor_output as out
from ftconsole.scheduler.rankreads import DROPPED_LINE, dropped_marker
from ftconsole.scheduler.rules import Caller, Rules
from ftconsole.scheduler.spec.config import SchedulerSettings
from ftconsole.scheduler.spec.jobspec import JobSpec, parse_jobspec
from ftconsole.scheduler.spec.values import format_size, parse_size
from ftconsole.scheduler.ssh.runs import supervisor_script
from tests.unit.test_agent import python38

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# -- sizes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64KiB", 64 * KiB),
        ("64 KiB", 64 * KiB),
        ("64K", 64 * KiB),
        ("64k", 64 * KiB),
        ("64Ki", 64 * KiB),
        ("512MiB", 512 * MiB),
        ("2GiB", 2 * GiB),
        ("1.5G", int(1.5 * GiB)),
        ("1TiB", 1 << 40),
        ("2GB", 2_000_000_000),
        ("64kB", 64_000),
        ("100", 100),
        ("100 bytes", 100),
        ("1B", 1),
        (4096, 4096),
        (0, 0),
    ],
)
def test_a_size_is_read_in_powers_of_1024_or_with_kb_mb_gb_of_1000(text: Any, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("lots", "expected a size such as 64KiB, 512MiB or 2GiB"),
        ("64 KiBs", "expected a size"),
        ("-5", "expected a size"),
        (-5, "cannot be negative"),
        (True, "expected a size"),
        ([1], "expected a size"),
        (2**70, "not a size this cluster can hold"),
        (float("nan"), "not a size this cluster can hold"),
        ("99999999999TiB", "not a size this cluster can hold"),
    ],
)
def test_what_is_no_size_is_refused_saying_what_a_size_looks_like(value: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_size(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [(100, "100 bytes"), (64 * KiB, "64 KiB"), (GiB, "1 GiB"), (int(1.5 * GiB), "1.5 GiB"), (3 * (1 << 40), "3 TiB")],
)
def test_a_size_is_said_as_the_docs_write_it_and_the_node_writes_it_the_same(size: int, text: str) -> None:
    assert format_size(size) == text == out.output_size_text(size)


# -- the job spec and the config -------------------------------------------------------------------------------


def job(limit: str | None) -> JobSpec:
    line = "" if limit is None else f"output_limit: {limit}\n"
    return parse_jobspec(f"name: chatty\ncommand: python train.py\n{line}")


@pytest.mark.parametrize(
    ("written", "limit"),
    [(None, None), ("64KiB", 64 * KiB), ("2GiB", 2 * GiB), ("off", 0), ("0", 0), ("null", None), ("16KiB", 16 * KiB)],
)
def test_a_job_asks_for_a_limit_or_none_or_leaves_it_to_the_cluster(written: str | None, limit: int | None) -> None:
    spec = job(written)
    assert spec.output_limit == limit
    assert JobSpec.from_stored(spec.to_json()).output_limit == limit  # as stored, read back
    assert spec.output_cap(GiB) == (GiB if limit is None else limit)


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("1KiB", "job.yaml:3: output_limit: must be at least 16 KiB, or off (no limit)"),
        ("lots", "job.yaml:3: output_limit: expected a size such as 64KiB, 512MiB or 2GiB, got 'lots'"),
        ("[1]", "job.yaml:3: output_limit: expected a size"),
    ],
)
def test_a_limit_that_is_none_is_refused_with_its_line(written: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_jobspec(f"name: chatty\ncommand: python train.py\noutput_limit: {written}\n", "job.yaml")
    assert problem in str(caught.value)


def test_the_cluster_caps_output_at_1_gib_unless_told_and_off_is_no_cap() -> None:
    assert SchedulerSettings().output_limit == GiB
    assert SchedulerSettings.model_validate({"output_limit": "off"}).output_limit == 0
    assert SchedulerSettings.model_validate({"output_limit": False}).output_limit == 0  # YAML's bare off
    assert SchedulerSettings.model_validate({"output_limit": "256MiB"}).output_limit == 256 * MiB
    with pytest.raises(ValueError, match="must be at least 16 KiB"):
        SchedulerSettings.model_validate({"output_limit": 100})


def rules(cluster: int) -> Rules:
    """Rules with only what the output limit's check reads: the cluster's limit and its admins."""
    made = object.__new__(Rules)
    made.config = SimpleNamespace(admins=["alice"])  # type: ignore[assignment]
    made.settings = SimpleNamespace(output_limit=cluster)  # type: ignore[assignment]
    return made


USER = Caller(uid=1000, gid=1000, pid=1, user="bob")
ADMIN = Caller(uid=1001, gid=1001, pid=1, user="alice")


@pytest.mark.parametrize(
    ("cluster", "asked", "caller", "refused"),
    [
        (GiB, None, USER, None),  # the cluster's
        (GiB, 64 * KiB, USER, None),  # less
        (GiB, GiB, USER, None),  # as much
        (GiB, 2 * GiB, USER, "output_limit 2 GiB is over this cluster's scheduler.output_limit (1 GiB)"),
        (GiB, 0, USER, "output_limit off is over this cluster's scheduler.output_limit (1 GiB)"),
        (GiB, 2 * GiB, ADMIN, None),  # an admin's job may have more
        (GiB, 0, ADMIN, None),
        (0, 2 * GiB, USER, None),  # a cluster without a limit: anything
        (0, 0, USER, None),
    ],
)
def test_a_job_may_lower_the_limit_and_only_an_admins_raise_it(
    cluster: int, asked: int | None, caller: Caller, refused: str | None
) -> None:
    spec = job(None if asked is None else str(asked))
    if refused is None:
        rules(cluster)._output_limit_allowed(caller, spec)
    else:
        with pytest.raises(PermissionDenied, match=refused.replace("(", r"\(").replace(")", r"\)")):
            rules(cluster)._output_limit_allowed(caller, spec)


# -- the node side: pure ---------------------------------------------------------------------------------------


def test_the_header_says_what_was_dropped_and_is_read_back() -> None:
    line = out.output_header(64 * KiB, 4980736)
    assert line == b"== ftconsole: earlier output dropped: output_limit 64 KiB (the first 4980736 bytes) ==\n"
    assert line.startswith(DROPPED_LINE)
    assert out.output_header_of(line + b"line 1\n") == (4980736, len(line))
    assert out.output_header_of(b"line 1\n") == (0, 0)
    assert out.output_header_of(line[:-1]) == (0, 0)  # not a whole line: none


H = 80  # a header's length
D = 10_000  # bytes dropped


@pytest.mark.parametrize(
    ("offset", "dropped", "header", "size", "want"),
    [
        (0, 0, 0, 500, (0, 0)),  # never cut: offsets are the file's
        (300, 0, 0, 500, (300, 300)),
        (900, 0, 0, 500, (900, 500)),  # past the end: nothing yet
        (0, D, H, 500, (D - H, 0)),  # from the start: the header, then what was kept
        (D - H, D, H, 500, (D - H, 0)),
        (D - H + 1, D, H, 500, (D, H)),  # within the header's offsets: right after it, never a part of it
        (D - 1, D, H, 500, (D, H)),
        (D, D, H, 500, (D, H)),  # the first byte kept
        (D + 100, D, H, 500, (D + 100, H + 100)),  # a reader that kept up goes on where it was
    ],
)
def test_a_read_counts_offsets_of_the_whole_output(
    offset: int, dropped: int, header: int, size: int, want: tuple[int, int]
) -> None:
    assert out.output_position(offset, dropped, header, size) == want


@pytest.mark.parametrize(
    ("size", "limit", "due"),
    [(0, 64 * KiB, False), (32 * KiB, 64 * KiB, False), (32 * KiB + 1, 64 * KiB, True), (10 * GiB, 0, False)],
)
def test_a_cut_is_due_past_half_the_limit(size: int, limit: int, due: bool) -> None:
    assert out.output_cut_due(size, limit) is due


@pytest.mark.parametrize(
    ("window", "want"),
    [
        (b"rt of a line\nnext line\n", 13),  # from the next line's start
        (b"no newline at all", 0),  # one long line: cut within it
        (b"ends here\n", 0),  # the only newline ends the file: nothing after it to start from
    ],
)
def test_the_kept_tail_starts_at_a_line(window: bytes, want: int) -> None:
    limit = 64 * KiB
    size = 50 * KiB
    assert out.output_keep_from(size, limit, window) == size - limit // out.KEEP + want


@pytest.mark.parametrize(
    ("interval", "rate", "want"),
    [
        (0.005, 0.0, 0.01),  # nothing printed yet: looked at twice as late, not at once a second later
        (0.5, 0.0, 1.0),
        (1.0, 0.0, out.CHECK_MAX_S),
        (1.0, 8 * KiB, out.CHECK_MAX_S),  # slow: once a second
        (1.0, 1 * MiB, 64 * KiB / 8 / MiB),  # at most an eighth of the limit between two looks
        (0.005, 1 << 40, out.CHECK_MIN_S),
    ],
)
def test_the_size_is_looked_at_the_more_often_the_faster_it_grows(interval: float, rate: float, want: float) -> None:
    assert out.output_next_check(interval, rate, 64 * KiB) == pytest.approx(want)


def test_the_rate_remembers_a_burst_for_a_while() -> None:
    assert out.output_rate(0.0, 10_000, 0.01) == pytest.approx(1_000_000)
    after = out.output_rate(1_000_000, 0, out.RATE_HALF_LIFE_S)  # quiet since: half of it
    assert after == pytest.approx(500_000)
    assert out.output_rate(100.0, 5_000, 1.0) == pytest.approx(5_000)


# -- the node side: a file cut -----------------------------------------------------------------------------------


def numbered(first: int, count: int) -> bytes:
    return b"".join(b"line %06d %s\n" % (i, b"x" * 88) for i in range(first, first + count))  # 101 bytes each


def test_a_cut_keeps_the_newest_lines_and_every_offset_stays_good(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    limit = 64 * KiB
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    written = 0
    try:
        for i in range(0, 5000, 50):
            os.write(fd, numbered(i, 50))
            written += 50 * 101
            if out.output_cut_due(os.fstat(fd).st_size, limit):
                out.output_cut(str(path), limit, writers=fd)
            assert path.stat().st_size <= limit
    finally:
        os.close(fd)
    data = path.read_bytes()
    header, _, kept = data.partition(b"\n")
    dropped, length = out.output_header_of(data)
    assert header + b"\n" == out.output_header(limit, dropped) and length == len(header) + 1
    assert dropped + len(kept) == written  # nothing lost, nothing counted twice
    assert kept == numbered(4999 - len(kept) // 101 + 1, len(kept) // 101)  # whole lines, the newest
    assert len(kept) <= limit // out.CUT_AT  # a quarter after the last cut, and what came since

    start, chunk, end = out._output_chunk(str(path), 0, 1 << 20) or (0, b"", 0)  # from the start: the header
    assert (start, chunk, end) == (dropped - length, data, written)
    start, chunk, _ = out._output_chunk(str(path), written - 101, 1 << 20) or (0, b"", 0)  # a reader that kept up
    assert (start, chunk) == (written - 101, numbered(4999, 1))
    start, chunk, _ = out._output_chunk(str(path), 0, 1 << 20, tail=2) or (0, b"", 0)
    assert (start, chunk) == (written - 202, numbered(4998, 2))
    start, chunk, _ = out._output_chunk(str(path), 0, 1 << 20, tail=99_999) or (0, b"", 0)  # all: the header too
    assert (start, chunk) == (dropped - length, data)
    start, chunk, _ = out._output_chunk(str(path), 50, 1 << 20, last=303) or (0, b"", 0)  # a scan's read
    assert (start, chunk) == (written - 303, numbered(4997, 3))


@pytest.mark.parametrize("late", [0, 1, 2])
def test_a_write_the_truncation_takes_away_is_said_where_it_would_have_been(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late: int
) -> None:
    """The race of copytruncate, made to happen: the rank writes between the cut's last look at the size and its
    truncation (late=1: one write, late=2: two). The write is lost, and a line right after the kept tail says how
    many bytes; with no such write (late=0) there is no such line. A reader's offsets stay good."""
    path = tmp_path / "output.log"
    limit = 64 * KiB
    writers = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # the ranks' stdout
    truncate = os.ftruncate

    def racing(fd: int, size: int) -> None:
        for i in range(late):
            os.write(writers, numbered(400 + 50 * i, 50))  # lands past what the cut copied
        truncate(fd, size)

    try:
        os.write(writers, numbered(0, 400))
        monkeypatch.setattr(out.os, "ftruncate", racing)
        dropped = out.output_cut(str(path), limit, writers=writers)
        monkeypatch.setattr(out.os, "ftruncate", truncate)
        os.write(writers, numbered(400 + 50 * late, 1))  # the rank goes on
    finally:
        os.close(writers)
    assert dropped is not None
    data = path.read_bytes()
    _, length = out.output_header_of(data)
    kept = data[length:]
    said = out.output_lost_line(50 * 101 * late)
    if late:
        assert kept.endswith(numbered(399, 1) + said + numbered(400 + 50 * late, 1)), kept[-400:]
    else:
        assert b"output lost" not in kept and kept.endswith(numbered(399, 1) + numbered(400, 1))
    # a reader that had read the kept tail up to line 399 goes on with the line that says so, then line 400+
    start, chunk, _ = out._output_chunk(str(path), dropped + len(kept) - len(said) * bool(late) - 101, 1 << 20) or (
        0, b"", 0)  # fmt: skip
    assert chunk == (said if late else b"") + numbered(400 + 50 * late, 1)
    assert start == dropped + len(kept) - len(chunk)


def test_a_file_never_cut_reads_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    path.write_bytes(b"one\ntwo\n")
    assert out._output_chunk(str(path), 4, 100) == (4, b"two\n", 8)
    assert out._output_chunk(str(path), 99, 100) == (99, b"", 8)
    with pytest.raises(FileNotFoundError):
        out._output_chunk(str(tmp_path / "none"), 0, 100)


def test_a_read_waits_for_a_cut_under_way_and_a_cut_for_a_read(tmp_path: Path) -> None:
    import fcntl

    path = tmp_path / "output.log"
    path.write_bytes(numbered(0, 1000))
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a cut under way
        assert out._output_chunk(str(path), 0, 100, wait=0.05) is None
        fcntl.flock(holder, fcntl.LOCK_SH)  # a read under way: a cut waits (a second), then tries again later
        assert out._output_chunk(str(path), 0, 4, wait=0.05) == (0, b"line", 101_000)
        started = time.monotonic()
        assert out.output_cut(str(path), 64 * KiB) is None
        assert 0.9 < time.monotonic() - started < 5
    finally:
        os.close(holder)
    assert out.output_cut(str(path), 64 * KiB) is not None


def test_the_channel_follows_a_file_across_its_cuts(tmp_path: Path) -> None:
    """A follower that keeps up goes on where it was; one whose next byte was dropped gets the header, then what
    was kept: never a byte twice, never a part of a line."""
    path = tmp_path / "output.log"
    limit = 64 * KiB
    follows: dict[int, dict[str, Any]] = {1: {"path": str(path), "offset": 0}}
    got: list[tuple[int, bytes]] = []

    def pushed() -> None:
        for event in channel._grown(follows):
            got.append((event["offset"], base64.b64decode(event["data"])))

    with path.open("ab") as fh:
        for i in range(0, 3000, 30):
            fh.write(numbered(i, 30))
            fh.flush()
            if out.output_cut_due(path.stat().st_size, limit):
                out.output_cut(str(path), limit, writers=fh.fileno())
            pushed()
        pushed()
    text = b"".join(data for _, data in got)
    assert b"earlier output dropped" not in text  # it kept up: no cut took what it had not read
    assert text == numbered(0, 3000)
    assert [o for o, _ in got] == sorted(o for o, _ in got)

    follows = {2: {"path": str(path), "offset": 0}}  # a late follower: the header, then the newest lines
    got.clear()
    pushed()
    first = got[0][1]
    assert first.startswith(DROPPED_LINE) and first.endswith(numbered(2999, 1))


@pytest.mark.parametrize(
    ("data", "mid_line", "marker"),
    [
        (out.output_header(GiB, 5) + b"x\n", False, b""),  # the node's own line says it
        (b"x\n", False, DROPPED_LINE + b" (output_limit) ==\n"),  # it does not: ours
        # what was shown last ended mid-line (a cut dropped its rest): it ends, and the line saying so stands alone
        (out.output_header(GiB, 5) + b"x\n", True, b"\n"),
        (b"x\n", True, b"\n" + DROPPED_LINE + b" (output_limit) ==\n"),
    ],
)
def test_logs_say_once_where_output_was_dropped(data: bytes, mid_line: bool, marker: bytes) -> None:
    assert dropped_marker(data, mid_line=mid_line) == marker


# -- the supervisor: a real run ----------------------------------------------------------------------------------

WRITER = (
    "import sys\n"
    "for i in range(20000):\n"
    "    sys.stdout.write('line %06d %s\\n' % (i, 'x' * 88))\n"
    "    if i % 200 == 0:\n"
    "        sys.stdout.flush()\n"
)


def supervise(python: str, params: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([python, "-"], input=supervisor_script(params), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_the_supervisor_keeps_a_runs_output_under_its_limit(tmp_path: Path, which: str) -> None:
    python = sys.executable if which == "this" else python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    run_dir = tmp_path / "runs" / "1" / "1" / "0"
    limit = 64 * KiB
    argv = [sys.executable, "-c", WRITER]
    started = supervise(python, {"action": "start", "run_dir": str(run_dir), "argv": argv, "env": {},
                                 "workdir": str(tmp_path), "output_limit": limit})  # fmt: skip
    assert started["started"] is True
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = json.loads((run_dir / "status.json").read_text())
        if status["state"] not in ("starting", "running"):
            break
        time.sleep(0.05)
    assert status["state"] == "exited" and status["exit_code"] == 0
    log = run_dir / "output.log"
    assert log.stat().st_size <= limit
    data = log.read_bytes()
    assert data.startswith(b"== ftconsole: earlier output dropped: output_limit 64 KiB (the first ")
    assert data.endswith(numbered(19999, 1))
    read = supervise(python, {"action": "read", "path": str(log), "offset": 0, "limit": 1 << 20})
    # dropped + kept: at most what was written (a write in the instant of a cut may be lost, as with
    # logrotate's copytruncate: on a busy machine a few lines of 20,000 are)
    assert base64.b64decode(read["data"]) == data and read["end"] == read["offset"] + len(data) <= 20000 * 101
    tail = supervise(python, {"action": "read", "path": str(log), "limit": 1 << 20, "tail": 1})
    assert base64.b64decode(tail["data"]) == numbered(19999, 1) and tail["offset"] + 101 == tail["end"]


def test_a_run_without_a_limit_is_never_cut(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "1" / "1" / "0"
    started = supervise(sys.executable, {"action": "start", "run_dir": str(run_dir), "env": {}, "output_limit": 0,
                                         "argv": [sys.executable, "-c", WRITER], "workdir": str(tmp_path)})  # fmt: skip
    assert started["started"] is True
    deadline = time.monotonic() + 30
    while json.loads((run_dir / "status.json").read_text())["state"] in ("starting", "running"):
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.05)
    assert (run_dir / "output.log").read_bytes() == numbered(0, 20000)
