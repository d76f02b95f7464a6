"""The cluster config's node tests (`node_tests`, issue 42): what a node must pass, under load, before the
scheduler returns it to service, and what `ftconsole resume --test` runs. Part of the cluster config (config.py
re-exports it); the node side is scheduler/node/nodetest.py, the scheduler's side nodetests.py.
"""

from __future__ import annotations

from pydantic import Field

from ftconsole.scheduler.spec.specbase import Strict as _Strict
from ftconsole.scheduler.spec.values import PositiveDuration

PASSING = frozenset({"pass", "warn", "skip"})  # a node may take work back after these results

# how long each level of DCGM's diagnostics takes on a node of 8 GPUs, about (NVIDIA's DCGM user guide): the
# default timeout of a level is a few times that
GPU_LEVEL_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 3600.0, 4: 3 * 3600.0}


class GpuTest(_Strict):
    """The GPUs under load: DCGM's diagnostics (`dcgmi diag -r LEVEL`) where DCGM is installed on the node.
    1: quick (seconds), 2: medium (about 2 minutes), 3: long (about 30 minutes), 4: extended (hours)."""

    level: int = Field(1, ge=1, le=4)
    timeout: PositiveDuration | None = None  # None: GPU_LEVEL_TIMEOUT_S of its level

    @property
    def deadline(self) -> float:
        return self.timeout if self.timeout is not None else GPU_LEVEL_TIMEOUT_S[self.level]


class NodeTests(_Strict):
    """What `node_tests` names. With a test named, an isolated node that `probes.isolation_recover_after` would
    resume must pass the tests first (`before_resume`), and `ftconsole resume --test` runs them."""

    gpu: GpuTest | None = None  # None: no GPU test
    # the scheduler's resume of an isolated node (after isolation_recover_after passing probes) waits for a pass
    before_resume: bool = True

    @property
    def any(self) -> bool:
        return self.gpu is not None
