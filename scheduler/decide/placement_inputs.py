"""What placement reads and what it decides (see placement.py): the cluster's nodes and allocations, the queued
jobs and their candidate specs, and the decisions `Place` and `Wait`. Frozen dataclasses, no logic but their
own checks."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

from ftconsole.scheduler.decide.topology import Fabric


class Priority(IntEnum):
    """Job priority levels; a higher value runs first."""

    NORMAL = 0
    URGENT = 1
    VERY_URGENT = 2

    @property
    def label(self) -> str:
        """The level as users write it: normal, urgent, very-urgent."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, label: str) -> Priority:
        try:
            return cls[label.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown priority {label!r} (normal, urgent, very-urgent)") from None


# ---------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class NodeSlot:
    """A node as placement sees it. `state_ok`: healthy; `degraded`: usable only in `allow_degraded` pools."""

    name: str
    pool: str
    gpu_model: str
    driver_version: str
    gpus_total: int
    state_ok: bool = True
    labels: frozenset[str] = frozenset()
    degraded: bool = False
    images: bool = False  # its container runtime can run a job's image with GPUs (scheduler.spec.containers)


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs of one node held by a running job (one record per node of the job).

    `ends_at` is start + max_runtime, None when the job has no max_runtime. `project` and `priority` let the
    urgent cap count running jobs.
    """

    job_id: str
    node: str
    gpus: tuple[int, ...]
    ends_at: float | None = None
    project: str = ""
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True, slots=True)
class ClusterState:
    """The nodes and what runs on them now."""

    nodes: tuple[NodeSlot, ...]
    allocations: tuple[Allocation, ...] = ()
    fabric: Fabric | None = None  # the switches the nodes hang under (`topology:`); None: placement is blind to it

    def free_gpus(self) -> dict[str, frozenset[int]]:
        """GPU indexes free now, per node (usable or not)."""
        used: dict[str, set[int]] = {}
        for alloc in self.allocations:
            used.setdefault(alloc.node, set()).update(alloc.gpus)
        return {n.name: frozenset(range(n.gpus_total)) - used.get(n.name, set()) for n in self.nodes}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One acceptable shape of a job: GPUs per node and, optionally, a GPU model. `spec_name` is for display."""

    spec_name: str | None
    gpus_per_node: int
    gpu_model: str | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be at least 1, not {self.gpus_per_node}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequest:
    """A queued job as placement sees it."""

    id: str
    priority: Priority = Priority.NORMAL
    submitted_at: float
    requeued: bool = False
    project: str = ""
    nodes: int = 1
    candidates: tuple[Candidate, ...]
    pool: str | None = None
    node_names: frozenset[str] | None = None
    driver_version: str | None = None
    labels: frozenset[str] = frozenset()
    max_runtime: float | None = None
    min_nodes: int | None = None  # elastic: may start on fewer nodes, down to this many
    image: bool = False  # runs in a container image: only on nodes with `images`
    fairshare: float = 1.0  # its fair-share factor (decide/fairshare.py): higher goes first within a level
    # its `topology:` (Slurm's --switches=N@TIME): its nodes under at most this many leaf switches, waited for until
    # `switches_until` (None: for ever); then anywhere
    max_switches: int | None = None
    switches_until: float | None = None
    segment: int | None = None  # its nodes in groups of this many, each inside one block (`topology.segment`)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"job {self.id}: nodes must be at least 1, not {self.nodes}")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ValueError(f"job {self.id}: min_nodes must be from 1 to nodes ({self.nodes}), not {self.min_nodes}")
        if not self.candidates:
            raise ValueError(f"job {self.id}: at least one candidate spec is needed")
        if self.max_runtime is not None and self.max_runtime < 0:
            raise ValueError(f"job {self.id}: max_runtime must not be negative")


# --------------------------------------------------------------------------------------------- decisions


class WaitCause(StrEnum):
    CAPACITY = "capacity"  # not enough free GPUs matching the job now
    BLOCKED = "blocked"  # would fit, but would delay the head of the queue
    URGENT_CAP = "urgent-cap"  # the project's urgent cap is reached
    TOO_FEW_NODES = "too-few-nodes"  # not enough usable nodes match, even with all of them free
    DEPENDENCY = "dependency"  # waits for another job to end (its `after:`)
    QUOTA = "quota"  # its project or user is at a quota (decide/quotas.py)
    RESERVATION = "reservation"  # the reservation it names has not begun (decide/reservations.py)
    BEGIN = "begin"  # its `begin:` time has not come (spec/begin.py)


NodeGpus = tuple[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Place:
    """Start the job now with its candidate `candidate_index`, on these nodes and GPU indexes (rank order)."""

    job_id: str
    candidate_index: int
    nodes: tuple[NodeGpus, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """The job stays queued.

    `position` is 1-based among the jobs that wait after this pass. `earliest_start` is known for the head
    only. `ahead` (the ids of the waiting jobs before this one) is filled by `predict`, not by `plan`.
    """

    job_id: str
    reason: str
    position: int
    earliest_start: float | None = None
    cause: WaitCause = WaitCause.CAPACITY
    ahead: tuple[str, ...] = ()


Decision = Place | Wait
