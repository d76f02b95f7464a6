"""SSH keys of the lab: the client key and the nodes' host keys (ed25519, kept across restarts)."""

from __future__ import annotations

import logging
from pathlib import Path

import asyncssh

from ftconsole.lab.files import _write_atomic

log = logging.getLogger("ftconsole.lab")


def _load_or_create_key(path: Path, *, public: Path | None = None) -> asyncssh.SSHKey:
    """An ed25519 private key kept in `path` (0600); created (or recreated if unreadable) when needed."""
    if path.is_file():
        try:
            return asyncssh.read_private_key(str(path))
        except (OSError, asyncssh.KeyImportError, ValueError) as exc:
            log.warning("%s is unreadable (%s); creating a new key", path, exc)
    key = asyncssh.generate_private_key("ssh-ed25519")
    _write_atomic(path, key.export_private_key(), 0o600)
    if public is not None:
        _write_atomic(public, key.export_public_key())
    return key


def _public_line(key: asyncssh.SSHKey) -> str:
    """'ssh-ed25519 AAAA...' without a comment."""
    return " ".join(key.export_public_key().decode().split()[:2])
