"""`ftconsole predict`: a job spec against the probed state of a lab cluster."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from ftconsole.lab import LabCluster
from ftconsole.scheduler.decide.placement import Place, Wait
from ftconsole.scheduler.errors import UsageError
from ftconsole.scheduler.jobops import Scheduler
from ftconsole.scheduler.nodeops import ClusterService
from ftconsole.scheduler.rules import Caller
from ftconsole.scheduler.spec.config import load_config
from ftconsole.scheduler.spec.jobspec import parse_jobspec

ROOT = Caller(uid=0, gid=0, pid=os.getpid(), user="root")


def job(text: str):
    return parse_jobspec("name: t\ncommand: python train.py\n" + text)


async def test_predict_places_on_healthy_nodes_and_explains_waits(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=8) as lab:
        loaded = load_config(lab.config_path)
        async with ClusterService.open(loaded) as svc:
            await svc.probe()
            sched = Scheduler(svc)
            two = await sched.predict(ROOT, job("mode: pytorch\nnodes: 2\ngpus_per_node: 8\n"))
            assert isinstance(two, Place)
            assert [(n, len(g)) for n, g in two.nodes] == [("lab01", 8), ("lab02", 8)]

            # 5 nodes with 8 GPUs: only the four H100 nodes have 8 (lab05-08 have 4)
            five = await sched.predict(ROOT, job("mode: pytorch\nnodes: 5\ngpus_per_node: 8\n"))
            assert isinstance(five, Wait) and "4" in five.reason

            # 4 GPUs on every A100 node: lab07 is unhealthy (ECC), so only three are usable
            a100 = await sched.predict(ROOT, job("mode: pytorch\nnodes: 4\ngpus_per_node: 4\npool: a100\n"))
            assert isinstance(a100, Wait)
            three = await sched.predict(ROOT, job("mode: pytorch\nnodes: 3\ngpus_per_node: 4\npool: a100\n"))
            assert isinstance(three, Place) and "lab07" not in [n for n, _ in three.nodes]

            await svc.drain("lab0[5-6]", reason="maintenance", by="test")
            assert isinstance(
                await sched.predict(ROOT, job("mode: pytorch\nnodes: 3\ngpus_per_node: 4\npool: a100\n")), Wait
            )

            with pytest.raises(UsageError, match="spec 'big' is not defined"):
                await sched.predict(ROOT, job("spec: big\n"))


async def test_predict_cli_json_and_spec_errors(tmp_path: Path) -> None:
    async with LabCluster(tmp_path / "lab", nodes=2) as lab:
        env = {**os.environ, "FTCONSOLE_CONFIG": str(lab.config_path)}

        async def cli(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ftconsole.cli", *args, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
            return proc.returncode or 0, out.decode(), err.decode()

        assert (await cli("probe"))[0] == 0
        good = tmp_path / "job.yaml"
        good.write_text("name: ok\nmode: pytorch\nnodes: 2\ngpus_per_node: 4\ncommand: python train.py\n")
        code, out, _ = await cli("predict", str(good), "--json")
        doc = json.loads(out)
        assert code == 0 and doc["starts_now"] is True and [n["gpus"] for n in doc["nodes"]] == [[0, 1, 2, 3]] * 2

        bad = tmp_path / "bad.yaml"
        bad.write_text("name: bad\nnodes: 2\ncommand: make && ./train\n")
        code, out, err = await cli("predict", str(bad))
        assert code == 2 and out == ""
        assert f"{bad}:3: command: one statement only" in err
        assert f"{bad}:2: nodes" in err  # single mode with 2 nodes: every problem at once
