"""`ftconsole config check` finds every problem of a config in one run, sorted by line, in the project's words:
the values (types, ranges, warn below fail), the keys across each other (node groups, pools), and what only this
host can tell (its groups, files, folders, the socket's length). `load_config` refuses the first two kinds and
still loads a config whose files are not made yet."""

from __future__ import annotations

import grp
import json
from pathlib import Path

import pytest

from ftconsole.cli import build_parser, main
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.spec.config import DEFAULT_CONFIG_PATHS, load_config
from ftconsole.scheduler.spec.configcheck import MAX_SOCKET_PATH, check_config

NO_GROUP = "ftconsole-no-such-group"
PYDANTIC_WORDS = ("Input should", "Field required", "Value error", "Extra inputs", "valid dictionary")

BROKEN = """\
state_dir: {blocked}/state
api:
  group: {group}
  socket: {socket}
ssh:
  identity_file: {tmp}/no-such-key
  known_hosts: {tmp}/no-such-known-hosts
  conect_timeout: 5s
  max_parallel: 0
probes:
  thresholds:
    disk_root_gb: -5
    mem_available_warn_pct: 150
    gpu_temp_warn_c: 100
    gpu_temp_fail_c: 90
pools:
  gpu:
    thresholds: {{gpu_temp_fail_c: 80}}
state:
  url: postgresql://ft@db.invalid/ft
  lease: 1s
scheduler:
  run_as: everyone
nodes:
  - name: gpu[01-04]
    host: 10.0.0.[1-3]
  - name: n1
    host: root@10.0.0.1
  - name: a
    pool: nosuch
  - name: a
    pool: gpu
  - pool: gpu
repair:
  reboot: [/no/such/ipmitool, "{{node}}-bmc"]
"""

# (line, key, words the problem has): every problem of BROKEN
EXPECTED = [
    (1, "state_dir", "cannot be made: {blocked} is not a folder"),
    (3, "api.group", f"no group '{NO_GROUP}' on this host"),
    (4, "api.socket", f"bytes long, over the {MAX_SOCKET_PATH} bytes a Unix socket's path may have"),
    (6, "ssh.identity_file", "the key file {tmp}/no-such-key does not exist"),
    (7, "ssh.known_hosts", "does not exist, and with host_key_policy strict a node whose key is not in it is refused"),
    (8, "ssh.conect_timeout", "unknown key: did you mean 'connect_timeout'?"),
    (9, "ssh.max_parallel", "must be at least 1, not 0"),
    (12, "probes.thresholds.disk_root_gb", "must be at least 0 GB, not -5 GB"),
    (13, "probes.thresholds.mem_available_warn_pct", "must be at most 100%, not 150%"),
    (15, "probes.thresholds.gpu_temp_fail_c", "gpu_temp_fail_c (90) must be above gpu_temp_warn_c (100)"),
    (18, "pools.gpu.thresholds.gpu_temp_fail_c", "this pool's gpu_temp_fail_c (80) is not above"),
    (21, "state.lease", "must be at least 2s (a duration such as 30s, 5m, 2h), not 1s"),
    (23, "scheduler.run_as", "must be one of: submitter, ssh_user; not 'everyone'"),
    (25, "nodes[0]", "host expands to 3 host(s) but name expands to 4 node(s)"),
    (28, "nodes[1].host", "host takes an address only"),
    (30, "nodes[2].pool", "pool 'nosuch' is not defined under pools"),
    (31, "nodes[3].name", "node a is already defined in nodes[2]"),
    (33, "nodes[4].name", "missing: this key is required"),
    (35, "repair.reboot", "'/no/such/ipmitool' is not a program on this host's PATH"),
]


