"""Free-text projects (issue 40) on a real sshd node: where the cluster config declares no projects, the
`project:` a job names is a label. Fair share counts per user, so a job naming a fresh project gets no better
factor nor turn than its user's plain jobs (nor than another user's); a reservation for a project is refused when
made, and one kept from when projects were declared takes no job that names its project."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import UsageError
from tests.integration.test_scheduler_sshd import as_nobody, finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


def waiting(j: dict[str, Any]) -> tuple[int, str]:
    """(its position, its fair-share note) from a queued job's message."""
    found = re.match(r"waiting \(position (\d+)\): .*; (fair share [^;]*)", j["message"] or "")
    assert found is not None, j["message"]
    return int(found[1]), found[2]


async def test_a_fresh_project_name_gets_no_better_turn_without_declared_projects(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    fair = {"fairshare": {"half_life": "1h", "every": "0.1s"}}
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=fair)
    sock_dir.chmod(0o755)
    other = os.geteuid() == 0  # a second user (uid 65534) needs root
    async with running(loaded) as (_, client):
        me = (await client.call("whoami"))["user"]
        warm = await client.call("submit", spec=job("warm", "sleep 2"))  # my usage, in no project
        assert (await finished(client, warm["id"]))["status"] == "succeeded"
        blocker = await client.call("submit", spec=job("blocker", "sleep 60"))
        await until(client, blocker["id"], lambda j: j["status"] == "running", "the blocker to run")
        theirs = None
        if other:  # their plain job, queued before mine
            theirs = (await as_nobody(loaded.socket_path, "submit", spec=job("theirs", "true")))["result"]
        plain = await client.call("submit", spec=job("plain", "true"))
        fresh = await client.call("submit", spec=job("fresh", "true", project="brand-new"))  # a new name, no usage
        told = await until(client, fresh["id"], lambda j: "fair share" in (j["message"] or ""), "its note")
        shown_plain = await until(client, plain["id"], lambda j: "fair share" in (j["message"] or ""), "its note")
        predicted = await client.call("predict", spec=job("asked", "true", project="another-new"))
        shown_theirs = None
        if theirs is not None:
            shown_theirs = await until(client, theirs["id"], lambda j: "fair share" in (j["message"] or ""), "a note")
        await client.call("stop", jobs=[j["id"] for j in await client.call("jobs", status=["queued", "running"])])
        await finished(client, blocker["id"])

    # I used all of it: my jobs share one factor, whatever project each names, and keep their order
    ahead = 1 if other else 0  # the other user, who used nothing, goes first
    mine = f"fair share {2.0 ** -(ahead + 1):.2f}: {me} used {ahead + 1:.1f}x their share"
    assert waiting(shown_plain) == (ahead + 1, mine)
    assert waiting(told) == (ahead + 2, mine)
    assert predicted["position"] == ahead + 3 and mine in predicted["reason"], predicted
    if shown_theirs is not None:
        assert waiting(shown_theirs) == (1, "fair share 1.00")


async def test_a_project_reservation_is_not_had_by_naming_an_undeclared_project(
    sshd_cluster: Any, tmp_path: Path, sock_dir: Path
) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    declared = write_config(cluster, tmp_path / "declared", sock_dir, projects={"vision": {}, "default": {}})
    end = time.time() + 3600
    async with running(declared) as (_, client):
        if not (await client.call("whoami"))["admin"]:
            pytest.skip("the test's user is not an admin here (root always is)")
        made = await client.call("reserve", name="team", nodes="node01", end=end, project="vision")
        assert made["project"] == "vision"
        ok = await client.call("submit", spec=job("mine", "true", project="vision", reservation="team"))
        assert (await finished(client, ok["id"]))["status"] == "succeeded"  # declared and named: it may

    # the same store, the config now declaring no projects: anyone may write project: vision
    loaded = write_config(cluster, tmp_path, sock_dir)
    async with running(loaded) as (_, client):
        refusal = r"a reservation for a project needs projects declared in the cluster config \(projects:\), and none"
        with pytest.raises(UsageError, match=refusal + r" are: .*; declare the projects, or reserve for a user$"):
            await client.call("reserve", name="fresh", nodes="node01", start=end + 60, end=end + 120, project="x")
        why = "reservation team is for project vision, which the cluster config does not declare (projects)"
        with pytest.raises(UsageError, match=re.escape(f"job claim: it can never start: {why}")):
            await client.call("submit", spec=job("claim", "true", project="vision", reservation="team"))
        with pytest.raises(UsageError, match=re.escape(why)):
            await client.call("predict", spec=job("claim", "true", project="vision", reservation="team"))
        me = (await client.call("whoami"))["user"]
        mine = await client.call("reserve", name="mine", nodes="node01", start=end + 60, end=end + 120, user=me)
        assert mine["user"] == me  # a user's reservation still may be made
