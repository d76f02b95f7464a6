"""A config reload's decisions, pure: what a new config changes, what needs a restart, which removed or moved node
still runs jobs, and the answer as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.jobs import Run
from ftconsole.scheduler.errors import Problem
from ftconsole.scheduler.serve.reload import (
    ConfigChange,
    ReloadResult,
    busy_problems,
    config_change,
    reload_lines,
    restart_problems,
)
from ftconsole.scheduler.spec.config import ClusterConfig

BASE: dict[str, Any] = {
    "nodes": [
        {"name": "gpu[01-02]", "host": "10.0.0.[1-2]", "pool": "a"},
        {"name": "cpu01", "pool": "b"},
    ],
    "pools": {"a": {}, "b": {}},
}


def config(**changes: Any) -> ClusterConfig:
    return ClusterConfig.model_validate({**BASE, **changes})


def nodes(*groups: dict[str, Any]) -> list[dict[str, Any]]:
    return list(groups)


GPU = {"name": "gpu[01-02]", "host": "10.0.0.[1-2]", "pool": "a"}
CPU = {"name": "cpu01", "pool": "b"}


@pytest.mark.parametrize(
    ("new", "added", "removed", "changed", "moved", "keys"),
    [
        pytest.param({}, (), (), (), (), (), id="nothing"),
        pytest.param({"nodes": nodes(GPU, CPU, {"name": "gpu03", "pool": "a"})}, ("gpu03",), (), (), (), (),
                     id="a node added"),
        pytest.param({"nodes": nodes({**GPU, "name": "gpu01", "host": "10.0.0.1"}, CPU)}, (), ("gpu02",), (), (), (),
                     id="a node removed from a group"),
        pytest.param({"nodes": nodes(GPU, {**CPU, "pool": "a"})}, (), (), ("cpu01",), (), (), id="another pool"),
        pytest.param({"nodes": nodes(GPU, {**CPU, "labels": {"rack": "7"}})}, (), (), ("cpu01",), (), (),
                     id="labels"),
        pytest.param({"nodes": nodes({**GPU, "host": "10.0.0.[1,9]"}, CPU)}, (), (), ("gpu02",), ("gpu02",), (),
                     id="another address"),
        pytest.param({"nodes": nodes(GPU, {**CPU, "port": 2222})}, (), (), ("cpu01",), ("cpu01",), (),
                     id="another port"),
        pytest.param({"nodes": nodes(CPU, GPU)}, (), (), (), (), (), id="the same nodes in another order"),
        pytest.param({"scheduler": {"tick": "5s"}}, (), (), (), (), (("scheduler", "tick"),), id="a setting"),
        pytest.param({"probes": {"thresholds": {"gpu_temp_fail_c": 90}}}, (), (), (), (),
                     (("probes", "thresholds", "gpu_temp_fail_c"),), id="a threshold"),
        pytest.param({"specs": {"h100": {"gpus_per_node": 8}}}, (), (), (), (), (("specs", "h100"),),
                     id="a spec added"),
        pytest.param({"admins": ["alice"]}, (), (), (), (), (("admins",),), id="a list as a whole"),
        pytest.param({"metrics": {"listen": "127.0.0.1:9000"}}, (), (), (), (), (("metrics",),), id="a section set"),
        pytest.param({"notify": {"webhook": "https://chat.example/hook"}}, (), (), (), (), (("notify", "webhook"),),
                     id="a notify target"),
    ],
)  # fmt: skip
def test_what_a_new_config_changes(
    new: dict[str, Any], added: tuple[str, ...], removed: tuple[str, ...], changed: tuple[str, ...],
    moved: tuple[str, ...], keys: tuple[tuple[str, ...], ...],
) -> None:  # fmt: skip
    change = config_change(config(), config(**new))
    assert (change.nodes_added, change.nodes_removed, change.nodes_changed) == (added, removed, changed)
    assert change.moved == moved
    assert change.keys == keys
    assert change.empty == (new == {} or new == {"nodes": nodes(CPU, GPU)})


@pytest.mark.parametrize(
    ("new", "refused"),
    [
        ({"state_dir": "/var/lib/other"}, ["state_dir"]),
        ({"state": {"url": "postgresql://db/ft"}}, ["state"]),
        ({"api": {"socket": "/run/ft.sock"}}, ["api.socket"]),
        ({"api": {"group": "researchers"}}, ["api.group"]),
        ({"metrics": {"listen": "127.0.0.1:9000"}}, ["metrics"]),
        ({"ssh": {"connect_timeout": "3s"}}, ["ssh.connect_timeout"]),
        ({"ssh": {"user": "ops"}}, ["ssh.user"]),
        ({"scheduler": {"tick": "5s", "node_timeout": "20s"}, "admins": ["bob"]}, []),
        ({"notify": {"command": ["/bin/true"]}, "alertmanager": {"url": "http://127.0.0.1:9093"}}, []),
        ({"probes": {"interval": "30s"}, "quotas": {"users": {"bob": {"gpus": 4}}}}, []),
        ({"api": {"socket": "/run/ft.sock"}, "scheduler": {"tick": "5s"}, "state_dir": "/x"},
         ["state_dir", "api.socket"]),
    ],
)  # fmt: skip
def test_keys_set_up_at_start_need_a_restart(new: dict[str, Any], refused: list[str]) -> None:
    found = restart_problems(config_change(config(), config(**new)))
    assert sorted(".".join(loc) for loc, _ in found) == sorted(refused)
    for _, why in found:
        assert why.startswith("changing it needs a restart (") and "the jobs keep running" in why


def run(job: int, node: str, state: str = "running") -> Run:
    return Run(job=job, attempt=1, rank=0, node=node, gpus=(0,), run_dir=f"/runs/{job}", launch=True, state=state)


@pytest.mark.parametrize(
    ("new", "held", "refused"),
    [
        pytest.param({"nodes": nodes(GPU)}, [run(1, "cpu01")], {"cpu01": "job 1"}, id="removed while it runs a job"),
        pytest.param({"nodes": nodes(GPU)}, [run(1, "cpu01"), run(2, "cpu01"), run(2, "cpu01")],
                     {"cpu01": "jobs 1, 2"}, id="every job named once"),
        pytest.param({"nodes": nodes(GPU)}, [run(1, "gpu01")], {}, id="removed with runs elsewhere"),
        pytest.param({"nodes": nodes(GPU)}, [], {}, id="removed with no run (drained, its jobs gone)"),
        pytest.param({"nodes": nodes({**GPU, "host": "10.0.0.[1,9]"}, CPU)}, [run(3, "gpu02")], {"gpu02": "job 3"},
                     id="moved while it runs a job"),
        pytest.param({"nodes": nodes({**GPU, "host": "10.0.0.[1,9]"}, CPU)}, [run(3, "gpu01")], {},
                     id="moved with runs on another node of its group"),
        pytest.param({"nodes": nodes(GPU, {**CPU, "pool": "a"})}, [run(1, "cpu01")], {},
                     id="another pool while it runs a job"),
    ],
)  # fmt: skip
def test_a_node_that_runs_jobs_is_neither_removed_nor_moved(
    new: dict[str, Any], held: list[Run], refused: dict[str, str]
) -> None:
    after = config(**new)
    found = busy_problems(config_change(config(), after), after, held)
    assert len(found) == len(refused)
    for (loc, why), (node, jobs) in zip(found, refused.items(), strict=True):
        assert f"node {node} " in why and f"runs {jobs}:" in why and "drain it" in why
        assert loc[0] == "nodes"


def test_a_moved_node_names_its_group() -> None:
    after = config(nodes=nodes(CPU, {**GPU, "host": "10.0.0.[1,9]"}))
    [(loc, _)] = busy_problems(config_change(config(), after), after, [run(3, "gpu02")])
    assert loc == ("nodes", 1, "host")


@pytest.mark.parametrize(
    ("result", "lines"),
    [
        (ReloadResult("/etc/ft.yaml", applied=True), ["config reloaded from /etc/ft.yaml: nothing changed"]),
        (
            ReloadResult("/etc/ft.yaml", applied=True, paused_s=0.25,
                         change=ConfigChange(nodes_added=("gpu03",), nodes_removed=("gpu01", "gpu02"),
                                             keys=(("scheduler", "tick"), ("admins",)))),
            ["config reloaded from /etc/ft.yaml (the control loop paused 0.25 s)",
             "  nodes added (probed before they take jobs): gpu03", "  nodes removed: gpu01, gpu02",
             "  keys changed: scheduler.tick, admins"],
        ),
        (
            ReloadResult("/etc/ft.yaml", applied=False, change=ConfigChange(keys=(("api", "socket"),)),
                         problems=(Problem("/etc/ft.yaml", 7, "api.socket", "changing it needs a restart"),
                                   Problem("/etc/ft.yaml", None, "", "cannot read: gone"))),
            ["config not reloaded from /etc/ft.yaml: nothing was changed",
             "  /etc/ft.yaml:7: api.socket: changing it needs a restart",
             "  /etc/ft.yaml: cannot read: gone"],
        ),
    ],
)  # fmt: skip
def test_the_answer_as_text(result: ReloadResult, lines: list[str]) -> None:
    assert reload_lines(result.to_json()) == lines


def test_the_answer_as_json_names_keys_not_values() -> None:
    secret = "https://chat.example/hook?token=s3cret"
    change = config_change(config(), config(notify={"webhook": secret, "headers": {"Authorization": "Bearer x"}}))
    doc = ReloadResult(str(Path("/etc/ft.yaml")), applied=True, change=change, paused_s=0.1234).to_json()
    assert doc["keys_changed"] == ["notify.webhook", "notify.headers.Authorization"]  # a header's name, not its value
    assert doc["changed"] is True and doc["paused_s"] == 0.123
    assert "s3cret" not in str(doc) and "Bearer" not in str(doc)


@pytest.mark.parametrize(
    ("held", "refused"),
    [([], False), ([run(1, "gpu01"), run(2, "cpu01")], True)],
)
def test_whom_jobs_run_as_changes_only_while_none_runs(held: list[Run], refused: bool) -> None:
    after = config(scheduler={"run_as": "ssh_user"})
    found = busy_problems(config_change(config(), after), after, held)
    assert bool(found) is refused
    if refused:
        [(loc, why)] = found
        assert loc == ("scheduler", "run_as") and why.startswith("changed while jobs 1, 2 run: their runs are read as")
