"""The exit codes of `ftconsole` (README.md, "Exit codes"), run as a user runs it, a subprocess with no scheduler:
0 ok, 1 a failure, 2 bad input, 3 no scheduler running; and with `--json`, an error as one JSON document on stdout
(the text line stays on stderr)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler import errors

TIMEOUT = 60

CONFIG = """\
state_dir: {tmp}/state
ssh: {{known_hosts: {tmp}/known_hosts}}
nodes:
  - name: gpu01
"""


@pytest.fixture
def ft(tmp_path: Path, sock_dir: Path) -> Any:
    """`ftconsole ARGS` in a subprocess with a config whose scheduler is not running: its CompletedProcess."""
    (tmp_path / "known_hosts").touch()
    config = tmp_path / "cluster.yaml"
    config.write_text(CONFIG.format(tmp=tmp_path) + f"api: {{socket: {sock_dir / 'ft.sock'}}}\n")
    (tmp_path / "job.yaml").write_text("name: hello\ncommand: 'true'\n")
    (tmp_path / "bad.yaml").write_text("name: hello\ncommand: 'true'\nnodes: 0\nmodee: single\n")
    (tmp_path / "broken.yaml").write_text("nodes: 3\n")
    env = {**os.environ, "FTCONSOLE_CONFIG": str(config), "HOME": str(tmp_path), "TERM": "dumb"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ftconsole.cli", *args],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip

    return run


def test_the_codes_of_the_error_classes() -> None:
    assert (errors.FtError.exit_code, errors.UsageError.exit_code, errors.NotRunning.exit_code) == (1, 2, 3)
    assert errors.ConfigError.exit_code == errors.JobSpecError.exit_code == errors.NotFound.exit_code == 2
    # each code has one meaning: only "not running" uses 3
    codes = {cls.__name__: cls.exit_code for cls in vars(errors).values() if isinstance(cls, type)
             and issubclass(cls, errors.FtError)}  # fmt: skip
    assert {name for name, code in codes.items() if code == 3} == {"NotRunning"}
    assert set(codes.values()) == {1, 2, 3}


CASES = [
    # (what, arguments, exit code, what stderr says)
    ("ok", ["config", "example"], 0, ""),
    ("a failure", ["lab", "fault", "--dir", "no-lab", "lab01", "--heal"], 1, "ftconsole: lab: no lab is running"),
    ("an unknown command", ["nosuch"], 2, "ftconsole: error: argument COMMAND: invalid choice: 'nosuch'"),
    ("an unknown option", ["jobs", "--bogus"], 2, "ftconsole: error: unrecognized arguments: --bogus"),
    ("a missing argument", ["submit"], 2, "the following arguments are required: JOB.yaml"),
    ("a bad value", ["nodes", "--state", "sleepy"], 2, "ftconsole: bad input: unknown state in sleepy"),
    ("an invalid job spec", ["submit", "bad.yaml"], 2, "ftconsole: invalid job spec:\n  bad.yaml:3: nodes:"),
    ("an invalid config", ["--config", "broken.yaml", "jobs"], 2, "ftconsole: invalid config:\n  broken.yaml:1"),
    ("no scheduler running", ["submit", "job.yaml"], 3, "ftconsole: not running: no scheduler is serving"),
    ("no scheduler, waiting", ["submit", "job.yaml", "--wait"], 3, "ftconsole: not running:"),
]


@pytest.mark.parametrize(("what", "args", "code", "says"), CASES, ids=[c[0] for c in CASES])
def test_exit_codes(ft: Any, what: str, args: list[str], code: int, says: str) -> None:
    done = ft(*args)
    assert done.returncode == code, (what, done.stdout, done.stderr)
    assert says in done.stderr
    if code != 0:
        assert done.stdout == ""  # without --json, errors are on stderr alone


JSON_CASES = [
    # (arguments, exit code, title, the start of the message)
    (["submit", "job.yaml", "--json"], 3, "not running", "no scheduler is serving"),
    (["lab", "status", "--dir", "no-lab", "--json"], 3, None, None),  # its own document: {"running": false}
    (["lab", "fault", "--dir", "no-lab", "lab01", "--heal", "--json"], 1, "lab", "no lab is running"),
    (["jobs", "--json", "--bogus"], 2, "bad input", "unrecognized arguments: --bogus"),
    (["alerts", "7", "--json"], 2, "bad input", "argument action: invalid choice: '7'"),
    (["nodes", "--state", "sleepy", "--json"], 2, "bad input", "unknown state in sleepy"),
    (["submit", "bad.yaml", "--json"], 2, "invalid job spec", "bad.yaml:3: nodes:"),
]


@pytest.mark.parametrize(("args", "code", "title", "message"), JSON_CASES, ids=[" ".join(c[0]) for c in JSON_CASES])
def test_errors_under_json_are_one_document_on_stdout(
    ft: Any, args: list[str], code: int, title: str | None, message: str | None
) -> None:
    done = ft(*args)
    assert done.returncode == code, (done.stdout, done.stderr)
    document = json.loads(done.stdout)  # one document, nothing else on stdout
    if title is None:
        assert "error" not in document
        return
    error = document["error"]
    assert (error["title"], error["exit_code"]) == (title, code)
    assert error["message"].startswith(message), error
    assert done.stderr.startswith((f"ftconsole: {title}:", "usage: ftconsole"))  # the text stays on stderr, for people


def test_a_json_error_carries_the_problems_and_the_usage(ft: Any) -> None:
    spec = json.loads(ft("submit", "bad.yaml", "--json").stdout)["error"]
    assert [(p["file"], p["line"], p["key"]) for p in spec["problems"]] == [("bad.yaml", 3, "nodes"),
                                                                             ("bad.yaml", 4, "modee")]  # fmt: skip
    assert set(spec) == {"title", "message", "exit_code", "problems"}
    usage = json.loads(ft("submit", "--json").stdout)["error"]
    assert usage["usage"].startswith("usage: ftconsole submit") and "problems" not in usage
    # after `--` an argument is not an option: no JSON asked for
    done = ft("nosuch", "--", "--json")
    assert done.returncode == 2 and done.stdout == ""


def test_config_check_json_keeps_its_own_document(ft: Any) -> None:
    done = ft("--config", "broken.yaml", "config", "check", "--json")
    assert done.returncode == 2
    document = json.loads(done.stdout)
    assert document["ok"] is False and "error" not in document
    assert ("broken.yaml", 1, "nodes") in [(p["file"], p["line"], p["key"]) for p in document["problems"]]


@pytest.mark.parametrize("args", [["bogus", "--json"], ["completion", "bash"]])
def test_a_reader_that_went_away_costs_no_traceback(args: list[str], tmp_path: Path) -> None:
    """`ftconsole ... | head`: stdout closed before anything is written, an error under --json or plain output;
    the exit code is kept (2: bad input, 1: the output was lost) and stderr has no traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ftconsole.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            env={**os.environ, "HOME": str(tmp_path)},
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == (2 if args[0] == "bogus" else 1), done.stderr
