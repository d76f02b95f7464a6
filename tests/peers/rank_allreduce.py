"""One rank of a peer test job: a gloo all-reduce over every rank, then a record of what this rank saw.

Started by the real launcher under test (torch.distributed.run, torchrun, DeepSpeed's runner, mpirun, hydra);
run with the peer environment's Python (.venv-peers). Its rank and world size come from whichever launcher
started it. It all-reduces (1, rank, node number) with gloo, so the sum proves the world size, that every
rank took part once, and on which nodes they ran (see `lab_node`). Then it writes
``$PEER_RESULTS/<rank>.json``, sleeps ``$PEER_SLEEP`` seconds where that is set, and exits with ``$PEER_EXIT``
(``RANK:CODE``) if it names this rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from labnode import lab_node

SEEN = ("FT_JOB_ID", "FT_ATTEMPT", "FT_HOSTFILE", "FT_OUTPUT_DIR", "PEER_MARK", "CUDA_VISIBLE_DEVICES", "DS_ENV_FILE")


def first(*names: str) -> str:
    return next(os.environ[n] for n in names if n in os.environ)


def main() -> int:
    rank = int(first("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"))
    world = int(first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)  # for env:// under an MPI launcher
    node = lab_node()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    total = torch.tensor([1.0, float(rank), float(int(node.removeprefix("node")))])
    dist.all_reduce(total)
    dist.destroy_process_group()
    record = {
        "rank": rank,
        "world": world,
        "node": node,
        "sum": total.tolist(),
        "env": {k: os.environ.get(k) for k in SEEN},
    }
    path = os.path.join(os.environ["PEER_RESULTS"], f"{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)
    print(f"rank {rank}/{world} on {node}: sum {record['sum']}", flush=True)
    time.sleep(float(os.environ.get("PEER_SLEEP") or 0))  # a job that runs on after its all-reduce (to stop)
    exit_rank, _, code = os.environ.get("PEER_EXIT", "").partition(":")
    return int(code) if exit_rank == str(rank) else 0


if __name__ == "__main__":
    sys.exit(main())
