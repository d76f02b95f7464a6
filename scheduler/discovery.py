"""Finding the fabric (`ftconsole topology --discover`, API op `topology_discover`): each node is asked, over SSH as
the SSH account, what its tools say: `lldpctl -f json` (its Ethernet neighbours, for RoCE: on the interfaces that
carry RDMA, /sys/class/infiniband/*/device/net, where there are some), `nvidia-smi -q` (its
NVLink domain), and `ibnetdiscover` (the InfiniBand fabric, read from the first node that has it). Each tool runs
only where installed, under a time bound. What they say is read (`decide.fabricfind`) and compared with the config's
`topology:`; each mismatch is a `TopologyMismatch` event of its node. Nothing is changed: the config stays the truth
until an operator edits it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ftconsole.scheduler.decide.fabricfind import (
    compare,
    found_fabric,
    read_ibnetdiscover,
    read_lldp,
    read_nvlink_domain,
)
from ftconsole.scheduler.errors import FtError
from ftconsole.scheduler.ssh.transport import run_on_all

log = logging.getLogger("ftconsole.scheduler")

MARK = "== ftconsole: "  # starts the line before each tool's output
# POSIX sh, no value from anyone: each tool where installed, bounded by `timeout` (coreutils) where that exists
SCRIPT = """\
bound() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
echo "== ftconsole: rdma-netdevs"
for netdev in /sys/class/infiniband/*/device/net/*; do [ -e "$netdev" ] && echo "${netdev##*/}"; done
for tool in lldpctl nvidia-smi ibnetdiscover; do
  echo "== ftconsole: $tool"
  command -v "$tool" >/dev/null 2>&1 || continue
  case $tool in
    lldpctl) bound 10 lldpctl -f json 2>/dev/null ;;
    nvidia-smi) bound 30 nvidia-smi -q 2>/dev/null ;;
    ibnetdiscover) bound 60 ibnetdiscover 2>/dev/null ;;
  esac
done
exit 0
"""
TIMEOUT_S = 120.0


def sections(text: str) -> dict[str, str]:
    """tool -> what it printed (a tool not installed: absent)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(MARK):
            current = out.setdefault(line[len(MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {tool: "\n".join(lines) for tool, lines in out.items() if any(x.strip() for x in lines)}


async def discover(service: Any, clock: Callable[[], float]) -> dict[str, Any]:
    """Ask every node, read what they say, compare it with the config; the mismatches as events."""
    nodes = list(service.all_nodes)
    results = await run_on_all(nodes, lambda node: service.transport.run(node, ["sh", "-c", SCRIPT], timeout=TIMEOUT_S))
    said: dict[str, dict[str, str]] = {}
    errors: dict[str, str] = {}
    for node in nodes:
        result = results[node.name]
        if isinstance(result, FtError):
            errors[node.name] = str(result)
        elif not result.ok:
            errors[node.name] = result.describe_failure()
        else:
            said[node.name] = sections(result.stdout)
    ib = None
    lldp: dict[str, dict[str, str]] = {}
    rdma: dict[str, list[str]] = {}  # node -> its network interfaces that carry RDMA (RoCE)
    nvlink: dict[str, str] = {}
    for name, told in said.items():
        try:  # what one node's tools print is that node's: a shape nobody foresaw is its error alone
            if ib is None and "ibnetdiscover" in told:
                ib = read_ibnetdiscover(told["ibnetdiscover"])
            if "lldpctl" in told:
                lldp[name] = read_lldp(told["lldpctl"])
                rdma[name] = told.get("rdma-netdevs", "").split()
            if "nvidia-smi" in told and (domain := read_nvlink_domain(told["nvidia-smi"])):
                nvlink[name] = domain
        except Exception as exc:
            log.warning("topology: cannot read what %s's tools said: %s: %s", name, type(exc).__name__, exc)
            errors[name] = f"cannot read what its tools said: {type(exc).__name__}: {exc}"
    found = found_fabric({n.name: n.host for n in nodes}, ib, lldp, nvlink, rdma)
    tree = service.config.topology
    declared = {} if tree is None else {node: leaf for leaf, names in tree.leaves().items() for node in names}
    blocks = {} if tree is None else {node: block for block, names in tree.block_nodes().items() for node in names}
    mismatches = compare(declared, found, [n.name for n in nodes], blocks)
    if mismatches:
        now = clock()
        async with service.store.jobs_tx("record what the fabric discovery found") as tx:
            for text in mismatches:
                await tx.event(now, "TopologyMismatch", text, node=text.split()[0])
        for text in mismatches:
            log.warning("topology: %s", text)
    return {
        "found": found.to_json(),
        "mismatches": mismatches,
        "errors": errors,
        "tools": {name: sorted(s) for name, s in said.items()},
    }
