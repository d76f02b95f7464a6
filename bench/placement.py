"""Benchmark: one full placement pass over a large cluster and a long queue.

    .venv/bin/python bench/placement.py [--nodes 1000] [--jobs 10000] [--repeat 5] [--seed 1] [--profile]
                                        [--fairshare] [--quotas] [--preemption] [--leaf 16] [--spine 8]

Builds N nodes of 8 GPUs (four pools, three GPU models, two drivers, a few unhealthy; about 40% of the nodes
partly or fully used by running jobs, most with an end time, some without; then the same cluster idle) and a
queue of mixed jobs (1, 2, 4 or 8 GPUs per node on 1..16 nodes, mostly small; normal, urgent and very-urgent;
some requeued, some with two candidate specs, pool, model or driver constraints, most with a max_runtime).
It times `plan` (median of `--repeat` passes; each pass starts from the same state), for each cluster with the
topology off (`ClusterState.fabric` None: placement is blind to the switches) and on (a fabric of leaf switches of
`--leaf` nodes in name order, `--spine` leaves under each spine switch, one core switch above the spines: with 1000
nodes, 63 leaves and 8 spines; multi-node jobs go under the fewest leaf switches), the same state and queue, and
prints:

- pass s: the median wall time of one pass;
- placed: jobs the pass starts now; waiting: the others (with a reason each);
- placed/s: jobs placed per second of pass time; decided/s: jobs decided (placed or waiting) per second;
- multi: the multi-node jobs placed; leaves/job: the mean number of leaf switches their nodes hang under (counted
  on the same fabric with the topology off too);
With `--fairshare`, each pass first computes the fair-share factor of every queued job's project and user (20
projects, 60 users, some projects with much usage, two with more shares), as the scheduler does, and the queue is
ordered by it within each priority level; the time includes it. With `--quotas`, each pass first holds back
the jobs past a quota (half the projects at 64 GPUs and 40 running jobs, some users at 16 GPUs), walking the
queue in its order, as the scheduler does; the time includes it. With `--preemption`, half the running normal
jobs are preemptible (run 0 to 10 hours, a third of them saving a checkpoint on the signal) and each pass then
chooses whom the waiting urgent and very-urgent jobs preempt (`preempted`: jobs chosen); the time includes it.
The urgent cap is then off (with it, urgent jobs past the cap wait for it, not for GPUs, and preempt no one).

- slurm ref/s: Slurm's documented sustained rate of about 500 jobs/s, for scale (its figure is for a whole
  scheduler with launches, this one for the placement decision alone).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftconsole.format import print_table  # noqa: E402
from ftconsole.scheduler.decide.fairshare import factors  # noqa: E402
from ftconsole.scheduler.decide.placement import (  # noqa: E402
    Allocation,
    Candidate,
    ClusterState,
    Decision,
    JobRequest,
    NodeSlot,
    Place,
    Priority,
    plan,
    queue_order,
)
from ftconsole.scheduler.decide.preemption import Running, choose  # noqa: E402
from ftconsole.scheduler.decide.quotas import Limits, Queued, hold_back  # noqa: E402
from ftconsole.scheduler.decide.topology import Fabric  # noqa: E402

POOLS = ("train", "train", "research", "infer", "dev")
MODELS = ("H100", "H100", "A100", "H200")
DRIVERS = ("550.54.15", "535.161.08")
SLURM_JOBS_PER_S = 500
NOW = 1_000_000.0


def build_cluster(count: int, rng: random.Random, busy: float = 0.4) -> ClusterState:
    nodes, allocations = [], []
    for i in range(count):
        name = f"gpu{i:04d}"
        nodes.append(
            NodeSlot(
                name,
                rng.choice(POOLS),
                rng.choice(MODELS),
                rng.choice(DRIVERS),
                8,
                state_ok=rng.random() > 0.03,
            )
        )
        if rng.random() < busy:
            used = rng.choice([1, 2, 4, 6, 8])
            ends = None if rng.random() < 0.1 else NOW + rng.uniform(60, 48 * 3600)
            priority = Priority.URGENT if rng.random() < 0.05 else Priority.NORMAL
            allocations.append(Allocation(f"run{i}", name, tuple(range(used)), ends, f"proj{i % 20}", priority))
    return ClusterState(tuple(nodes), tuple(allocations))


def build_fabric(count: int, leaf: int = 16, spine: int = 8, block: int = 0, sizes: Sequence[int] = ()) -> Fabric:
    """Leaf switches of `leaf` nodes each (build_cluster's names, in order), `spine` leaves under each spine switch,
    and one core switch above the spines; with `block`, blocks of that many nodes in order, and `sizes` their
    block_sizes."""
    names = [f"gpu{i:04d}" for i in range(count)]
    leaves = {f"leaf{i // leaf:03d}": names[i : i + leaf] for i in range(0, count, leaf)}
    parents = {name: f"spine{i // spine:02d}" for i, name in enumerate(leaves)}
    parents |= {spine_name: "core" for spine_name in set(parents.values())}
    blocks = {f"nvl{i // block:03d}": names[i : i + block] for i in range(0, count, block)} if block else None
    return Fabric.of(leaves, parents, blocks, sizes)


def leaves_per_job(decisions: Sequence[Decision], fabric: Fabric) -> tuple[int, float]:
    """The multi-node jobs placed, and the mean number of leaf switches each one's nodes hang under."""
    counts = [len(fabric.leaves(name for name, _ in d.nodes)) for d in decisions
              if isinstance(d, Place) and len(d.nodes) > 1]  # fmt: skip
    return len(counts), statistics.fmean(counts) if counts else 0.0


def build_queue(count: int, rng: random.Random) -> list[JobRequest]:
    return [build_job(i, rng) for i in range(count)]


def build_job(i: int, rng: random.Random) -> JobRequest:
    gpus = rng.choices([1, 2, 4, 8], weights=[3, 2, 2, 3])[0]
    nodes = 1 if gpus < 8 and rng.random() < 0.7 else rng.choices([1, 2, 4, 8, 16], weights=[4, 3, 2, 1, 1])[0]
    model = rng.choice([None, None, *MODELS])
    candidates = [Candidate(f"{gpus}x{model or 'any'}", gpus, model)]
    if rng.random() < 0.15:
        candidates.append(Candidate("fallback", max(1, gpus // 2), rng.choice(MODELS)))
    return JobRequest(
        id=f"job{i:05d}",
        priority=rng.choices(list(Priority), weights=[85, 12, 3])[0],
        submitted_at=NOW - rng.uniform(0, 7 * 86400),
        requeued=rng.random() < 0.02,
        project=f"proj{rng.randrange(20)}",
        nodes=nodes,
        candidates=tuple(candidates),
        pool=rng.choice([None, None, *POOLS]),
        driver_version=rng.choice([None, None, None, *DRIVERS]),
        max_runtime=None if rng.random() < 0.2 else rng.uniform(600, 24 * 3600),
    )


SHARES = {"proj0": 4.0, "proj1": 2.0}
# quotas of half the projects (64 GPUs, 40 running jobs) and of a few users (16 GPUs)
QUOTAS = {("project", f"proj{p}"): Limits(gpus=64, running_jobs=40) for p in range(0, 20, 2)} | {
    ("user", f"user{u:02d}"): Limits(gpus=16) for u in range(0, 60, 6)
}


def fair_inputs(queue: list[JobRequest], rng: random.Random) -> tuple[dict[tuple[str, str], float], list[str]]:
    """A fair-share usage of the 20 projects by 60 users (some projects used a lot, some nothing) and each
    queued job's user."""
    users = [f"user{i:02d}" for i in range(60)]
    used = {(f"proj{p}", rng.choice(users)): rng.expovariate(1 / 3600) * (p % 4) for p in range(20) for _ in range(5)}
    return used, [rng.choice(users) for _ in queue]


def preemptible(state: ClusterState, rng: random.Random) -> dict[str, Running]:
    """Half the running normal jobs, preemptible: run 0 to 10 hours, a third saving a checkpoint in 60 s."""
    out = {}
    for a in state.allocations:
        if a.priority is Priority.NORMAL and rng.random() < 0.5:
            grace = 60.0 if rng.random() < 1 / 3 else None
            out[a.job_id] = Running(a.job_id, a.priority, len(a.gpus), NOW - rng.uniform(0, 36000), True, grace)
    return out


def time_pass(
    state: ClusterState,
    queue: list[JobRequest],
    repeat: int,
    fair: tuple[dict[tuple[str, str], float], list[str]] | None,
    quota_owners: list[str] | None = None,
    running: dict[str, Running] | None = None,
) -> tuple[float, int, int, int, list[Decision]]:
    times = []
    placed = decided = preempted = 0
    decisions: list[Decision] = []
    for _ in range(repeat):
        start = time.perf_counter()
        if fair is not None:  # as the scheduler does each pass: the factors of the queue's (project, user)s, set
            # where it builds each job's request anyway (so the queue with them is built once, outside the time)
            used, owners = fair
            pairs = [(j.project, u) for j, u in zip(queue, owners, strict=True)]
            got = factors(used, pairs, SHARES, 1.0)
            if queue[0].fairshare != got[pairs[0]].value:
                stop = time.perf_counter()
                queue = [replace(j, fairshare=got[pair].value) for j, pair in zip(queue, pairs, strict=True)]
                start += time.perf_counter() - stop
        placing, held = queue, {}
        if quota_owners is not None:  # as the scheduler does each pass: hold back the jobs past a quota
            user_of = dict(zip((j.id for j in queue), quota_owners, strict=True))
            ordered = [Queued(j.id, j.project, user_of[j.id], j.nodes * max(c.gpus_per_node for c in j.candidates))
                       for j in queue_order(queue)]  # fmt: skip
            held = hold_back(ordered, QUOTAS.get, {})
            placing = [j for j in queue if j.id not in held]
        decisions = plan(state, placing, NOW, urgent_cap=None if running is not None else 3)
        if running is not None:  # as the scheduler does each pass: whom the waiting jobs preempt
            chosen = choose(state, placing, decisions, running, NOW, min_runtime=600)
            preempted = sum(len(p.new) for p in chosen)
        times.append(time.perf_counter() - start)
        placed = sum(1 for d in decisions if isinstance(d, Place))
        decided = len(decisions) + len(held)  # the jobs a quota holds back wait too
    return statistics.median(times), placed, decided, preempted, decisions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one pass")
    parser.add_argument("--fairshare", action="store_true", help="fair share on: each pass computes the factors")
    parser.add_argument("--quotas", action="store_true", help="quotas on: each pass holds back the jobs past one")
    parser.add_argument("--preemption", action="store_true", help="preemptible jobs: each pass chooses victims")
    parser.add_argument("--leaf", type=int, default=16, help="nodes per leaf switch (topology on)")
    parser.add_argument("--spine", type=int, default=8, help="leaf switches per spine switch (topology on)")
    parser.add_argument("--block", type=int, default=0, help="nodes per block: a third row, topology with blocks")
    parser.add_argument("--block-sizes", default="", help="its block_sizes, as 16,32 (default: the block alone)")
    args = parser.parse_args()

    fabric = build_fabric(args.nodes, args.leaf, args.spine)
    sizes = [int(s) for s in args.block_sizes.split(",") if s] or ([args.block] if args.block else [])
    blocked = build_fabric(args.nodes, args.leaf, args.spine, args.block, sizes) if args.block else None
    rows = []
    for label, busy in (("40% busy", 0.4), ("idle", 0.0)):
        rng = random.Random(args.seed)
        state = build_cluster(args.nodes, rng, busy)
        queue = build_queue(args.jobs, rng)
        fair = fair_inputs(queue, rng) if args.fairshare or args.quotas else None
        quota_owners = fair[1] if fair is not None and args.quotas else None
        fair = fair if args.fairshare else None
        running = preemptible(state, rng) if args.preemption else None
        flags = (("fair share", args.fairshare), ("quotas", args.quotas), ("preemption", args.preemption))
        on = [name for name, flag in flags if flag]
        label += f" ({', '.join(on)})" if on else ""
        for topology in ("off", "on", *(["blocks " + ",".join(map(str, sizes))] if blocked else [])):
            placing = replace(state, fabric={"off": None, "on": fabric}.get(topology, blocked))
            if args.profile:
                print(f"--- {label}, topology {topology}")
                profiler = cProfile.Profile()
                profiler.runcall(plan, placing, queue, NOW, urgent_cap=3)
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
            seconds, placed, decided, preempted, decisions = time_pass(
                placing, queue, args.repeat, fair, quota_owners, running
            )
            multi, leaves = leaves_per_job(decisions, fabric)
            rows.append(
                [
                    label,
                    topology,
                    args.nodes,
                    8 * args.nodes,
                    args.jobs,
                    f"{seconds:.3f}",
                    placed,
                    decided - placed,
                    f"{placed / seconds:,.0f}",
                    f"{decided / seconds:,.0f}",
                    multi,
                    f"{leaves:.2f}",
                    preempted if running is not None else "-",
                    SLURM_JOBS_PER_S,
                ]
            )
    headers = [
        "cluster",
        "topology",
        "nodes",
        "gpus",
        "jobs",
        "pass s",
        "placed",
        "waiting",
        "placed/s",
        "decided/s",
        "multi",
        "leaves/job",
        "preempted",
        "slurm ref/s",
    ]
    print_table(headers, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
