"""Who is asking: the user on the other end of the API's socket, as the kernel reports it (SO_PEERCRED).

Its own module, with nothing else in it, so that the API's clients (every CLI command) name a caller without
importing the scheduler's rules and the job spec's models.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    """Who is on the other end of a connection, as the kernel reports it."""

    uid: int
    gid: int
    pid: int
    user: str  # the passwd name, or str(uid) when the uid has none
