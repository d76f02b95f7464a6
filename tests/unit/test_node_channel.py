"""The node channel's node side (scheduler/node/channel.py), run here for real as the scheduler starts it: the
loader under ``python -c``, the supervisor bundle sent on its stdin, requests and answers as JSON lines, real runs
started by it, and the events it pushes without being asked."""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.node.bundle import python_stdin_script, script
from ftconsole.scheduler.node.channel import loader

WAIT = 20.0


class Channel:
    def __init__(self, params: dict[str, Any]) -> None:
        program = python_stdin_script(script("supervisor"), {"action": "channel", "node": "node01", **params}).encode()
        self.proc = subprocess.Popen([sys.executable, "-c", loader()], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{len(program)}\n".encode() + program)
        self.proc.stdin.flush()
        self.ids = iter(range(1, 1000))
        self.events: list[dict[str, Any]] = []

    def line(self, timeout: float = WAIT) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"nothing from the channel in {timeout}s"
        text = self.proc.stdout.readline()
        assert text, "the channel ended"
        doc: dict[str, Any] = json.loads(text)
        return doc

    def send(self, raw: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw)
        self.proc.stdin.flush()

    def ask(self, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        self.send(json.dumps({"id": number, "params": {"node": "node01", **params}}).encode() + b"\n")
        while True:
            doc = self.line()
            if doc.get("id") == number:
                answer: dict[str, Any] = doc["doc"]
                return answer
            self.events.append(doc)

    def event(self, kind: str, timeout: float = WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for doc in self.events:
            if doc.get("event") == kind:
                self.events.remove(doc)
                return doc
        while True:
            doc = self.line(max(0.0, deadline - time.monotonic()))
            if doc.get("event") == kind:
                return doc
            self.events.append(doc)


@pytest.fixture
def channel() -> Iterator[Channel]:
    opened = Channel({})
    try:
        yield opened
    finally:
        if opened.proc.poll() is None:
            opened.proc.kill()
        opened.proc.wait(10)
        for pipe in (opened.proc.stdin, opened.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def start(channel: Channel, run_dir: Path, command: str) -> dict[str, Any]:
    return channel.ask(action="start", run_dir=str(run_dir), argv=["sh", "-c", command],
                       env={"PATH": os.environ["PATH"]}, workdir=str(run_dir.parent), files={}, grace=2)  # fmt: skip


def test_a_channel_says_hello_answers_in_order_and_refuses_another_user(channel: Channel) -> None:
    hello = channel.line()
    assert hello["event"] == "hello" and hello["supervisor"] == 2 and hello["user"] is None
    assert channel.ask(action="port")["port"] > 0
    assert channel.ask(action="account")["uid"] == os.geteuid()
    assert "runs" in channel.ask(action="status", run_dirs=[])
    refused = channel.ask(action="status", run_dirs=[], user="someone-else")
    assert "runs as None, not 'someone-else'" in refused["error"]
    assert "unknown action" in channel.ask(action="nothing")["error"]


def test_a_line_that_is_not_a_request_is_answered_so_and_the_channel_goes_on(channel: Channel) -> None:
    assert channel.line()["event"] == "hello"
    channel.send(b"not json\n")
    bad = channel.line()
    assert bad["id"] is None and "not one" in bad["doc"]["error"]
    channel.send(b'{"id": 5, "params": [1]}\n')
    assert "not an object" in channel.line()["doc"]["error"]
    assert channel.ask(action="port")["port"] > 0


def test_a_runs_exit_is_pushed_without_being_asked(channel: Channel, tmp_path: Path) -> None:
    run_dir = tmp_path / "7" / "1" / "0"
    started = start(channel, run_dir, "sleep 1; exit 3")
    assert started["started"] is True
    read = channel.ask(action="status", run_dirs=[str(run_dir)])
    assert read["runs"][0]["status"]["state"] == "running"
    event = channel.event("run")  # nothing asked since the read
    assert event == {"event": "run", "run_dir": str(run_dir), "state": "exited", "was": "running", "step": "command"}
    assert channel.ask(action="status", run_dirs=[str(run_dir)])["runs"][0]["status"]["exit_code"] == 3
    beat = channel.event("heartbeat")
    assert beat["watching"] == 1


def test_a_supervisor_killed_is_pushed_as_its_run_lost(channel: Channel, tmp_path: Path) -> None:
    run_dir = tmp_path / "8" / "1" / "0"
    status = start(channel, run_dir, "exec sleep 30")["status"]
    channel.ask(action="status", run_dirs=[str(run_dir)])
    os.killpg(status["pgid"], 9)  # the step's group first, so nothing of the run is left
    os.kill(status["supervisor_pid"], 9)  # then its supervisor: it writes nothing any more
    event = channel.event("run")
    assert event["state"] == "lost" and event["was"] == "running"


def test_the_channel_ends_with_its_stdin_and_its_runs_go_on(channel: Channel, tmp_path: Path) -> None:
    run_dir = tmp_path / "9" / "1" / "0"
    start(channel, run_dir, "sleep 1; echo done")
    assert channel.proc.stdin is not None
    channel.proc.stdin.close()  # the SSH connection went
    assert channel.proc.wait(WAIT) == 0
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        status = json.loads((run_dir / "status.json").read_text())
        if status["state"] != "running":
            break
        time.sleep(0.1)
    assert status["state"] == "exited" and status["exit_code"] == 0
    assert (run_dir / "output.log").read_text() == "done\n"


def test_a_start_sent_again_through_the_same_channel_answers_and_starts_nothing(
    channel: Channel, tmp_path: Path
) -> None:
    """The claim's lock is released after each start: a start sent again (its first answer was lost) gets the
    run's status from the same long-lived process instead of waiting for a lock it holds itself."""
    run_dir = tmp_path / "10" / "1" / "0"
    params = {"run_dir": str(run_dir), "argv": ["sh", "-c", "echo once >> count; sleep 30"], "token": "t-1",
              "env": {"PATH": os.environ["PATH"]}, "workdir": str(tmp_path), "files": {}, "grace": 2}  # fmt: skip
    first = channel.ask(action="start", **params)
    assert first["started"] is True
    again = channel.ask(action="start", **params)
    assert again["started"] is False and again["status"]["state"] == "running"
    os.killpg(first["status"]["pgid"], 9)
    assert (tmp_path / "count").read_text() == "once\n"


def test_a_followed_file_is_pushed_as_it_grows_and_no_more_once_unfollowed(channel: Channel, tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(b"before\n")
    channel.event("hello")
    answer = channel.ask(action="follow", path=str(log), offset=len(b"before\n"))
    number = answer["follow"]
    with log.open("ab") as fh:
        fh.write(b"one\n")
        fh.flush()
        first = channel.event("log")
        fh.write(b"two\n")
        fh.flush()
        second = channel.event("log")
    got = [(e["follow"], e["offset"], base64.b64decode(e["data"])) for e in (first, second)]
    assert got == [(number, 7, b"one\n"), (number, 11, b"two\n")]
    assert channel.ask(action="unfollow", follow=number) == {"following": 0}
    with log.open("ab") as fh:
        fh.write(b"three\n")
    heartbeat = channel.event("heartbeat", timeout=10)  # the next line after 5 s: no "log" came before it
    assert heartbeat["event"] == "heartbeat" and not [e for e in channel.events if e.get("event") == "log"]


def test_a_follow_that_is_not_one_is_refused_and_the_channel_goes_on(channel: Channel) -> None:
    channel.event("hello")
    assert "error" in channel.ask(action="follow", offset=3)  # no path
    assert "error" in channel.ask(action="follow", path="/x", offset="nope")
    assert channel.ask(action="status", run_dirs=[])["runs"] == []
