"""What a job spec names by a fixed word (its mode, priority, access, type) and the few constants that both the
spec's model (jobspec.py) and its checks across keys (jobchecks.py) go by."""

from __future__ import annotations

import re
from enum import StrEnum


class JobMode(StrEnum):
    """How the ranks of a job are started (see the launcher)."""

    SINGLE = "single"
    PYTORCH = "pytorch"
    PYTORCH_DEEPSPEED = "pytorch-deepspeed"
    HOROVOD = "horovod"
    MPICH = "mpich"
    TENSORFLOW = "tensorflow"


class Priority(StrEnum):
    """Queue priority; the scheduler allows `very-urgent` to admins only."""

    NORMAL = "normal"
    URGENT = "urgent"
    VERY_URGENT = "very-urgent"


class Access(StrEnum):
    """What other users may do with the job."""

    READ_WRITE = "read-write"
    READ_ONLY = "read-only"
    NONE = "none"


class JobType(StrEnum):
    """A regular job runs `command`; a batch job runs each of its `tasks`."""

    REGULAR = "regular"
    BATCH = "batch"


# -- constants -----------------------------------------------------------------------------------------------

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "SLOTS", "CUDA_VISIBLE_DEVICES"}
    | {"TF_CONFIG", "OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE"}
)
"""Variables the launcher sets for each rank; a job may not set them (nor any FT_ variable)."""

# The most nodes `node_names` may name in a new job (issue 26): a job pins a few nodes, and the set is expanded
# each time the job is planned; a spec read back from the store keeps the config's bound (MAX_NODESET).
MAX_NODE_NAMES = 10_000

RESOURCE_KEYS = ("gpus_per_node", "spec", "specs")  # the keys that ask for GPUs

LAUNCHER_MODES: dict[str, tuple[JobMode, str]] = {
    "torchrun_max_restarts": (JobMode.PYTORCH, "torchrun's --max_restarts"),
    "torchrun_monitor_interval": (JobMode.PYTORCH, "torchrun's --monitor_interval"),
    "hydra_iface": (JobMode.MPICH, "HYDRA_IFACE, the network interface of MPICH's hydra"),
}
"""Each key of `launcher:`: the mode it is for, and what it sets."""

TRACE_MODES = ("pytorch", "pytorch-deepspeed")  # the modes that keep torch's trace (debug.torch_trace)
