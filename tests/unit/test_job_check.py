"""`ftconsole check JOB.yaml`: a job spec checked offline, alone or against the cluster config, every problem in
one run, nothing written; a job spec's problems are headed `invalid job spec`; `nodes --state` refuses a state
that does not exist."""

from __future__ import annotations

import io
import json
import os
import pwd
from pathlib import Path

import pytest

from ftconsole.cli import main
from ftconsole.scheduler.errors import ConfigError, JobSpecError
from ftconsole.scheduler.spec.config import DEFAULT_CONFIG_PATHS
from ftconsole.scheduler.spec.jobspec import parse_jobspec

ME = pwd.getpwuid(os.getuid()).pw_name

CONFIG = f"""\
state_dir: {{tmp}}/state
ssh: {{{{known_hosts: {{tmp}}/known_hosts}}}}
specs:
  h100: {{{{gpus_per_node: 8}}}}
projects:
  vision: {{{{}}}}
quotas:
  users:
    {ME}: {{{{gpus: 8}}}}
nodes:
  - name: gpu[01-02]
"""

GOOD = "name: train\nmode: pytorch\nnodes: 1\nspec: h100\nproject: vision\ncommand: python train.py\n"
BAD = "name: train\ncommand: true\nnodes: 0\nprojet: vision\nmode: pytorchh\nmax_runtime: 5q\n"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "known_hosts").touch()
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG.format(tmp=tmp_path))
    return path


def job(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "state").exists(), "check made the state folder (a store)"
    assert not list(tmp_path.rglob("*.db")), "check made a store"


def test_a_good_spec_is_ok_and_nothing_is_written(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, GOOD)
    assert main(["--config", str(config), "check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok (job train, checked against {config})")
    assert main(["--config", str(config), "check", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"ok": True, "file": str(path), "config": str(config), "job": "train", "problems": [], "notes": []}
    nothing_written(tmp_path)


def test_every_problem_of_a_bad_spec_in_one_run(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, BAD)
    assert main(["--config", str(config), "check", str(path), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    got = [(p["line"], p["key"], p["message"]) for p in doc["problems"]]
    assert got == [
        (2, "command", 'must be text (quote it: `command: "true"`), not a boolean'),
        (3, "nodes", "must be at least 1, not 0"),
        (4, "projet", "unknown key: did you mean 'project'?"),
        (5, "mode", "must be one of: single, pytorch, pytorch-deepspeed, horovod, mpich, tensorflow; not 'pytorchh'"),
        (6, "max_runtime", "expected a duration such as 30s, 5m or 12h, got '5q'"),
    ]
    nothing_written(tmp_path)


def test_a_bad_spec_is_headed_invalid_job_spec(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, BAD)
    assert main(["--config", str(config), "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ftconsole: invalid job spec:\n") and f"{path}:4: projet: unknown key" in err
    assert main(["--config", str(config), "submit", str(path)]) == 2  # submit's spec problems: the same title
    assert capsys.readouterr().err.startswith("ftconsole: invalid job spec:\n")
    with pytest.raises(JobSpecError) as caught:
        parse_jobspec(BAD)
    assert isinstance(caught.value, ConfigError) and caught.value.title == "invalid job spec"


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        (GOOD.replace("spec: h100", "spec: h200"), 4, "spec", "spec 'h200' is not defined in the cluster config"),
        (GOOD.replace("project: vision", "project: speech"), 5, "project", "project 'speech' is not declared"),
        (GOOD.replace("nodes: 1", "nodes: 2"), 4, "spec", "takes 16 GPUs at once, more than a quota allows"),
        (GOOD + "node_names: gpu09\n", 7, "node_names", "node_names not in the cluster config: gpu09"),
    ],
)
def test_the_spec_is_checked_against_the_cluster_config(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, key: str, words: str
) -> None:
    path = job(tmp_path, text)
    assert main(["--config", str(config), "check", str(path), "--json"]) == 2
    (problem,) = json.loads(capsys.readouterr().out)["problems"]
    assert (problem["line"], problem["key"]) == (line, key) and words in problem["message"], problem
    nothing_written(tmp_path)


def test_a_spec_from_stdin(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(BAD))
    assert main(["--config", str(config), "check", "-", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["file"] == "<stdin>" and [p["line"] for p in doc["problems"]] == [2, 3, 4, 5, 6]
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD))
    assert main(["--config", str(config), "check", "-"]) == 0


def test_with_no_cluster_config_the_spec_is_checked_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    if any(Path(os.path.expanduser(p)).is_file() for p in DEFAULT_CONFIG_PATHS):
        pytest.skip("this host has a cluster config in a place searched")
    path = job(tmp_path, GOOD.replace("spec: h100", "spec: anything"))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "checked alone" in out and "note: no cluster config found" in out
    assert main(["check", str(job(tmp_path, BAD)), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"] is None and len(doc["problems"]) == 5
    assert not (tmp_path / ".local").exists()  # no state folder, no store


def test_an_invalid_cluster_config_is_reported_with_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = job(tmp_path, "nodes: [{name: a, port: 0}]\n", "cluster.yaml")
    assert main(["--config", str(config), "check", str(job(tmp_path, GOOD))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ftconsole: invalid config:\n") and "nodes[0].port: must be at least 1, not 0" in err


def test_nodes_refuses_an_unknown_state(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(config), "nodes", "--state", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown state in bogus" in err and "healthy" in err and "isolated" in err


def test_check_names_every_refusal_of_the_scheduler_at_once(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only the first: an undefined spec, an undeclared project and an unknown node, in one run."""
    text = (
        GOOD.replace("spec: h100", "spec: h200").replace("project: vision", "project: speech") + "node_names: gpu09\n"
    )
    path = job(tmp_path, text)
    assert main(["--config", str(config), "check", str(path), "--json"]) == 2
    said = [p["message"] for p in json.loads(capsys.readouterr().out)["problems"]]
    assert any("spec 'h200' is not defined" in m for m in said), said
    assert any("project 'speech' is not declared" in m for m in said), said
    assert any("node_names not in the cluster config: gpu09" in m for m in said), said
    nothing_written(tmp_path)
