"""The lab's simulated GPUs under its jobs (`"load": "jobs"`): a GPU a process of the simulated node holds reads a
moving utilisation, found from the real processes' environments, as the demo's map and curves need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ftconsole.scheduler.node.agent_gpus import read_sim_gpus

GPU = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0, "temperature": 35}


def test_a_gpu_a_process_of_the_node_holds_reads_busy_and_the_others_as_the_file_says(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    other = tmp_path / "other.json"  # another simulated node's file: its processes hold nothing here
    path.write_text(json.dumps({"load": "jobs", "gpus": [dict(GPU, index=i) for i in range(3)]}))
    env = {**os.environ, "FTCONSOLE_SIM_GPUS": str(path), "CUDA_VISIBLE_DEVICES": "1"}
    elsewhere = {**os.environ, "FTCONSOLE_SIM_GPUS": str(other), "CUDA_VISIBLE_DEVICES": "2"}
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    with subprocess.Popen(sleep, env=env) as rank, subprocess.Popen(sleep, env=elsewhere) as stranger:
        try:
            reading = read_sim_gpus(str(path))
        finally:
            rank.kill()
            stranger.kill()
    util = [g["utilization"] for g in reading.gpus]
    assert util[0] == 0 and util[2] == 0  # idle; GPU 2 is held on the other node only
    assert 48 <= util[1] <= 96 and reading.gpus[1]["memory_used_mib"] == int(81559 * 0.6)
    assert reading.gpus[0]["memory_used_mib"] is None  # as the file says (no reading)


def test_without_load_the_file_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [dict(GPU, index=0)]}))
    env = {**os.environ, "FTCONSOLE_SIM_GPUS": str(path), "CUDA_VISIBLE_DEVICES": "0"}
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env) as rank:
        try:
            reading = read_sim_gpus(str(path))
        finally:
            rank.kill()
    assert reading.gpus[0]["utilization"] == 0
