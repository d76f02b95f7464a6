"""Cluster config: every problem named by file, line and key path; node set expansion."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftconsole.scheduler.decide.steps import user_root
from ftconsole.scheduler.errors import ConfigError
from ftconsole.scheduler.spec.config import format_duration, load_config, parse_duration
from ftconsole.scheduler.spec.nodesets import expand_nodeset, fold_nodeset


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[1-2],login", ["gpu1", "gpu2", "login"]),
        ("10.1.0.[1-3]", ["10.1.0.1", "10.1.0.2", "10.1.0.3"]),
        ("a[9-11]", ["a9", "a10", "a11"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("single", ["single"]),
    ],
)
def test_expand_nodeset(expr: str, expected: list[str]) -> None:
    assert expand_nodeset(expr) == expected


@pytest.mark.parametrize("expr", ["gpu[01-", "gpu[3-1]", "", "gpu[a-b]"])
def test_expand_nodeset_rejects(expr: str) -> None:
    with pytest.raises(ValueError, match="node set"):
        expand_nodeset(expr)


def test_fold_nodeset_round_trip() -> None:
    assert fold_nodeset(["gpu01", "gpu02", "gpu03"]) == "gpu[01-03]"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("12h", 43200), ("1.5d", 129600), ("250ms", 0.25), (10, 10), ("7", 7)],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10q", "-5s", "abc", True, "5 minutes"])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (30, 300, 7200, 86400, 90.5)] == ["30s", "5m", "2h", "1d", "90.5s"]


def test_minimal_config_and_node_list(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "nodes:\n  - name: gpu[01-02]\n    host: 10.1.0.[1-2]\n    port: 2222\n    labels: {rack: a}\n  - name: cpu1\n",
    )
    loaded = load_config(p)
    nodes = loaded.cluster.node_list()
    assert [(n.name, n.host, n.port) for n in nodes] == [
        ("gpu01", "10.1.0.1", 2222),
        ("gpu02", "10.1.0.2", 2222),
        ("cpu1", "cpu1", None),
    ]
    assert nodes[0].labels == {"rack": "a"}
    assert loaded.cluster.ssh.connect_timeout == 10
    assert loaded.cluster.scheduler.fairshare is None  # first come, first served unless configured


CASES = [
    ("ssh:\n  connect_timeout: 10q\n", 2, "ssh.connect_timeout", "duration"),
    ("ssh:\n  user: root\n  bogus: 1\n", 3, "ssh.bogus", "unknown key"),
    ("nodes:\n  - name: gpu[01-04]\n    host: 10.0.0.[1-3]\n", 2, "nodes[0]", "host expands to 3"),
    ("nodes:\n  - name: gpu[01-\n", 2, "nodes[0]", "invalid node set"),
    ("nodes:\n  - name: a\n  - name: a\n", 3, "nodes[1].name", "already defined"),
    ("pools:\n  x: {}\nnodes:\n  - name: a\n    pool: y\n", 5, "nodes[0].pool", "not defined under pools"),
    ("probes:\n  thresholds:\n    disk_root_gb: lots\n", 3, "probes.thresholds.disk_root_gb",
     "must be a number, not text ('lots')"),
    ("ssh:\n  host_key_policy: yes-please\n", 2, "ssh.host_key_policy", "strict"),
    ("ssh: [1, 2]\n", 1, "ssh", "must be a mapping of keys (or left out), not a list"),
    ("state_dir: /a\nstate_dir: /b\n", 2, "state_dir", "duplicate key"),
    ("nodes:\n  - name: a\n   bad: indent\n", 3, "", "YAML syntax"),
    ("- just\n- a list\n", 1, "", "mapping"),
    ("projects:\n  vision: {}\nscheduler:\n  fairshare:\n    shares: {vision: 2, speech: 1}\n", 5,
     "scheduler.fairshare.shares.speech", "project 'speech' is not declared under projects"),
    ("scheduler:\n  fairshare:\n    shares: {vision: 0}\n", 3, "scheduler.fairshare.shares.vision",
     "must be greater than 0, not 0"),
    ("scheduler:\n  fairshare: {half_life: soon}\n", 2, "scheduler.fairshare.half_life", "duration"),
    ("projects:\n  vision: {}\nquotas:\n  projects:\n    speech: {gpus: 8}\n", 5, "quotas.projects.speech",
     "project 'speech' is not declared under projects"),
    ("quotas:\n  users:\n    ann: {gpus: -1}\n", 3, "quotas.users.ann.gpus", "must be at least 0, not -1"),
    ("quotas:\n  default_user: {gpu: 4}\n", 2, "quotas.default_user.gpu", "unknown key"),
    # no projects declared: a project is a label anyone may write, so nothing is kept per project (issue 40)
    ("scheduler:\n  fairshare:\n    shares: {vision: 2}\n", 3, "scheduler.fairshare.shares.vision",
     "no projects are declared (projects:): a job's project is then a label anyone may write"),
    ("quotas:\n  projects:\n    vision: {gpus: 8}\n", 3, "quotas.projects.vision", "no projects are declared"),
    ("quotas:\n  default_project: {gpus: 8}\n", 2, "quotas.default_project", "declare the projects, or leave this"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "path", "message"), CASES)
def test_problems_name_file_line_and_key(tmp_path: Path, text: str, line: int, path: str, message: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    problems = info.value.problems
    assert any(pr.line == line and pr.path == path and message in pr.message for pr in problems), problems
    assert all(pr.file == str(p) for pr in problems)


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    p = write(tmp_path, "ssh:\n  connect_timeout: x\n  nope: 1\nprobes:\n  interval: y\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert sorted(pr.line for pr in info.value.problems) == [2, 3, 5]


def test_pool_thresholds_override_only_given_keys(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "probes:\n  thresholds: {disk_root_gb: 10, disk_shm_gb: 2}\n"
        "pools:\n  big:\n    thresholds: {disk_root_gb: 100}\n  default: {}\n"
        "nodes:\n  - {name: a, pool: big}\n",
    )
    cluster = load_config(p).cluster
    assert cluster.thresholds_for("big").disk_root_gb == 100
    assert cluster.thresholds_for("big").disk_shm_gb == 2
    assert cluster.thresholds_for("default").disk_root_gb == 10


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    p = write(tmp_path, "state_dir: state\nssh: {known_hosts: kh}\n")
    loaded = load_config(p)
    assert loaded.state_dir == tmp_path / "state"
    assert loaded.resolve(loaded.cluster.ssh.known_hosts) == tmp_path / "kh"


def test_example_configs_are_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    loaded = load_config(root / "config" / "cluster.example.yaml")
    assert len(loaded.cluster.node_list()) > 1


RUN_AS = """\
nodes:
  - {{name: gpu01, host: 10.0.0.1, user: {user}}}
