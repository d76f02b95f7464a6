"""Host keys of the SSH pool (transport.py): `known_hosts`, loaded once and read again when the file changes; the
client that checks each node's key against it (an unknown host or a changed key refused; with `accept-new` a
first-seen key recorded, as OpenSSH's StrictHostKeyChecking=accept-new does), and what it decided, for the
pool's error messages.
"""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path

import asyncssh


class KnownHosts:
    """known_hosts, loaded once and reloaded when the file changes; appends first-seen keys in accept-new."""

    def __init__(self, path: Path, policy: str) -> None:
        self.path = path
        self.policy = policy
        self._mtime: float | None = None
        self._hosts: asyncssh.SSHKnownHosts = asyncssh.import_known_hosts("")

    def current(self) -> asyncssh.SSHKnownHosts:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._mtime, self._hosts = None, asyncssh.import_known_hosts("")
            return self._hosts
        if mtime != self._mtime:
            self._hosts = asyncssh.read_known_hosts(str(self.path))
            self._mtime = mtime
        return self._hosts

    def has_keys_for(self, host: str, addr: str, port: int | None) -> bool:
        host_keys, ca_keys, *_ = self.current().match(host, addr, None if port == 22 else port)
        return bool(host_keys or ca_keys)

    def record(self, host: str, port: int | None, key: asyncssh.SSHKey) -> None:
        pattern = host if port in (None, 22) else f"[{host}]:{port}"
        alg, b64 = key.export_public_key("openssh").decode().split()[:2]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.write(f"{pattern} {alg} {b64}\n")
        self._mtime = None


@dataclass
class Verdict:
    """What our host key check decided for one connection attempt."""

    changed: bool = False
    unknown: bool = False
    recorded: bool = False
    tcp: bool = False  # the TCP connection was made (the node's kernel answered)


class HostKeyClient(asyncssh.SSHClient):
    def __init__(self, known: KnownHosts, verdict: Verdict) -> None:
        self._known = known
        self._verdict = verdict

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._verdict.tcp = True  # asyncssh calls this once TCP is up, before the SSH handshake

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        # asyncssh calls this only for a key that is not among the trusted keys of this host.
        if self._known.has_keys_for(host, addr, port):
            self._verdict.changed = True
            return False
        if self._known.policy == "accept-new":
            self._known.record(host, port, key)
            self._verdict.recorded = True
            return True
        self._verdict.unknown = True
        return False
