"""What launch planning reads and what it gives (see launcher.py): one attempt's input, with each node's
assignment and the batch task it plans, and the plan: what each rank's node gets. Frozen dataclasses, no logic
but their own properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeAssignment:
    """One node of an attempt: its name, the address other ranks reach it at, the GPU indexes it was given."""

    name: str
    host: str
    gpus: tuple[int, ...] = ()

    @property
    def slots(self) -> int:
        """Processes per node: one per GPU, one on a node without GPUs (seed 003)."""
        return len(self.gpus) or 1


@dataclass(frozen=True)
class LaunchInput:
    """One attempt to plan. `hydra_iface` (mpich), `torchrun_max_restarts` and `torchrun_monitor_interval`
    (pytorch, in seconds) are the launcher's own options, from the spec's `launcher:` section."""

    job_id: str
    attempt: int
    mode: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    nodes: tuple[NodeAssignment, ...]
    master_port: int
    run_root: str
    ps_count: int = 0
    hydra_iface: str | None = None
    torchrun_max_restarts: int | None = None
    torchrun_monitor_interval: float | None = None
    output_dir: str | None = None
    task: TaskRef | None = None
    checkpoint_dir: str | None = None  # FT_CHECKPOINT_DIR: the same folder in every attempt of the job
    # horovod, mpich: what each MPI process runs the program through (the MPI hybrid model of a job with an
    # image: scheduler/node/container_exec.py), put between the generated launcher line and the program
    rank_wrapper: tuple[str, ...] = ()
    # pytorch: the ranks' Python processes serve torch's flight recorder trace to `ftconsole debug` (torch_hook.py)
    torch_trace: bool = False


@dataclass(frozen=True)
class TaskRef:
    """The batch task an input plans: FT_TASK, FT_TASK_INDEX, and FT_OUTPUT_DIR's sub-folder ``output``."""

    name: str
    index: int
    output: str


@dataclass(frozen=True)
class RankLaunch:
    """What one node gets: argv/env/files written to ``run_dir``; the process started only when ``launch``."""

    node: str
    rank: int
    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, bytes]
    run_dir: str
    launch: bool
    workdir: str


@dataclass(frozen=True)
class LaunchPlan:
    ranks: tuple[RankLaunch, ...]
    ssh_check: tuple[str, ...] | None = None  # rank 0's pre-launch step: can it reach the others by SSH?

    @property
    def launching(self) -> tuple[RankLaunch, ...]:
        """The ranks where a process is started."""
        return tuple(r for r in self.ranks if r.launch)
