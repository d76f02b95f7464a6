"""Test nodes in network namespaces of their own, joined by a bridge, so that one node's link can be shaped with
`tc` (a slow fabric) while the others' stay fast. Root only (`ip netns`, `tc`); every namespace, link and
address is made by the test and removed at `close`. Addresses are in a 10.x.y.0/24 that no route of the machine
uses, and traffic stays on the bridge: nothing leaves the machine.

    fabric = Fabric()                          # the bridge, at 10.x.y.254
    ns = fabric.add("node01", 1)               # its namespace, its veth at 10.x.y.11
    subprocess.run(fabric.exec("node01") + ["sshd", ...])
    fabric.shape("node01", mbit=50)            # its way out limited to 50 Mbit/s
    fabric.close()

`SshdCluster(..., netns=True)` runs each node's sshd in one (tests/sshd_cluster.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess

IP_TIMEOUT = 10.0
MISSING = "network namespaces need root and iproute2 (ip, tc)"


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _ip(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _free_subnet() -> str:
    """`10.x.y` of a /24 no route of this machine covers (a bridge left by another run included)."""
    routes = _ip("ip", "-4", "route", "show", "table", "all")
    for _ in range(200):
        prefix = f"10.{random.randint(200, 254)}.{random.randint(0, 255)}"
        if f"{prefix}." not in routes:
            return prefix
    raise RuntimeError("no free 10.200-254.x.0/24 subnet for the test's bridge")


class Fabric:
    """A bridge in this namespace and one namespace per node behind it."""

    def __init__(self) -> None:
        if not available():
            raise RuntimeError(MISSING)
        self.tag = f"{os.getpid() % 10000:04d}{random.randint(0, 255):02x}"
        self.bridge = f"ftb{self.tag}"
        self.prefix = _free_subnet()
        self.spaces: dict[str, str] = {}  # node -> its namespace
        self._veth: dict[str, str] = {}  # node -> its veth's name inside its namespace
        _ip("ip", "link", "add", self.bridge, "type", "bridge")
        try:
            _ip("ip", "addr", "add", f"{self.prefix}.254/24", "dev", self.bridge)
            _ip("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def address(self, number: int) -> str:
        return f"{self.prefix}.{10 + number}"

    def add(self, node: str, number: int) -> str:
        """A namespace for `node`, its veth on the bridge at `address(number)`; its name."""
        space, outside, inside = f"ftc{self.tag}-{number}", f"fh{self.tag}{number}", f"fn{self.tag}{number}"
        _ip("ip", "netns", "add", space)
        self.spaces[node] = space
        _ip("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("ip", "link", "set", inside, "netns", space)
        self._veth[node] = inside
        _ip("ip", "link", "set", outside, "master", self.bridge)
        _ip("ip", "link", "set", outside, "up")
        inns = ["ip", "netns", "exec", space]
        _ip(*inns, "ip", "addr", "add", f"{self.address(number)}/24", "dev", inside)
        _ip(*inns, "ip", "link", "set", inside, "up")
        _ip(*inns, "ip", "link", "set", "lo", "up")
        return space

    def exec(self, node: str) -> list[str]:
        """The argv prefix that runs a command in the node's namespace."""
        return ["ip", "netns", "exec", self.spaces[node]]

    def shape(self, node: str, *, mbit: float) -> None:
        """Limit what the node sends to `mbit` Mbit/s (a token bucket on its veth's way out)."""
        _ip(*self.exec(node), "tc", "qdisc", "replace", "dev", self._veth[node], "root", "tbf", "rate",
            f"{mbit:g}mbit", "burst", "64kb", "latency", "100ms")  # fmt: skip

    def unshape(self, node: str) -> None:
        with contextlib.suppress(RuntimeError):
            _ip(*self.exec(node), "tc", "qdisc", "del", "dev", self._veth[node], "root")

    def close(self) -> None:
        """Remove every namespace (their veths go with them) and the bridge; safe to call again."""
        for space in list(self.spaces.values()):
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                _ip("ip", "netns", "del", space)
        self.spaces.clear()
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            _ip("ip", "link", "del", self.bridge)
