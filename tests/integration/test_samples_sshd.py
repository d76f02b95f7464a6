"""The console's curves at their source, on real sshd nodes: the API's `samples` gives a node's GPUs as the probes
read them (the simulated GPUs' utilisation changed while the scheduler runs) and a running job's ranks with the
epochs their logs showed; a job another user may not see gives them nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.errors import NotFound, UsageError
from tests.integration.test_scheduler_sshd import as_nobody, job, poll, running, write_config
from tests.sshd_cluster import SshdCluster, gpu_data

pytestmark = pytest.mark.sshd

# epochs 1 to 3, then quiet
EPOCHS = "sh -c 'for e in 1 2 3; do echo \"Rank:0 Epoch:[$e]\"; done; exec sleep 300'"


def utils(doc: dict[str, Any], gpu: int) -> list[Any]:
    return next((g["utilization"] for g in doc["gpus"] if g["index"] == gpu), [])


async def test_samples_of_a_node_and_of_a_running_job(sshd_cluster: Any, tmp_path: Path, sock_dir: Path) -> None:
    cluster: SshdCluster = sshd_cluster(1, gpus=2)
    cluster.set_gpus("node01", gpu_data(2, utilization=20))
    loaded = write_config(cluster, tmp_path, sock_dir, probes={"interval": "0.5s"})
    sock_dir.chmod(0o755)  # another user reaches the socket
    async with running(loaded) as (_, client):
        first = await poll(lambda: client.call("samples", node="node01"), lambda d: 20 in utils(d, 1), "a sample")
        assert first["node"] == "node01" and [g["index"] for g in first["gpus"]] == [0, 1]
        cluster.set_gpus("node01", gpu_data(2, utilization=85))  # the GPUs get busy: the curve follows
        later = await poll(lambda: client.call("samples", node="node01"), lambda d: 85 in utils(d, 0), "85%")
        gpu0 = next(g for g in later["gpus"] if g["index"] == 0)
        lengths = {len(gpu0[k]) for k in ("time", "utilization", "temperature", "memory_used_mib")}
        assert len(lengths) == 1 and gpu0["time"] == sorted(gpu0["time"])  # one entry per probe, oldest first
        assert gpu0["utilization"].index(20) < gpu0["utilization"].index(85)
        assert all(t is None or 0 < t < 150 for t in gpu0["temperature"])
        recent = await client.call("samples", node="node01", since=gpu0["time"][-1])
        assert len(recent["gpus"][0]["time"]) <= 2  # `since` cuts the older ones off

        submitted = await client.call("submit", spec=job("epochs", EPOCHS, gpus_per_node=1))
        shown = await poll(
            lambda: client.call("samples", job=submitted["id"]),
            lambda d: bool(d["ranks"]) and len(d["ranks"][0]["epochs"]) >= 3,
            "the epochs of its log",
        )
        (rank,) = shown["ranks"]
        assert rank["rank"] == 0 and rank["node"] == "node01" and len(rank["gpus"]) == 1
        assert [g["index"] for g in rank["series"]] == rank["gpus"]  # the rank's GPU only, not the node's other
        epochs = [e for _, e in rank["epochs"]]
        assert epochs == [1, 2, 3]
        util = await client.call("job_util")  # the Jobs view's sparkline: its GPU at the node's last probes
        assert set(util) == {str(submitted["id"])} and util[str(submitted["id"])][-1] == 85

        # another user may not see a private job (access: none, the default): its samples are as a job's that is not
        refused = await as_nobody(loaded.socket_path, "samples", job=submitted["id"])
        assert (
            refused["error"]["type"] == NotFound.__name__ and f"no job {submitted['id']}" in refused["error"]["message"]
        )
        with pytest.raises(NotFound, match="not in the cluster config: node02"):
            await client.call("samples", node="node02")
        with pytest.raises(UsageError, match="needs node"):
            await client.call("samples")
        await client.call("stop", jobs=[submitted["id"]])
