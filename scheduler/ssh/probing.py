"""Running the probe agent on nodes: one SSH round trip per node per sweep.

The agent (`scheduler/node/agent.py` and the `agent_*.py` modules it imports, stdlib-only, joined into one
script by `scheduler/node/bundle.py`) is sent on standard input to `python3 -`, preceded by one line that sets its
parameters; nothing is installed on the node. The parameters travel inside the script as a
Python string literal (`repr` of a JSON document), never through a shell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ftconsole.probes.results import AgentOutputError, ProbeReport, parse_report
from ftconsole.scheduler.errors import AuthError, CommandTimeout, FtError, HostKeyError, SSHError, UnreachableError
from ftconsole.scheduler.node.bundle import python_stdin_script, script
from ftconsole.scheduler.spec.config import ClusterConfig, Node
from ftconsole.scheduler.ssh import nodecache
from ftconsole.scheduler.ssh.transport import Transport, run_on_all

RUNTIMES_MAX_AGE_S = 300.0  # the loop's probes reuse a node's last reading of its container runtimes this long


def agent_source() -> str:
    """agent.py and the node-side modules it imports, as one script (see node/bundle.py)."""
    return script("agent")


def agent_params(
    config: ClusterConfig, node: Node, *, checks: Sequence[str] | None = None, fresh: bool = False
) -> dict[str, Any]:
    """The agent's PARAMS; `fresh`: read the container runtimes now, not the last reading kept on the node
    (an operator's probe), else a reading younger than RUNTIMES_MAX_AGE_S whose inputs did not change."""
    params: dict[str, Any] = {
        "cache_dir": config.probes.cache_dir,
        "dns_names": list(config.probes.dns_names),
        "thresholds": config.thresholds_for(node.pool).model_dump(),
        "timeout": max(1.0, config.probes.timeout / 2),
        "runtimes_max_age": 0 if fresh else RUNTIMES_MAX_AGE_S,
        "node": node.name,  # the kept reading of the runtimes is this node's (nodes may share a home)
    }
    if checks is not None:
        params["checks"] = list(checks)
    return params


def agent_script(params: dict[str, Any]) -> str:
    return python_stdin_script(agent_source(), params)


@dataclass(frozen=True)
class ProbeFailure:
    """Why a node gave no report: its kind is one word scripts can match on."""

    kind: str  # unreachable | host-key-unknown | host-key-changed | auth | timeout | agent | ssh
    message: str


async def probe_node(
    transport: Transport,
    config: ClusterConfig,
    node: Node,
    *,
    checks: Sequence[str] | None = None,
    fresh: bool = False,
) -> ProbeReport:
    """Run the agent on one node; raise SSHError (cannot run) or AgentOutputError (ran, but no report)."""
    params = agent_params(config, node, checks=checks, fresh=fresh)
    result = await nodecache.run(transport, node, [config.ssh.python, "-"], name="agent", source=agent_source(),
                                 params=params, timeout=config.probes.timeout)  # fmt: skip
    if not result.ok and not result.stdout.strip():
        raise AgentOutputError(f"probe agent failed on {node.name}: {result.describe_failure()}")
    try:
        return parse_report(result.stdout)
    except AgentOutputError as exc:
        raise AgentOutputError(f"{node.name}: {exc}") from exc


async def sweep(
    transport: Transport,
    config: ClusterConfig,
    nodes: Iterable[Node],
    *,
    checks: Sequence[str] | None = None,
    limit: int = 512,
    fresh: bool = False,
) -> dict[str, ProbeReport | ProbeFailure]:
    """Probe every node concurrently; a node that hangs costs its own timeout, not the sweep's."""
    results = await run_on_all(
        nodes, lambda node: probe_node(transport, config, node, checks=checks, fresh=fresh), limit=limit
    )
    return {name: failure_of(r) if isinstance(r, FtError) else r for name, r in results.items()}


def failure_of(exc: FtError) -> ProbeFailure:
    if isinstance(exc, HostKeyError):
        return ProbeFailure("host-key-changed" if exc.changed else "host-key-unknown", exc.reason)
    if isinstance(exc, UnreachableError):
        return ProbeFailure("unreachable", exc.reason)
    if isinstance(exc, AuthError):
        return ProbeFailure("auth", exc.reason)
    if isinstance(exc, CommandTimeout):
        return ProbeFailure("timeout", exc.reason)
    if isinstance(exc, SSHError):
        return ProbeFailure("ssh", exc.reason)
    return ProbeFailure("agent", str(exc))
