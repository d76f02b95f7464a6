"""torch's flight recorder trace (debug.torch_trace): the launch's environment and hook, the spec key's rules,
and the hook itself run by a real Python with another sitecustomize after it on the path. (The trace served by
real torch ranks and read at a hang: tests/peers/test_hang_evidence.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftconsole.debug_cli import evidence_text
from ftconsole.scheduler.decide.deepspeed import DEEPSPEED_ENV
from ftconsole.scheduler.decide.launcher import TORCH_HOOK, TORCH_HOOK_SOURCE, plan_launch
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.evidence import _units
from ftconsole.scheduler.spec.jobspec import parse_jobspec
from tests.unit.test_launcher import job


def test_a_pytorch_rank_gets_the_hook_first_on_its_path_and_the_recorder_sized() -> None:
    plan = plan_launch(job("pytorch", "python train.py", torch_trace=True, env={"PYTHONPATH": "/opt/mine"}))
    for rank in plan.ranks:
        assert rank.files[TORCH_HOOK] == TORCH_HOOK_SOURCE
        assert rank.env["PYTHONPATH"] == "/home/me/.ftconsole/runs/j-0042/1/torch-hook:/opt/mine"  # the attempt's
        assert rank.env["FT_TORCH_TRACE"] == "1"
        assert rank.env["TORCH_FR_BUFFER_SIZE"] == rank.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    mine = plan_launch(job("pytorch", "python train.py", torch_trace=True, env={"TORCH_FR_BUFFER_SIZE": "50"}))
    assert mine.ranks[0].env["TORCH_FR_BUFFER_SIZE"] == "50"  # the job's own size stands
    off = plan_launch(job("pytorch", "python train.py"))
    assert TORCH_HOOK not in off.ranks[0].files and "FT_TORCH_TRACE" not in off.ranks[0].env


def test_deepspeeds_runner_carries_the_hooks_path_and_the_sizes_to_the_ranks_it_starts() -> None:
    plan = plan_launch(job("pytorch-deepspeed", "deepspeed train.py", torch_trace=True))
    assert all(rank.files[TORCH_HOOK] == TORCH_HOOK_SOURCE for rank in plan.ranks)  # prepared on every node
    env_file = next(v for k, v in plan.ranks[0].files.items() if k == DEEPSPEED_ENV).decode()
    for line in ("FT_TORCH_TRACE=1", "TORCH_FR_BUFFER_SIZE=2000", "TORCH_NCCL_TRACE_BUFFER_SIZE=2000"):
        assert line in env_file.splitlines(), env_file
    # PYTHONPATH travels by deepspeed's own export of its environment (PYTHON*), where "~/" was expanded
    assert plan.ranks[0].env["PYTHONPATH"] == "/home/me/.ftconsole/runs/j-0042/1/torch-hook"
    assert "PYTHONPATH" not in env_file


def test_the_key_is_on_in_mode_pytorch_may_be_turned_off_and_is_refused_where_it_cannot_work() -> None:
    base = "name: t\ncommand: python train.py\n"
    assert parse_jobspec(base + "mode: pytorch\n").torch_trace
    assert not parse_jobspec(base + "mode: pytorch\ndebug: {torch_trace: false}\n").torch_trace
    assert not parse_jobspec(base + "mode: single\n").torch_trace
    assert parse_jobspec("name: t\nmode: pytorch-deepspeed\ncommand: deepspeed train.py\n").torch_trace
    with pytest.raises(ConfigError, match=r"debug\.torch_trace: torch's trace is kept in modes pytorch \(with"):
        parse_jobspec(base + "mode: single\ndebug: {torch_trace: true}\n")
    # with an image: in mode pytorch (the hook's folder is shared with the container), not through deepspeed's
    assert parse_jobspec(base + "mode: pytorch\nimage: nvcr.io/nvidia/pytorch:24.05-py3\n").torch_trace
    image = "image: nvcr.io/nvidia/pytorch:24.05-py3\n"
    assert not parse_jobspec("name: t\nmode: pytorch-deepspeed\ncommand: deepspeed train.py\n" + image).torch_trace


CHAINED = "import os\nos.environ['CHAINED'] = 'yes'\n"


def _python(tmp_path: Path, env: dict[str, str], other_text: str = CHAINED) -> subprocess.CompletedProcess[str]:
    hook = tmp_path / "torch-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_bytes(TORCH_HOOK_SOURCE)
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    (other / "sitecustomize.py").write_text(other_text)
    code = "import os, sys, threading; print(os.environ.get('CHAINED'), [t.name for t in threading.enumerate()])"
    full = {**os.environ, "PYTHONPATH": f"{hook}:{other}", **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=30)


def test_the_hook_hands_over_to_the_next_sitecustomize_and_waits_for_torch_only_when_asked(tmp_path: Path) -> None:
    asked = _python(tmp_path, {"FT_TORCH_TRACE": "1"})
    assert asked.returncode == 0 and asked.stderr == "", asked.stderr
    assert asked.stdout.startswith("yes ") and "ftconsole-torch-trace" in asked.stdout  # chained; its thread waits
    quiet = _python(tmp_path, {"FT_TORCH_TRACE": "0"})
    assert quiet.stdout.startswith("yes ") and "ftconsole-torch-trace" not in quiet.stdout
    broken = _python(tmp_path, {"FT_TORCH_TRACE": "1"}, "raise RuntimeError('the site is broken')\n")
    assert broken.returncode == 0 and "the site is broken" in broken.stderr  # said as it would be without the hook


def _doc(collectives: list[list[dict[str, Any]]]) -> dict[str, Any]:
    ranks = [
        {"rank": n, "node": f"gpu0{n}", "pid": 100 + n, "state": "S", "wchan": "futex_wait", "cpu": 0.0,
         "collective": "all_reduce", "where": "x", "stack": [], "gone": None, "collectives": c}
        for n, c in enumerate(collectives)
    ]  # fmt: skip
    verdict = {"rank": None, "node": None, "reason": "no rank stands out", "rule": "none"}
    return {"job": 7, "attempt": 1, "time": 0.0, "seconds": 1.0, "verdict": verdict, "ranks": ranks}


def test_the_debug_table_shows_each_ranks_last_collective_when_there_is_a_trace() -> None:
    waiting = [{"group": "0", "seq": 42, "op": "all_reduce", "done": False}]
    past = [{"group": "0", "seq": 41, "op": "all_reduce", "done": True}]
    text = evidence_text(_doc([waiting, past]))
    header = next(line for line in text.splitlines() if line.startswith("RANK"))
    assert "LAST COLLECTIVE" in header
    assert "all_reduce #42 " in text and "all_reduce #41, done" in text
    assert "LAST COLLECTIVE" not in evidence_text(_doc([[], []]))  # no trace: no column


def test_a_nodes_trace_becomes_the_verdicts_and_a_bad_one_is_left_out() -> None:
    process = {"pid": 5, "ppid": 1, "python": True, "state": "S", "env": {"RANK": "3"}, "cpu_moved": 0.0}
    good = {**process, "collectives": {"groups": {"0": {"seq": 9, "op": "broadcast", "done": True}}}}
    bad = {**process, "collectives": {"groups": {"0": {"seq": "nine"}}}}
    [rank] = _units({"node": "gpu01", "rank": 0, "sample": 0.5, "processes": [good]})
    assert rank.trace == (("0", 9, "broadcast", True),) and rank.last("0") == (9, "broadcast", True)
    [rank] = _units({"node": "gpu01", "rank": 0, "sample": 0.5, "processes": [bad]})
    assert rank.trace == () and rank.last("0") is None
