"""Which SSH ciphers the scheduler's connections ask for (`SSHPool`): ours in our order, unless the ssh config
chooses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import asyncssh

# AES-GCM first: each packet costs asyncssh about half of chacha20-poly1305's CPU (one call into the AEAD, and
# AES in hardware); the node channels' lines made it count (docs/benchmarks.md). Left to the ssh config where
# that sets Ciphers (or includes another file, which might).
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)


def ciphers(config_file: Path | None) -> Sequence[str]:
    """Our order of ciphers (`CIPHERS`), or none where the ssh config may choose (it names Ciphers or Include)."""
    try:
        text = config_file.read_text(errors="replace") if config_file is not None else ""
    except OSError:
        return ()
    for line in text.splitlines():
        words = line.strip().replace("=", " ").split()
        if words and words[0].lower() in ("ciphers", "include"):
            return ()
    known = set(asyncssh.encryption.get_encryption_algs())
    return tuple(c for c in CIPHERS if c.encode() in known)
