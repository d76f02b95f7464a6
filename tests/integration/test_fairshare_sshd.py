"""Fair share end to end on a real sshd node (one GPU): a project that used the GPU waits behind one that did
not, though it was queued first, and says why; predict and `shares` (sshare) say the same."""

from __future__ import annotations

import pytest

from tests.integration.test_forecast_sshd import cli
from tests.integration.test_scheduler_sshd import finished, job, running, until, write_config
from tests.sshd_cluster import SshdCluster

pytestmark = pytest.mark.sshd


async def test_the_project_that_used_less_goes_first_within_a_level(sshd_cluster, tmp_path, sock_dir) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=1)
    fair = {"fairshare": {"half_life": "1h", "every": "0.1s"}}
    loaded = write_config(cluster, tmp_path, sock_dir, scheduler=fair, projects={"heavy": {}, "light": {}})
    async with running(loaded) as (_, client):
        warm = await client.call("submit", spec=job("warm", "sleep 2", project="heavy"))
        assert (await finished(client, warm["id"]))["status"] == "succeeded"
        blocker = await client.call("submit", spec=job("blocker", "sleep 3", project="heavy"))
        await until(client, blocker["id"], lambda j: j["status"] == "running", "the blocker to run")
        heavy = await client.call("submit", spec=job("heavy-next", "true", project="heavy"))
        light = await client.call("submit", spec=job("light-next", "true", project="light"))
        told = await until(client, heavy["id"], lambda j: "fair share" in (j["message"] or ""), "its note")
        assert told["message"].startswith("waiting (position 2): ")
        assert "; fair share 0.12: project heavy used 2.0x its share" in told["message"], told["message"]
        predicted = await client.call("predict", spec=job("asked", "true", project="heavy"))
        assert predicted["position"] == 3 and "project heavy used 2.0x its share" in predicted["reason"], predicted

        # `shares` (sshare): the same standing, account by account, and the use of the last day and week
        shares = await client.call("shares")
        accounts = {(a["project"], a["user"]): a for a in shares["fairshare"]["accounts"]}
        heavy_account, light_account = accounts[("heavy", told["owner"])], accounts[("light", told["owner"])]
        assert heavy_account["share"] == pytest.approx(0.5) and light_account["share"] == pytest.approx(0.5)
        assert heavy_account["usage"] == pytest.approx(1.0) and light_account["usage"] == 0
        assert light_account["factor"] == 1.0 and heavy_account["factor"] == pytest.approx(0.125, abs=0.01)
        assert shares["day"]["project"]["heavy"]["gpu_hours"] > 0 and "light" not in shares["day"]["project"]
        assert shares["week"]["user"][told["owner"]]["jobs"] >= 2 and shares["quotas"] == {"project": {}, "user": {}}
        code, out, err = await cli(loaded.file, "shares")
        assert code == 0, err
        assert "fair share: per project, then per user within it" in out and "FAIRSHARE" in out
        heavy_line = next(line for line in out.splitlines() if line.startswith("heavy "))
        assert heavy_line.split()[2:4] == ["50.0%", "100.0%"], heavy_line
        done_heavy = await finished(client, heavy["id"])
        done_light = await finished(client, light["id"])
    assert done_light["started"] < done_heavy["started"]  # queued second, started first
