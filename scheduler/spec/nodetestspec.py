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


FABRIC_START_S = 15.0  # the nodes' SSH sessions start this far apart at most: a sender retries meanwhile
FABRIC_STREAM_MARGIN_S = 5.0  # a stream's end and its receiver's confirmation, over its `seconds`
FABRIC_SSH_MARGIN_S = 10.0  # the SSH command's deadline over the node's own


class FabricTest(_Strict):
    """The fabric between nodes: timed TCP streams from each node to its neighbours in a ring (at the address a
    launcher's MASTER_ADDR uses), each measured by its receiver. A node fails when every stream it sends (or, its
    senders being fine, every stream it receives) is below the baseline: `min_gbps` where the operator sets one,
    else `below` times the rate the scheduler learnt from the pool's earlier tests (the median of this test's
    streams on the first)."""

    seconds: PositiveDuration = Field(2.0, le=60.0)  # how long each stream sends
    port: int = Field(29510, ge=1024, le=65535)  # the TCP port each node listens on, for the test's time
    min_gbps: float | None = Field(None, gt=0)  # the baseline, in Gbit/s; None: learnt
    below: float = Field(0.5, gt=0, lt=1)  # a learnt baseline's share under which a stream is slow

    def node_timeout(self, count: int) -> float:
        """How long a node of a set of `count` takes part at most: every SSH session started (FABRIC_START_S
        apart at most), then two streams one after the other (from three nodes, its own two; with two, its
        partner's, then its own)."""
        return FABRIC_START_S + 2 * (self.seconds + FABRIC_STREAM_MARGIN_S)

    @property
    def deadline(self) -> float:
        """How long a node's fabric test (with two partners) takes at most, SSH's own margin included."""
        return self.node_timeout(3) + FABRIC_SSH_MARGIN_S


class NodeTests(_Strict):
    """What `node_tests` names. With a test named, an isolated node that `probes.isolation_recover_after` would
    resume must pass the tests first (`before_resume`), and `ftconsole resume --test` runs them."""

    gpu: GpuTest | None = None  # None: no GPU test
    # the fabric: the settings of the bandwidth check of jobs that ask for it (`preflight: {bandwidth: true}`;
    # absent: the defaults). Named, it is a node test too: the node and up to two idle partners of its pool
    fabric: FabricTest | None = None
    # the scheduler's resume of an isolated node (after isolation_recover_after passing probes) waits for a pass
    before_resume: bool = True

    @property
    def any(self) -> bool:
        return self.gpu is not None or self.fabric is not None
