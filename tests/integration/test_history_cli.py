"""History as a user asks for it (issue 30): `ftconsole usage` (GPU-hours per user or project over a period, like
sreport) and `jobs --since/--until/--state`, on jobs that really ran on an sshd node (`submit --local --wait`:
a one-off scheduler in the CLI's process), read back from the store without a scheduler serving."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.cli_runner import Cli
from tests.integration.test_cli_jobs import spec
from tests.integration.test_scheduler_sshd import write_config
from tests.sshd_cluster import SshdCluster, current_user

pytestmark = pytest.mark.sshd


def test_usage_and_the_job_history_of_a_period(sshd_cluster, tmp_path: Path, sock_dir: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    # project quotas are for declared projects (issue 40); a job that names none is in project default
    cli = Cli(write_config(cluster, tmp_path, sock_dir, projects={"vision": {}, "default": {}}).file)
    before = time.time()
    two = spec(tmp_path, "two", "gpus_per_node: 2\nproject: vision\ncommand: sleep 2\n")
    one = spec(tmp_path, "one", "gpus_per_node: 1\ncommand: sleep 1\n")
    assert "succeeded" in cli("submit", two, "--local", "--wait").stderr
    assert "succeeded" in cli("submit", one, "--local", "--wait").stderr
    failed = cli("submit", spec(tmp_path, "bad", "command: sh -c 'exit 3'\n"), "--local", "--wait", check=1)
    assert "error" in failed.stderr

    by_user = cli.json("usage")
    me = current_user()
    assert list(by_user["rows"]) == [me] and by_user["by"] == "user"
    used = by_user["rows"][me]
    # 2 GPUs for about 2 s, 1 GPU for about 1 s, 1 GPU for a moment: about 5 GPU-seconds, each at least as long
    assert (
        used["jobs"] == 3
        and 5 <= used["gpu_seconds"] < 60
        and used["gpu_hours"] == round(used["gpu_seconds"] / 3600, 4)
    )
    assert by_user["total"] == used
    # goodput: the failed job's attempt is lost (it ended error), the others' time was useful
    assert 0 < used["goodput"] < 1 and used["downtime_gpu_hours"] == 0
    by_project = cli.json("usage", "--by", "project")
    assert list(by_project["rows"]) == ["vision", "default"]  # most used first
    assert by_project["rows"]["vision"]["gpu_seconds"] >= 4 and by_project["rows"]["vision"]["jobs"] == 1
    text = cli("usage", "--by", "project").stdout
    assert text.startswith("GPU-hours by project from ") and "vision" in text and "(all)" in text

    # a window before anything ran: nothing; a window around it: everything
    assert cli.json("usage", "--since", "2020-01-01", "--until", "2020-01-02")["rows"] == {}
    assert [j["name"] for j in cli.json("jobs", "--until", "2020-01-02")] == []
    assert [j["name"] for j in cli.json("jobs", "--since", "1h")] == ["two", "one", "bad"]
    assert [j["name"] for j in cli.json("jobs", "--since", "1h", "--state", "error")] == ["bad"]
    assert cli.json("usage", "--since", f"{time.time() - before + 3600:.0f}s")["total"]["jobs"] == 3

    # quotas an admin sets (the test runs as root, or as an admin of its config) show beside the usage
    if os.geteuid() == 0:
        said = cli("quota", "set", "project", "vision", "--gpus", "4", "--gpu-hours", "10", "--local")
        assert said.stdout == "quota of project vision (set): gpus 4, gpu_hours 10\n"
        shown = cli("usage", "--by", "project").stdout
        assert "quotas (now; GPU-hours over the last 7.0d)" in shown and "0/4" in shown, shown
        assert cli.json("usage", "--by", "project")["quotas"]["vision"]["limits"] == {"gpus": 4, "gpu_hours": 10.0}
        assert "needs at least one limit" in cli("quota", "set", "user", "ann", "--local", check=2).stderr
        cleared = cli("quota", "clear", "project", "vision", "--local").stdout
        assert cleared == "quota of project vision (from the config): no limits\n"

    bad = cli("usage", "--since", "yesterday", check=2)
    assert "'yesterday' is not a time: give a date (2026-11-01, 2026-11-01T14:00) or a time ago" in bad.stderr
    late = cli("jobs", "--since", "1h", "--until", "2h", check=2)
    assert "--since (1h) must be before --until (2h)" in late.stderr