@pytest.fixture
def broken(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    try:
        grp.getgrnam(NO_GROUP)
        pytest.skip(f"this host has a group {NO_GROUP}")
    except KeyError:
        pass
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")  # a folder under a file cannot be made, even by root
    values = {
        "tmp": str(tmp_path),
        "blocked": str(blocked),
        "group": NO_GROUP,
        "socket": str(tmp_path / ("s" * (MAX_SOCKET_PATH + 1)) / "ftconsole.sock"),
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(BROKEN.format(**values))
    return path, values


def test_every_problem_in_one_run_sorted_by_line_in_our_words(broken: tuple[Path, dict[str, str]]) -> None:
    path, values = broken
    problems = check_config(path).problems
    found = [(p.line, p.path) for p in problems]
    for line, key, words in EXPECTED:
        words = words.format(**values)
        assert any(p.line == line and p.path == key and words in p.message for p in problems), (line, key, found)
    assert [p.line or 0 for p in problems] == sorted(p.line or 0 for p in problems)
    assert len(problems) == len(EXPECTED), [str(p) for p in problems]
    assert all(p.file == str(path) for p in problems)
    said = "\n".join(p.message for p in problems)
    assert not any(words in said for words in PYDANTIC_WORDS), said
    assert "node groups (@name)" not in said  # the '@' of a user is told where the user goes


def test_load_config_refuses_the_values_but_not_what_the_host_lacks(broken: tuple[Path, dict[str, str]]) -> None:
    path, _ = broken
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    keys = {p.path for p in caught.value.problems}
    assert {"probes.thresholds.disk_root_gb", "nodes[3].name", "nodes[2].pool", "ssh.conect_timeout"} <= keys
    # the host's own (a group, files, folders, the socket's path) are config check's: a config loads without them
    assert not keys & {"state_dir", "api.group", "api.socket", "ssh.identity_file", "ssh.known_hosts"}


def test_a_config_whose_files_are_not_made_yet_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"state_dir: {tmp_path}/later\napi: {{group: {NO_GROUP}}}\n"
        f"ssh: {{identity_file: {tmp_path}/none, known_hosts: {tmp_path}/none}}\nnodes: [{{name: a}}]\n"
    )
    assert load_config(path).cluster.api.group == NO_GROUP


def test_config_check_json_prints_one_document_with_the_problems(
    broken: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = broken
    assert main(["--config", str(path), "config", "check", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["file"] == str(path)
    assert [(p["line"], p["key"]) for p in doc["problems"]] == [(line, key) for line, key, _ in EXPECTED]
    assert set(doc["problems"][0]) == {"file", "line", "key", "message"}


def test_config_check_text_lists_every_problem_and_exits_2(
    broken: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = broken
    assert main(["--config", str(path), "config", "check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ftconsole: invalid config:\n")
    assert f"{path}:8: ssh.conect_timeout: unknown key: did you mean 'connect_timeout'?" in err
    assert err.count(f"  {path}:") == len(EXPECTED)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("nodes:\n  - name: a\n   bad: indent\n", "", "YAML syntax"),
        ("nodes: [{name: a}]\nstate_dir: /a\nstate_dir: /b\n", "state_dir", "duplicate key"),
    ],
)
def test_config_check_json_prints_a_document_when_the_yaml_is_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, words: str
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    assert main(["--config", str(path), "config", "check", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and any(p["key"] == key and words in p["message"] for p in doc["problems"])


def test_config_check_json_prints_a_document_when_the_file_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(tmp_path / "none.yaml"), "config", "check", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "cannot read" in doc["problems"][0]["message"]


def test_an_empty_section_means_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("ssh:\nprobes:\n  thresholds:\npools:\n  default:\nnodes:\n  - name: a\n")
    cluster = load_config(path).cluster
    assert cluster.ssh.connect_timeout == 10 and cluster.probes.thresholds.disk_root_gb == 32
    assert cluster.pools["default"].thresholds.disk_root_gb is None


def test_a_section_that_is_no_mapping_says_so(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("ssh: root\nnodes: [{name: a}]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (problem,) = caught.value.problems
    assert (problem.line, problem.path) == (1, "ssh")
    assert problem.message == "must be a mapping of keys (or left out), not text ('root')"


def test_accept_new_with_no_known_hosts_yet_is_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"state_dir: {tmp_path}/state\nssh:\n  host_key_policy: accept-new\n  known_hosts: {tmp_path}/ssh/kh\n"
        "nodes: [{name: a}]\n"
    )
    assert main(["--config", str(path), "config", "check"]) == 0
    assert f"note: known_hosts {tmp_path}/ssh/kh does not exist yet" in capsys.readouterr().out
    assert main(["--config", str(path), "config", "check", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["problems"] == [] and len(doc["notes"]) == 1
    assert not (tmp_path / "state").exists()  # config check makes nothing


@pytest.mark.parametrize(
    ("thresholds", "pool", "key"),
    [
        ("{gpu_temp_warn_c: 95}", None, "probes.thresholds.gpu_temp_fail_c"),  # the fail level's default: 95
        ("{gpu_temp_fail_c: 80}", None, "probes.thresholds.gpu_temp_fail_c"),  # the warn level's default: 85
        ("{}", "{gpu_temp_warn_c: 96}", "pools.p.thresholds.gpu_temp_warn_c"),
        ("{gpu_temp_warn_c: 60, gpu_temp_fail_c: 70}", "{gpu_temp_fail_c: 60}", "pools.p.thresholds.gpu_temp_fail_c"),
        ("{}", "{gpu_temp_warn_c: 90, gpu_temp_fail_c: 90}", "pools.p.thresholds.gpu_temp_fail_c"),
    ],
)
def test_each_warn_level_is_below_its_fail_level(tmp_path: Path, thresholds: str, pool: str | None, key: str) -> None:
    path = tmp_path / "cluster.yaml"
    pools = f"pools:\n  p:\n    thresholds: {pool}\n" if pool else ""
    path.write_text(
        f"probes:\n  thresholds: {thresholds}\n{pools}nodes: [{{name: a, pool: {'p' if pool else 'default'}}}]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [p.path for p in caught.value.problems] == [key]


def test_the_config_help_names_every_place_searched() -> None:
    text = build_parser().format_help()
    flat = " ".join(text.split())
    assert all(place in flat for place in DEFAULT_CONFIG_PATHS), flat


def test_burn_in_without_a_node_test_is_refused_where_it_is_set(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: [{name: a}]\nprobes:\n  burn_in_interval: 1d\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (problem,) = caught.value.problems
    assert (problem.line, problem.path) == (3, "probes.burn_in_interval"), problem
    assert "name one under node_tests" in problem.message
    path.write_text("nodes: [{name: a}]\nprobes:\n  burn_in_interval: 1d\nnode_tests:\n  gpu: {level: 2}\n")
    tests = load_config(path).cluster.node_tests
    assert tests.gpu is not None and tests.gpu.deadline == 600.0


def test_a_pool_has_its_own_node_tests_in_place_of_the_clusters(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "pools:\n  h100: {node_tests: {gpu: {level: 3}}}\n  cpu: {}\n"
        "nodes: [{name: a, pool: h100}, {name: b, pool: cpu}]\n"
        "node_tests: {gpu: {level: 1}, before_resume: false}\n"
        "probes: {burn_in_interval: 1d}\n"
    )
    cluster = load_config(path).cluster
    h100, cpu = cluster.node_tests_for("h100"), cluster.node_tests_for("cpu")
    assert h100.gpu is not None and (h100.gpu.level, h100.gpu.deadline, h100.before_resume) == (3, 3600.0, True)
    assert cpu.gpu is not None and (cpu.gpu.level, cpu.before_resume) == (1, False)
    path.write_text(
        "pools:\n  h100: {node_tests: {gpu: {level: 3}}}\n  cpu: {}\nnodes: [{name: a, pool: h100}]\n"
        "probes: {burn_in_interval: 1d}\n"
    )
    assert load_config(path).cluster.node_tests_for("cpu").any is False  # burn-in: a pool's tests are enough
