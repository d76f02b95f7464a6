"""A rank's output cap (`output_limit`) on real sshd nodes with real processes: a job writes 5 MB of numbered lines
under a limit of 64 KiB; its output.log on the node stays under the limit while it runs and at its end, keeps the
newest lines, and `logs` (whole, `--tail`, `--follow` across the cuts, and the command line) says once that earlier
output was dropped, then shows the tail without a byte of garbage."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import Cli
from tests.integration.test_scheduler_sshd import WAIT, as_nobody, finished, job, log_of, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd

LIMIT = 64 * 1024
LINES = 50_000  # of 101 bytes: 5,050,000 bytes in all
# 50 lines every 10 ms: some 500 kB/s, for about 10 s
WRITER = f"""\
import sys, time
for i in range({LINES}):
    sys.stdout.write("line %06d %s\\n" % (i, "x" * 88))
    if i % 50 == 49:
        sys.stdout.flush()
        time.sleep(0.01)
"""
LINE = re.compile(r"^line (\d{6}) x{88}$")
HEADER = re.compile(r"^== ftconsole: earlier output dropped: output_limit 64 KiB \(the first (\d+) bytes\) ==$")


def line(number: int) -> str:
    return f"line {number:06d} {'x' * 88}\n"


DROPPED = "== ftconsole: earlier output dropped"
LOST = "== ftconsole: output lost"  # a write a cut took away (the copytruncate race), said where it would have been


def numbers(text: str) -> tuple[list[int], int]:
    """The numbers of the numbered lines of `text`, and how many lines said output was dropped. Fails on any other
    line (garbage, a part of a line but for the start of one whose rest a cut dropped or lost, right before the
    line that says so), on a line twice or out of order, and on lines missing where no line says that output was
    dropped or lost there (a loss is said right after the kept tail, or after a write that came in between: within
    the next few lines)."""
    found: list[int] = []
    dropped, said = 0, False
    rows = text.splitlines()
    for at, row in enumerate(rows):
        if row.startswith((DROPPED, LOST)):
            dropped, said = dropped + row.startswith(DROPPED), True
            continue
        cut_short = at + 1 < len(rows) and rows[at + 1].startswith((DROPPED, LOST))
        if cut_short and not LINE.match(row):
            assert row and line(0).startswith(re.sub(r"\d", "0", row)), f"garbage: {row!r}"
            continue  # a line shown as far as it was written when a cut dropped the rest
        match = LINE.match(row)
        assert match is not None, f"not a line the job wrote: {row[:200]!r}"
        number = int(match.group(1))
        expected = found[-1] + 1 if found else 0
        lost_soon = any(r.startswith(LOST) for r in rows[at + 1 : at + 4])
        assert number == expected or (number > expected and (said or lost_soon)), (
            f"line {number} after {found[-1:]}, unsaid"
        )
        found.append(number)
        said = False
    return found, dropped


async def test_a_chatty_rank_keeps_under_its_output_limit_and_logs_show_the_tail(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1, shared_home=True)  # what the cap protects: a home the nodes share
    loaded = write_config(cluster, tmp_path, sock_dir)
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    cli = Cli(loaded.file)
    async with running(loaded) as (_, client):
        spec = job("chatty", f"{sys.executable} {writer}", output_limit="64KiB")
        job_id = (await client.call("submit", spec=spec))["id"]
        shown = await until(client, job_id, lambda j: j["attempts"] and j["attempts"][0]["runs"][0]["pid"], "start")
        log = Path(shown["attempts"][0]["runs"][0]["run_dir"]) / "output.log"

        async def follow() -> str:
            return "".join([chunk async for chunk in client.stream("logs", job=job_id, follow=True)])

        async def sizes() -> list[int]:
            """output.log's size on the node every 10 ms while the job runs."""
            seen: list[int] = []
            for looks in range(int(WAIT / 0.01)):
                with contextlib.suppress(FileNotFoundError):
                    seen.append(log.stat().st_size)
                if looks % 20 == 0 and (await client.call("show", job=job_id))["status"] != "running":
                    break
                await asyncio.sleep(0.01)
            return seen

        followed, seen = await asyncio.wait_for(asyncio.gather(follow(), sizes()), WAIT)
        shown = await finished(client, job_id)
        assert shown["status"] == "succeeded", shown["message"]

        # the cut follows the file: between two looks a fast rank may pass the limit for a moment on a busy machine
        assert len(seen) > 100 and max(seen) <= 2 * LIMIT, f"output.log reached {max(seen)} bytes"
        assert log.stat().st_size <= LIMIT
        data = log.read_text()
        assert data.endswith(line(LINES - 1))  # the last line written is in the kept tail
        head, _, kept = data.partition("\n")
        dropped = HEADER.match(head)
        assert dropped is not None, head
        # what was dropped and what was kept: all of it, but for a write in the instant of a cut (copytruncate's)
        assert LINES * 101 * 0.99 <= int(dropped.group(1)) + len(kept) <= LINES * 101

        # logs: the node's line that says output was dropped, once at the top, then the newest lines in order
        whole = await log_of(client, job_id)
        assert whole == data
        found, markers = numbers(whole)
        assert markers == 1 and found[-1] == LINES - 1  # in order, and any line missing said so (numbers)
        assert "".join([c async for c in client.stream("logs", job=job_id, tail=2)]) == line(LINES - 2) + line(
            LINES - 1
        )

        # logs --follow, started early and read across every cut: lines in order, each once and whole, to the last;
        # where the follower fell behind a cut (it is pushed every 0.1 s: 50 kB of output here, and a cut keeps
        # 16 KiB), a line says so
        found, markers = numbers(followed)
        assert found[-1] == LINES - 1 and len(found) > 1000
        assert markers < len(found) // 20, f"{markers} gaps in {len(found)} lines"

        printed = await asyncio.to_thread(cli, "logs", str(job_id))
        assert printed.stdout.startswith(head + "\n") and printed.stdout.endswith(line(LINES - 1))


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
async def test_only_an_admins_job_may_have_more_output_than_the_cluster_allows(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler={"output_limit": "1MiB"})
    sock_dir.chmod(0o755)
    async with running(loaded) as (_, client):
        for asked, said in (("2MiB", "2 MiB"), ("off", "off")):
            refused = await as_nobody(loaded.socket_path, "submit", spec=job("big", "true", output_limit=asked))
            assert refused["error"]["type"] == "PermissionDenied"
            assert (
                f"output_limit {said} is over this cluster's scheduler.output_limit (1 MiB)"
                in refused["error"]["message"]
            )
        assert (await client.call("jobs")) == []
        lower = await as_nobody(loaded.socket_path, "predict", spec=job("small", "true", output_limit="512KiB"))
        assert "error" not in lower, lower
        admins = await client.call("submit", spec=job("big", "true", output_limit="2MiB"))  # root: an admin
        assert (await finished(client, admins["id"]))["status"] == "succeeded"
