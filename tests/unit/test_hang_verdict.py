"""The hang verdict (scheduler/decide/hangs.py), one row per rule, and the ranks' phrasing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ftconsole.scheduler.decide.hangs import Frame, Rank, Xid, ranges, verdict
from ftconsole.scheduler.evidence import _units

C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
ALL_REDUCE = (Frame("all_reduce", C10D, 2501), Frame("wrapper", "/x/torch/distributed/c10d_logger.py", 81),
              Frame("train_step", "/job/train.py", 40), Frame("<module>", "/job/train.py", 90))  # fmt: skip
LOADING = (Frame("load_batch", "/job/train.py", 88), Frame("train_step", "/job/train.py", 38))
SPINNING = (Frame("spin", "/job/train.py", 12), Frame("<module>", "/job/train.py", 90))


def waiting(rank: int, node: str = "gpu01", cpu: float = 0.0) -> Rank:
    return Rank(rank, node, pid=100 + rank, state="S", cpu=cpu, frames=ALL_REDUCE)


def traced(rank: Rank, seq: int, done: bool = False, group: str = "0") -> Rank:
    return Rank(**{**rank.__dict__, "trace": ((group, seq, "all_reduce", done),)})


CASES = {
    "a rank behind in torch's trace, loading data": (
        [
            traced(waiting(0), 1532),
            traced(Rank(1, "gpu02", pid=201, state="S", frames=LOADING), 1531, True),
            traced(waiting(2), 1532),
        ],
        (1, "gpu02", "behind", False),
        "rank 1 on gpu02 is behind: its last collective is all_reduce #1531, at train.py:88 in load_batch; "
        "ranks 0, 2 are in all_reduce #1532",
    ),
    "two ranks behind, the furthest named": (
        [traced(waiting(0), 12, True), traced(waiting(1, "gpu02"), 10, True), traced(waiting(2), 11, True)],
        (1, "gpu02", "behind", False),
        "rank 1 on gpu02 is behind: its last collective is all_reduce #10, at distributed_c10d.py:2501 in "
        "all_reduce (rank 2 is behind too); rank 0 is past all_reduce #12",
    ),
    "traces that agree name nobody by them": (
        [traced(waiting(0), 7), traced(waiting(1, "gpu02"), 7)],
        (None, None, "none", False),
        "no rank stands out: ranks 0-1 wait in all_reduce",
    ),
    "a stopped rank": (
        [waiting(0), Rank(1, "gpu02", pid=201, state="T", frames=LOADING, stopped=(201,)), waiting(2)],
        (1, "gpu02", "stopped", False),
        "rank 1 on gpu02 is stopped (pid 201: SIGSTOP or a debugger); ranks 0, 2 wait in all_reduce",
    ),
    "a rank stopped through its launcher only": (
        [waiting(0), Rank(1, "gpu02", pid=201, state="S", frames=ALL_REDUCE, stopped=(200,))],
        (1, "gpu02", "stopped", False),
        "rank 1 on gpu02 is stopped (pid 200: SIGSTOP or a debugger); rank 0 waits in all_reduce",
    ),
    "a GPU fallen off the bus (a hardware Xid) comes before the driver's wait it causes": (
        [
            waiting(0),
            Rank(
                1,
                "gpu07",
                pid=301,
                state="D",
                wchan="nv_wait",
                frames=ALL_REDUCE,
                blocked=((301, "nv_wait"),),
                xids=(Xid(79, 3, 1000.0, "pid=301, GPU has fallen off the bus."),),
            ),
        ],
        (1, "gpu07", "xid", True),
        "rank 1 on gpu07: GPU 3 logged Xid 79 (GPU has fallen off the bus); it is at distributed_c10d.py:2501 in "
        "all_reduce; rank 0 waits in all_reduce",
    ),
    "an Xid of the program's own (a page fault) names the rank, not the hardware": (
        [waiting(0), Rank(1, "gpu02", pid=201, state="S", frames=LOADING, xids=(Xid(31, 0, 5.0, "MMU Fault"),))],
        (1, "gpu02", "xid", False),
        "rank 1 on gpu02: GPU 0 logged Xid 31 (GPU memory page fault); it is at train.py:88 in load_batch; rank 0 "
        "waits in all_reduce",
    ),
    "of two ranks with Xids, the hardware one; its hardware Xid told before the later ones": (
        [
            Rank(0, "gpu01", pid=101, state="S", xids=(Xid(13, 0, 1.0),)),
            Rank(1, "gpu02", pid=201, state="S", xids=(Xid(74, None, 9.0), Xid(13, None, 10.0))),
        ],
        (1, "gpu02", "xid", True),
        "rank 1 on gpu02: a GPU logged Xid 74 (NVLink error) (1 more)",
    ),
    "a stopped rank comes before an Xid": (
        [Rank(0, "gpu01", pid=101, state="T", stopped=(101,)), Rank(1, "gpu02", pid=201, xids=(Xid(79, 0, 1.0),))],
        (0, "gpu01", "stopped", False),
        "rank 0 on gpu01 is stopped (pid 101: SIGSTOP or a debugger); rank 1 has no stack",
    ),
    "uninterruptible sleep in the driver": (
        [waiting(0), Rank(1, "gpu07", pid=301, state="D", blocked=((301, "nv_wait_for_completion"),))],
        (1, "gpu07", "uninterruptible", True),
        "rank 1 on gpu07 is in uninterruptible sleep in nv_wait_for_completion (pid 301) (a driver's wait: the "
        "node's hardware?); rank 0 waits in all_reduce",
    ),
    "uninterruptible sleep on a file system": (
        [Rank(0, "gpu01", pid=5, state="D", blocked=((5, "rpc_wait_bit_killable"),)), waiting(1)],
        (0, "gpu01", "uninterruptible", False),
        "rank 0 on gpu01 is in uninterruptible sleep in rpc_wait_bit_killable (pid 5); rank 1 waits in all_reduce",
    ),
    "the only rank outside the collective": (
        [waiting(0), waiting(1), waiting(2), Rank(3, "gpu07", pid=9, state="S", cpu=0.0, frames=LOADING)]
        + [waiting(r, "gpu08") for r in range(4, 8)],
        (3, "gpu07", "outside-collective", False),
        "rank 3 on gpu07 is not in a collective: train.py:88 in load_batch; ranks 0-2, 4-7 wait in all_reduce",
    ),
    "outside the collective and busy": (
        [waiting(0), Rank(1, "gpu02", pid=9, state="R", cpu=0.98, frames=SPINNING)],
        (1, "gpu02", "outside-collective", False),
        "rank 1 on gpu02 is not in a collective: train.py:12 in spin (busy: 98% of a core); rank 0 waits in all_reduce",
    ),
    "two outside of four: the busier named first": (
        [waiting(0), Rank(1, "a", frames=LOADING, cpu=0.0), Rank(2, "b", frames=SPINNING, cpu=0.9), waiting(3)],
        (2, "b", "outside-collective", False),
        "rank 2 on b is not in a collective: train.py:12 in spin (busy: 90% of a core) (nor is rank 1); "
        "ranks 0, 3 wait in all_reduce",
    ),
    "busy while the others are idle, no stacks": (
        [
            Rank(0, "a", cpu=0.0, stack_error="py-spy is not on this node"),
            Rank(1, "b", cpu=1.0),
            Rank(2, "c", cpu=0.01),
        ],
        (1, "b", "busy", False),
        "rank 1 on b is busy (100% of a core); rank 0 has no stack (py-spy is not on this node); rank 2 has no stack",
    ),
    "every rank in the same collective": (
        [waiting(0), waiting(1), waiting(2, "gpu02")],
        (None, None, "none", False),
        "no rank stands out: ranks 0-2 wait in all_reduce",
    ),
    "every rank busy": (
        [Rank(0, "a", cpu=1.0, frames=SPINNING), Rank(1, "b", cpu=0.9, frames=SPINNING)],
        (None, None, "none", False),
        "no rank stands out: ranks 0-1 are at train.py:12 in spin",
    ),
    "most outside the collective: no single rank": (
        [waiting(0), Rank(1, "a", frames=LOADING), Rank(2, "b", frames=LOADING)],
        (None, None, "none", False),
        "no rank stands out: ranks 1-2 are at train.py:88 in load_batch; rank 0 waits in all_reduce",
    ),
    "a rank gone is left out": (
        [waiting(0), Rank(1, "b", gone="its processes are gone"), Rank(2, "c", frames=LOADING)],
        (2, "c", "outside-collective", False),
        "rank 2 on c is not in a collective: train.py:88 in load_batch; rank 0 waits in all_reduce",
    ),
    "most ranks moving: none named": (
        [
            Rank(0, "a", frames=LOADING, moving=True),
            Rank(1, "b", frames=ALL_REDUCE, moving=True),
            Rank(2, "c", frames=ALL_REDUCE, moving=False),
        ],
        (None, None, "moving", False),
        "the ranks are moving: 2 of 3 stacks changed between two looks; none is stuck",
    ),
    "one rank moving of two: the normal rules": (
        [Rank(0, "a", frames=SPINNING, cpu=1.0, moving=True), Rank(1, "b", frames=ALL_REDUCE, moving=False)],
        (0, "a", "outside-collective", False),
        "rank 0 on a is not in a collective: train.py:12 in spin (busy: 100% of a core); rank 1 waits in all_reduce",
    ),
    "a stopped rank before the others' moving": (
        [Rank(0, "a", stopped=(5,), moving=False), Rank(1, "b", moving=True), Rank(2, "c", moving=True)],
        (0, "a", "stopped", False),
        "rank 0 on a is stopped (pid 5: SIGSTOP or a debugger); ranks 1-2 have no stack",
    ),
    "nothing could be looked at": (
        [Rank(0, "a", gone="the node rebooted since it started")],
        (None, None, "none", False),
        "no rank could be looked at",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_verdict(name: str) -> None:
    ranks, (rank, node, rule, hardware), reason = CASES[name]
    got = verdict(ranks)
    assert (got.rank, got.node, got.rule, got.hardware) == (rank, node, rule, hardware)
    assert got.reason == reason


def test_a_collective_is_one_of_torch_distributed_not_a_user_function_of_that_name() -> None:
    mine = Rank(0, "a", frames=(Frame("all_reduce", "/job/my_ops.py", 3),))
    theirs = Rank(1, "a", frames=(Frame("wait", "/x/torch/distributed/distributed_c10d.py", 9), *LOADING))
    assert (mine.collective, theirs.collective) == (None, "wait")


@pytest.mark.parametrize(("numbers", "text"), [([0], "0"), ([0, 1, 2, 4, 6, 7], "0-2, 4, 6-7"), ([5, 3, 4], "3-5")])
def test_ranges(numbers: list[int], text: str) -> None:
    assert ranges(numbers) == text


# -- evidence recorded from real runs --------------------------------------------------------------------------
# tests/unit/golden/evidence: what `debug` gathered from real torch jobs (4 gloo ranks under torch.distributed.run
# on two sshd nodes, tests/peers/test_hang_evidence.py, recorded with FT_RECORD_EVIDENCE=that folder): the
# processes of each run as the nodes said, turned into the verdict's ranks (`evidence._units`) and judged again.

GOLDEN = Path(__file__).resolve().parent / "golden" / "evidence"
RECORDED = {
    "torch-stop.json": (1, "node01", "stopped"),
    "torch-load.json": (2, "node02", "outside-collective"),
    "torch-spin.json": (0, "node01", "outside-collective"),
}


def judged(doc: dict[str, Any]) -> Any:
    return verdict(sorted((u for run in doc["runs"] for u in _units(run)), key=lambda u: (u.rank, u.node)))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_verdict_of_evidence_recorded_from_real_torch_jobs(name: str) -> None:
    doc = json.loads((GOLDEN / name).read_text())
    got = judged(doc)
    assert (got.rank, got.node, got.rule) == RECORDED[name]
    assert got.reason == doc["verdict"]["reason"]
    # the launchers have RANK too (the node's): the ranks are their workers, each with its own RANK
    procs = [p for run in doc["runs"] for p in run["processes"]]
    workers = {p["pid"]: int(p["env"]["RANK"]) for p in procs if p["python"] and "distributed.run" not in p["cmdline"]}
    units = {u.pid: u.rank for run in doc["runs"] for u in _units(run)}
    assert units == workers and sorted(units.values()) == [0, 1, 2, 3]


def test_the_recorded_stopped_rank_running_again_is_the_one_outside_the_collective() -> None:
    doc = json.loads((GOLDEN / "torch-stop.json").read_text())
    for run in doc["runs"]:
        for p in run["processes"]:
            p["state"] = "S" if p["state"] == "T" else p["state"]
    got = judged(doc)
    assert (got.rank, got.rule) == (1, "outside-collective"), got.reason
    assert got.reason.startswith("rank 1 on node01 is not in a collective: hang_rank.py:"), got.reason


def test_a_launchers_worker_has_the_xids_of_the_runs_gpu_at_its_local_rank_and_those_of_a_gpu_not_known() -> None:
    def worker(pid: int, local: int) -> dict[str, Any]:
        env = {"RANK": str(4 + local), "LOCAL_RANK": str(local)}
        return {"pid": pid, "ppid": 10, "python": True, "state": "S", "env": env}

    run = {"rank": 1, "node": "gpu02", "gpus": [2, 5], "sample": 0.5,
           "processes": [{"pid": 10, "ppid": 1, "python": True, "state": "S", "env": {"RANK": "1"}},
                         worker(11, 0), worker(12, 1)],
           "xids": [{"code": 79, "gpu": 5, "time": 3.0, "text": "fallen off"},
                    {"code": 13, "gpu": None, "time": 4.0}]}  # fmt: skip
    got = {u.rank: [(x.code, x.gpu) for x in u.xids] for u in _units(run)}
    assert got == {4: [(13, None)], 5: [(79, 5), (13, None)]}
    named = verdict(_units(run))
    assert (named.rank, named.rule, named.hardware) == (5, "xid", True)


def test_the_debug_text_lists_each_nodes_xid_once_and_the_nodes_whose_kernel_log_was_not_read() -> None:
    from ftconsole.debug_cli import evidence_text

    xid = {"code": 79, "gpu": 1, "time": 0.0, "text": "pid=7, GPU has fallen off the bus.", "hardware": True,
           "what": "GPU 1 logged Xid 79 (GPU has fallen off the bus)"}  # fmt: skip
    ranks = [{"rank": n, "node": "gpu07", "pid": 100 + n, "state": "S", "wchan": None, "cpu": 0.0, "collective": None,
              "where": "x", "stack": [], "gone": None, "xids": [xid]} for n in (0, 1)]  # fmt: skip
    verdict_doc = {"rank": 0, "node": "gpu07", "reason": "rank 0 on gpu07: ...", "rule": "xid"}
    runs = [{"node": "gpu08", "xids_error": "cannot read the kernel log: /dev/kmsg: Operation not permitted"}]
    doc = {"job": 7, "attempt": 1, "time": 0.0, "seconds": 1.0, "verdict": verdict_doc, "ranks": ranks, "runs": runs}
    lines = evidence_text(doc).splitlines()
    assert [ln for ln in lines if "Xid 79" in ln] == [
        f"  gpu07: GPU 1 logged Xid 79 (GPU has fallen off the bus) at {time.strftime('%H:%M:%S', time.localtime(0))}"
        " [hardware]: pid=7, GPU has fallen off the bus."
    ]
    assert lines[lines.index("kernel log not read:") + 1] == f"  gpu08: {runs[0]['xids_error']}"


@pytest.mark.parametrize(
    ("wchan", "hardware"),
    [
        ("nv_wait_for_completion", True),
        ("nvidia_ioctl", True),
        ("_nv012345rm", True),
        ("uvm_spin_loop", True),
        ("ib_uverbs_write", True),
        ("mlx5_cmd_exec", True),
        ("rdma_resolve_addr", True),
        # waits a user can cause at will: never read as the node's hardware (issue 40)
        ("nvme_poll", False),  # a disk under heavy I/O
        ("invalidate_inode_pages2", False),  # held "nv" inside
        ("fuse_wait_answer", False),
        ("rpc_wait_bit_killable", False),
        ("do_nccl_wait", False),  # no such kernel symbol: "nccl" is user space
        ("", False),
    ],
)
def test_only_a_gpu_or_fabric_drivers_wait_reads_as_the_hardware(wchan: str, hardware: bool) -> None:
    found = verdict([Rank(0, "gpu01", pid=5, state="D", blocked=((5, wchan),)), waiting(1)])
    assert (found.rule, found.hardware) == ("uninterruptible", hardware)
