"""Which rank of a hung job stands out, and why (issue 29): pure, from the evidence every rank gave.

The evidence of one rank (`Rank`) is one process that runs the training: a launcher's worker (a Python process
with RANK in its environment and no such process under it), else the run's own main process. `verdict` applies
these rules in order and names the first rank that one of them singles out, with the reason in one line:

1. stopped: a process of the rank is stopped (state T or t: SIGSTOP, a debugger);
2. xid: the NVIDIA driver logged an Xid for the rank's GPU since the attempt started (the node's kernel log;
   NVIDIA's catalog says which point to the hardware: `HARDWARE_XIDS`);
3. uninterruptible: one sleeps in the kernel where no signal reaches it (state D), with its wait channel (a
   driver's: the evidence points to hardware);
   (then, when most ranks' stacks changed between two looks, the job moves: no rank is named, rule "moving")
4. behind: where the ranks keep torch's flight recorder trace (debug.torch_trace), its last collective's
   sequence number is below the others' (they wait in, or are past, a collective it has not reached);
5. outside the collective: the others wait in a collective (all_reduce, barrier...) and this one does not: the
   innermost frame of its main thread says where it is (busy or not, by its CPU time);
6. busy: its CPU time moves while the others' does not.

With no rank singled out, the verdict says what they share ("every rank waits in all_reduce") with rank None.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

COLLECTIVES = frozenset({
    "all_reduce", "allreduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "allgather",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "all_to_all", "all_to_all_single", "alltoall", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "wait", "synchronize", "Allreduce", "Barrier", "Bcast", "Allgather",
})  # fmt: skip
COLLECTIVE_FILES = re.compile(r"torch/distributed/|deepspeed/comm/|mpi4py|horovod/|torch/nn/parallel/")
BUSY = 0.25  # of a core over the sample: CPU time that moves
IDLE = 0.05  # ... that does not
# The wait channels of the GPU and fabric drivers, by their symbols' prefixes (nvidia.ko's nvidia_*, nv_*, _nv000123rm;
# nvidia-uvm's uvm_*; the InfiniBand stack's ib_*, mlx5_*, rdma_*). Anchored: a wait elsewhere (nvme_*, an NFS or
# FUSE wait a user can cause at will) is never the GPU's, and a node leaves service only on the driver's evidence.
HARDWARE_WCHAN = re.compile(r"(?:nvidia|nv_|_nv\d|uvm_|ib_|mlx\d*_|rdma_)")
# NVIDIA's Xid catalog: the errors that point to the GPU, its memory, its links or its firmware (others, such as
# 13, 31 and 43, are most often the program's own fault: a bad address, a kernel that faulted)
HARDWARE_XIDS = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remap", 64: "ECC page retirement or row remap failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error",
    140: "unrecovered ECC error",
}  # fmt: skip
OTHER_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
              45: "preemptive cleanup"}  # fmt: skip


@dataclass(frozen=True)
class Xid:
    """An Xid the driver logged for one of the rank's GPUs (gpu None: the node's GPU it names is not known)."""

    code: int
    gpu: int | None
    time: float
    text: str = ""

    @property
    def hardware(self) -> bool:
        return self.code in HARDWARE_XIDS

    def __str__(self) -> str:
        what = HARDWARE_XIDS.get(self.code) or OTHER_XIDS.get(self.code)
        where = f"GPU {self.gpu}" if self.gpu is not None else "a GPU"
        return f"{where} logged Xid {self.code}" + (f" ({what})" if what else "")


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.file.rsplit("/", 1)[-1]
        return f"{where}:{self.line} in {self.name}" if self.line is not None else f"{where} in {self.name}"


@dataclass(frozen=True)
class Rank:
    """What one rank was doing (see the module's docstring)."""

    rank: int
    node: str
    pid: int | None = None
    state: str | None = None  # /proc state of the process: R S D T t Z I
    wchan: str | None = None
    cpu: float | None = None  # share of a core its CPU time moved over the sample (None: not sampled)
    frames: tuple[Frame, ...] = ()  # its main thread's stack, innermost first (empty: not read)
    stack_error: str | None = None
    stopped: tuple[int, ...] = ()  # pids of its processes (a launcher's included) that are stopped
    blocked: tuple[tuple[int, str], ...] = ()  # (pid, wait channel) of those in uninterruptible sleep
    moving: bool | None = None  # its main thread's stack changed between two looks (None: not known)
    gone: str | None = None  # why nothing of it could be looked at
    # torch's flight recorder trace (debug.torch_trace): per process group, its last collective (seq, op, done)
    trace: tuple[tuple[str, int, str, bool], ...] = ()
    xids: tuple[Xid, ...] = ()  # the driver's Xids for its GPUs since the attempt started, oldest first

    def last(self, group: str) -> tuple[int, str, bool] | None:
        """(sequence number, op, done) of its last collective in process group `group`, as its trace says."""
        for name, seq, op, done in self.trace:
            if name == group:
                return seq, op, done
        return None

    @property
    def collective(self) -> str | None:
        """The collective its main thread waits in (the outermost such frame), or None."""
        found = None
        for frame in self.frames:
            if frame.name in COLLECTIVES and COLLECTIVE_FILES.search(frame.file):
                found = frame.name
        return found

    @property
    def where(self) -> str:
        """Its innermost frame, or what is known instead."""
        if self.frames:
            return str(self.frames[0])
        return f"no stack ({self.stack_error})" if self.stack_error else "no stack"


@dataclass(frozen=True)
class Verdict:
    rank: int | None  # the rank that stands out (None: none does)
    node: str | None
    reason: str  # one line
    rule: str  # stopped | xid | uninterruptible | moving | behind | outside-collective | busy | none
    hardware: bool = False  # the evidence points to the node's hardware (a hardware Xid, a driver's wait)
    ranks: tuple[int, ...] = field(default=())  # every rank singled out by that rule


def ranges(numbers: Sequence[int]) -> str:
    """0, 1, 2, 4, 6, 7 -> "0-2, 4, 6-7"."""
    out: list[str] = []
    for n in sorted(set(numbers)):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def _others(ranks: Sequence[Rank], standout: Sequence[Rank]) -> str:
    """What the other ranks do, in a few words: "; ranks 0-2, 4-7 wait in all_reduce"."""
    groups: dict[str, list[int]] = {}  # the collective it waits in, or its innermost frame -> ranks
    for r in ranks:
        if r not in standout:
            groups.setdefault(r.collective or r.where, []).append(r.rank)
    parts = []
    for what, numbers in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        one = len(numbers) == 1
        who = f"rank {numbers[0]}" if one else f"ranks {ranges(numbers)}"
        if what in COLLECTIVES:
            parts.append(f"{who} {'waits' if one else 'wait'} in {what}")
        elif what.startswith("no stack"):
            parts.append(f"{who} {'has' if one else 'have'} {what}")
        else:
            parts.append(f"{who} {'is' if one else 'are'} at {what}")
    return "".join(f"; {p}" for p in parts)


def _busy(rank: Rank) -> str:
    return f" (busy: {rank.cpu:.0%} of a core)" if rank.cpu is not None and rank.cpu >= BUSY else ""


def _behind(seen: Sequence[Rank]) -> Verdict | None:
    """Rule "behind": in the process group most ranks' traces have, the ranks whose last collective's sequence
    number is below the others' (the furthest behind named, with where it is)."""
    traced = [r for r in seen if r.trace]
    if len(traced) < 2:
        return None
    counts: dict[str, int] = {}
    for r in traced:
        for name, *_ in r.trace:
            counts[name] = counts.get(name, 0) + 1
    group = min(counts, key=lambda g: (-counts[g], g))
    lasts = {r.rank: last for r in traced if (last := r.last(group)) is not None}
    top = max(seq for seq, _, _ in lasts.values())
    behind = [r for r in traced if r.rank in lasts and lasts[r.rank][0] < top]
    ahead = [r for r in traced if r.rank in lasts and lasts[r.rank][0] == top]
    if not behind or not ahead:
        return None
    first = min(behind, key=lambda r: (lasts[r.rank][0], r.rank))
    seq, op, _ = lasts[first.rank]
    _, top_op, done = lasts[ahead[0].rank]
    at = f", at {first.where}" if first.frames else ""
    text = f"rank {first.rank} on {first.node} is behind: its last collective is {op} #{seq}{at}{_busy(first)}"
    also = [r.rank for r in behind if r is not first]
    if also:
        text += f" (rank {also[0]} is behind too)" if len(also) == 1 else f" (ranks {ranges(also)} are behind too)"
    who = f"rank {ahead[0].rank} is" if len(ahead) == 1 else f"ranks {ranges([r.rank for r in ahead])} are"
    text += f"; {who} {'past' if done else 'in'} {top_op} #{top}"
    return Verdict(first.rank, first.node, text, "behind", ranks=tuple(r.rank for r in behind))


def verdict(ranks: Sequence[Rank]) -> Verdict:
    """The rank that stands out (see the module's docstring)."""
    seen = sorted((r for r in ranks if r.gone is None), key=lambda r: r.rank)
    stopped = [r for r in seen if r.stopped]
    if stopped:
        first = stopped[0]
        pids = ", ".join(map(str, first.stopped))
        text = (
            f"rank {first.rank} on {first.node} is stopped (pid {pids}: SIGSTOP or a debugger){_others(seen, stopped)}"
        )
        return Verdict(first.rank, first.node, text, "stopped", ranks=tuple(r.rank for r in stopped))
    logged = [r for r in seen if r.xids]
    if logged:  # a hardware Xid first, then the earliest
        first = min(logged, key=lambda r: (not any(x.hardware for x in r.xids), r.xids[0].time, r.rank))
        hardware = any(x.hardware for x in first.xids)
        last = max(first.xids, key=lambda x: (x.hardware, x.time))
        more = f" ({len(first.xids) - 1} more)" if len(first.xids) > 1 else ""
        at = f"; it is at {first.where}" if first.frames else ""
        text = f"rank {first.rank} on {first.node}: {last}{more}{at}{_others(seen, logged)}"
        return Verdict(first.rank, first.node, text, "xid", hardware, tuple(r.rank for r in logged))
    blocked = [r for r in seen if r.blocked]
    if blocked:
        first = blocked[0]
        pid, wchan = first.blocked[0]
        hardware = bool(wchan and HARDWARE_WCHAN.match(wchan))
        driver = " (a driver's wait: the node's hardware?)" if hardware else ""
        text = (f"rank {first.rank} on {first.node} is in uninterruptible sleep in {wchan or 'the kernel'} "
                f"(pid {pid}){driver}{_others(seen, blocked)}")  # fmt: skip
        return Verdict(first.rank, first.node, text, "uninterruptible", hardware, tuple(r.rank for r in blocked))
    known = [r for r in seen if r.moving is not None]
    moving = [r for r in known if r.moving]
    if known and len(moving) * 2 > len(known):
        text = f"the ranks are moving: {len(moving)} of {len(known)} stacks changed between two looks; none is stuck"
        return Verdict(None, None, text, "moving")
    behind = _behind(seen)
    if behind is not None:
        return behind
    inside = [r for r in seen if r.collective]
    outside = [r for r in seen if r.frames and not r.collective]
    if inside and outside and len(outside) <= len(inside):
        first = max(outside, key=lambda r: (r.cpu or 0.0, -r.rank))
        text = f"rank {first.rank} on {first.node} is not in a collective: {first.where}{_busy(first)}"
        also = [r.rank for r in outside if r is not first]
        if also:
            text += f" (nor is rank {also[0]})" if len(also) == 1 else f" (nor are ranks {ranges(also)})"
        return Verdict(first.rank, first.node, text + _others(seen, outside), "outside-collective",
                       ranks=tuple(r.rank for r in outside))  # fmt: skip
    sampled = [r for r in seen if r.cpu is not None]
    busy = [r for r in sampled if r.cpu is not None and r.cpu >= BUSY]
    if busy and len(busy) < len(sampled) and all(r.cpu is not None and r.cpu <= IDLE for r in sampled if r not in busy):
        first = max(busy, key=lambda r: (r.cpu or 0.0, -r.rank))
        at = f" at {first.where}" if first.frames else ""
        text = f"rank {first.rank} on {first.node} is busy ({first.cpu:.0%} of a core){at}"
        return Verdict(first.rank, first.node, text + _others(seen, busy), "busy", ranks=tuple(r.rank for r in busy))
    if not seen:
        return Verdict(None, None, "no rank could be looked at", "none")
    together = _others(seen, []).removeprefix("; ")
    return Verdict(None, None, f"no rank stands out: {together}", "none")