api: {{group: researchers}}
scheduler: {{{scheduler}}}
"""


@pytest.mark.parametrize(
    ("user", "scheduler", "refused"),
    [
        ("root", "run_as: ssh_user", "which is root on gpu01, and api.group 'researchers' lets its members submit"),
        ("root", "run_as: ssh_user, accept_group_as_root: true", None),
        ("ops", "run_as: ssh_user", None),  # not root: the group gets ops's rights, which is what ssh_user means
        ("root", "run_as: submitter", None),
        ("root", "run_root: /scratch/runs", "would be one folder for the runs of every user"),
        ("root", "run_root: '/scratch/{user}/runs'", None),
        ("root", "run_root: /scratch/runs, run_as: ssh_user, accept_group_as_root: true", None),
    ],
)
def test_run_as_refuses_a_root_account_for_a_group_and_a_shared_run_root(
    tmp_path: Path, user: str, scheduler: str, refused: str | None
) -> None:
    path = write(tmp_path, RUN_AS.format(user=user, scheduler=scheduler))
    if refused is None:
        load_config(path)
        return
    with pytest.raises(ConfigError, match=r"scheduler\.run_") as caught:
        load_config(path)
    assert refused in str(caught.value)


def test_user_root_puts_the_user_in_the_run_root() -> None:
    assert user_root("/scratch/{user}/runs/cid", "alice") == "/scratch/alice/runs/cid"
    assert user_root("~/.ftconsole/runs/cid", "alice") == "~/.ftconsole/runs/cid"  # "~": the user's home, there
    assert user_root("/scratch/{user}/runs", None) == "/scratch/{user}/runs"
