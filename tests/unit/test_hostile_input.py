"""Hostile and broken files (issue 11): not UTF-8, alias bombs, deep nesting, odd YAML, configs without nodes.

Each is refused with exit 2 and a problem naming the file (and line), never a traceback, and quickly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest

from ftconsole.cli import main
from ftconsole.scheduler.errors import ConfigError, NotFound, UsageError
from ftconsole.scheduler.nodeops import NODESET_FLOOR, ClusterService
from ftconsole.scheduler.serve import daemon
from ftconsole.scheduler.serve.daemon import MAX_LIMIT
from ftconsole.scheduler.spec import yamlfile
from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.spec.jobspec import load_jobspec, parse_jobspec
from ftconsole.scheduler.spec.nodesets import expand_nodeset, nodeset_size

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
    # the YAML's own problem, with those of the spec's keys (every problem in one run)
    problem = next(p for p in err.value.problems if message in p.message)
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


# -- requests bounded before they cost anything (issue 26) ---------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "size"),
    [
        ("gpu01", 1),
        ("gpu[01-16]", 16),
        ("gpu[01-16],login1", 17),
        ("gpu[001-128]-ib[0-3]", 512),  # two brackets: their product
        ("n[1-2]x[3-4]y[5-6]", 8),
        ("n[1-8,10-20/2]", 14),  # several ranges, a step
        ("n[0001-1000/7]", 143),  # padded, stepped
        ("n1[0-5]", 6),  # leading digits join the range
        ("n[1-5]0", 5),  # trailing digits too
        ("n[-8--4]", 5),  # negative ranges (ClusterShell reads them)
        ("n[1-10]!n[2-3]", 12),  # set operators: an upper bound, the sum of the terms
        ("n[1-10]&n[5-20]", 26),
        ("n[1-10]^n[5-20]", 26),
        (" n1 , n2 ", 2),
        ("n[1-20000000]", 20_000_000),
        ("n[1-100000000]-[1-100000000]", 10**16),
        ("n[1-100000000,garbage]", 100_000_000),  # the readable ranges before the garbage still count
        ("n[1-100000000", 100_000_000),  # an unclosed bracket too
        ("n[1-100000000]-[x]", 100_000_000),  # an unreadable bracket counts 1, not 0
        ("n[9-1]", 1),  # nothing readable: ClusterShell says what is wrong
        ("a,,b", 3),
        ("", 1),
        ("n[" + "9" * 5000 + "]", 1),  # a number too long to read
        ("n[1-1000000]" * 64, 1 << 64),  # counted up to 2**64, never multiplied out
    ],
)
def test_nodeset_size_is_counted_without_expanding(expr: str, size: int) -> None:
    assert nodeset_size(expr) == size


@pytest.mark.parametrize(
    "expr", ["gpu[01-16]", "n[1-8,10-20/2]", "n1[0-5]", "n[1-5]0", "n[-8--4]", "x[1-3]-[01-02]", " n1 , n2 ", "n[1,1]"]
)
def test_nodeset_size_bounds_what_clustershell_expands(expr: str) -> None:
    assert nodeset_size(expr) >= len(expand_nodeset(expr))


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("n[1-20000000]", "'n[1-20000000]' names up to 20,000,000 nodes, over the limit of 100,000"),
        ("n[1-9]-[1-99999]", "names up to 899,991 nodes, over the limit of 100,000"),
        ("n[1-1000000]" * 64, "names more than 10^19 nodes"),
        ("@gpus", "node groups (@name) and wildcards (*, ?) are not supported"),
        ("gpu*", "node groups (@name) and wildcards (*, ?) are not supported"),
        ("n[9-1]", "invalid node set expression"),
    ],
)
def test_expand_nodeset_refuses_a_bomb_before_expanding_it(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        expand_nodeset(expr)


def test_a_node_set_in_a_request_is_bounded_by_the_cluster(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(GOOD_CONFIG.format(state=tmp_path / "state"))
    service = ClusterService(load_config(cfg), cast(Any, None), cast(Any, None))
    assert service.nodeset_limit == NODESET_FLOOR  # 2 nodes: 4 per node, at least the floor
    assert [n.name for n in service.select("gpu[1-2],gpu1")] == ["gpu1", "gpu2"]
    with pytest.raises(UsageError, match=re.escape("'n[1-20000000]' names up to 20,000,000 nodes, over the limit")):
        service.select("n[1-20000000]")
    with pytest.raises(UsageError, match="node sets naming up to 1,025 nodes, over the limit of 1,024"):
        service.select(["gpu1"] * 1025)  # a list of expressions counts all together
    with pytest.raises(NotFound, match=r"not in the cluster config: n1, .*, n20 and 980 more$"):
        service.select("n[1-1000]")


def test_node_names_of_a_job_are_bounded() -> None:
    with pytest.raises(ConfigError, match="over the limit of 10,000"):
        parse_jobspec("name: a\ncommand: x\nnode_names: n[1-20000000]\n")
    assert parse_jobspec("name: a\ncommand: x\nnode_names: n[1-10000]\n").node_names == "n[1-10000]"


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        ({}, 100),
        ({"limit": 0}, 100),
        ({"limit": None}, 100),
        ({"limit": 1}, 1),
        ({"limit": "50"}, 50),
        ({"limit": MAX_LIMIT}, MAX_LIMIT),
    ],
)
def test_a_listing_limit_within_the_cap(args: dict[str, Any], limit: int) -> None:
    assert daemon._limit(args, 100) == limit


@pytest.mark.parametrize("value", [MAX_LIMIT + 1, 10**18, -1, "-1", "1e9", 2.5, True, [1], "9" * 30])
def test_a_listing_limit_over_the_cap_is_refused(value: Any) -> None:
    with pytest.raises(UsageError, match=f"limit must be a whole number from 1 to {MAX_LIMIT:,}"):
        daemon._limit({"limit": value}, 100)
