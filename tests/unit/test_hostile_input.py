"""Hostile and broken files (issue 11): not UTF-8, alias bombs, deep nesting, odd YAML, configs without nodes.

Each is refused with exit 2 and a problem naming the file (and line), never a traceback, and quickly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftconsole.cli import main
from ftconsole.scheduler import yamlfile
from ftconsole.scheduler.config import load_config
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.jobspec import load_jobspec, parse_jobspec

GOOD_CONFIG = "state_dir: {state}\nnodes:\n  - name: gpu[1-2]\n    host: 10.0.0.[1-2]\n"


def bomb(levels: int) -> str:
    """The "billion laughs": each level is nine aliases of the one before, 9**levels values in all."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(GOOD_CONFIG.format(state=tmp_path / "state"))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["submit", "predict"])
def test_job_file_not_utf8(tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_bytes(b"name: train\ncommand: python \xff\xfetrain.py\n")
    code, err = run(capsys, "--config", str(config), command, str(job))
    assert code == 2
    assert f"{job}:2: not UTF-8 text: byte offset 28 (0xff)" in err
    assert "Traceback" not in err


def test_config_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    code, err = run(capsys, "--config", str(path), "config", "check")
    assert code == 2
    assert f"{path}:1: not UTF-8 text: byte offset 0 (0x89)" in err


@pytest.mark.parametrize("command", [("config", "check"), ("submit", "JOB")])
def test_alias_bomb_is_refused_before_it_expands(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """387 million values: expanded, it would take minutes and gigabytes; the count stops it at MAX_VALUES (the
    suite's timeout is the bound on time: a wall-clock assertion here failed on a loaded machine)."""
    target = tmp_path / "bomb.yaml"
    target.write_text(bomb(9))
    argv = ["--config", str(target if command[0] == "config" else config), *command]
    code, err = run(capsys, *[str(target) if a == "JOB" else a for a in argv])
    assert code == 2
    assert f"expands to more than {yamlfile.MAX_VALUES} values" in err and str(target) in err


def test_small_alias_use_still_loads() -> None:
    data, _ = yamlfile.parse(bomb(3), "f")
    assert len(data["l2"]) == 9 and data["l2"][0] == data["l1"]


@pytest.mark.parametrize(
    ("text", "line", "path", "message"),
    [
        ("a: &x [1, *x]\n", 1, "a[1]", "a cycle"),
        ("[" * 5000 + "]" * 5000, None, "", f"nested more than {yamlfile.MAX_DEPTH} levels"),
        ("a:\n" + "".join(" " * i + "b:\n" for i in range(1, 80)), 66, "a.b", "nested more than"),
        ("name: x\nenv: !custom {a: 1}\n", 2, "env", "bad value: unsupported tag '!custom'"),
        ("name: x\nlabel: !weird 3\n", 2, "label", "bad value: could not determine a constructor"),
        ("name: x\nwhen: 2024-13-45\n", 2, "when", "bad value: month must be in 1..12"),
        ("name: x\n? [a, b]\n: 1\n", 2, "", "a key must be a plain value"),
        ("name: x\n? {a: 1}\n: 1\n", 2, "", "a key must be a plain value"),
    ],
)
def test_odd_yaml_is_a_located_problem(text: str, line: int | None, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_jobspec(text, "job.yaml")
    (problem,) = err.value.problems
    assert (problem.file, problem.line) == ("job.yaml", line)
    assert problem.path.startswith(path) and message in problem.message


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"# " + b"x" * yamlfile.MAX_FILE_BYTES + b"\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_jobspec(path)


@pytest.mark.parametrize(
    ("text", "line", "path", "message"),
    [
        ("state_dir: s\n", 1, "nodes", "no nodes"),
        ("state_dir: s\nnodes: []\n", 2, "nodes", "no nodes"),
    ],
)
def test_config_check_refuses_no_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, path: str, message: str
) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(text)
    load_config(cfg)  # it loads (a CLI needs only its socket), but `config check` says it cannot schedule
    code, err = run(capsys, "--config", str(cfg), "config", "check")
    assert code == 2
    assert f"{cfg}:{line}: {path}: {message}" in err


@pytest.mark.parametrize(
    ("node", "path"),
    [
        ('{name: a, host: ""}', "nodes[0].host"),
        ('{name: a, host: "  "}', "nodes[0].host"),
        ('{name: a, host: "-oProxyCommand=touch /tmp/x"}', "nodes[0].host"),
        ('{name: a, host: "alice@gpu1"}', "nodes[0].host"),
        ('{name: a, host: "gpu 1"}', "nodes[0].host"),
        ('{name: "-oProxyCommand=x"}', "nodes[0]"),
        ('{name: "a/b"}', "nodes[0]"),
    ],
)
def test_node_without_a_reachable_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], node: str, path: str
) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f"state_dir: s\nnodes:\n  - {{name: ok, host: 10.0.0.1}}\n  - {node}\n".replace("[0]", "[1]"))
    code, err = run(capsys, "--config", str(cfg), "config", "check")
    assert code == 2
    assert f"{cfg}:4: {path.replace('[0]', '[1]')}:" in err


@pytest.mark.parametrize("host", ["gpu-01.example.org", "10.0.0.7", "fe80::1%eth0", "::1", "node_3"])
def test_real_addresses_are_accepted(tmp_path: Path, host: str) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f'state_dir: s\nnodes:\n  - {{name: a, host: "{host}"}}\n')
    assert load_config(cfg).cluster.node_list()[0].host == host
