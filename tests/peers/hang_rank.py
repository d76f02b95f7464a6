"""A rank of the hang evidence tests (test_hang_evidence.py): gloo all-reduces in a loop, with the peer
environment's torch, under the real launcher. The rank named by ``PEER_HANG=HOW:RANK`` leaves the loop after three
rounds: ``stop`` stops itself (SIGSTOP), ``load`` sleeps in `load_batch` (a data loader that waits on a slow
file system), ``spin`` turns in a busy loop (`spin`). The other ranks then wait in all_reduce."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def load_batch() -> None:
    time.sleep(3600)


def spin() -> None:
    x = 0
    while True:
        x += 1


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    how, _, who = os.environ.get("PEER_HANG", "").partition(":")
    total = torch.ones(4)
    for step in range(1_000_000):
        if step == 3 and str(rank) == who:
            print(f"rank {rank} hangs: {how}", flush=True)
            if how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif how == "load":
                load_batch()
            elif how == "spin":
                spin()
        dist.all_reduce(total)
        if step == 3:
            print(f"rank {rank} past step 3", flush=True)
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
