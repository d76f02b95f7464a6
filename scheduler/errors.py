"""The one exception root of ftconsole, and its domain subclasses.

Each error carries a short user-facing ``title``; the CLI prints ``title: message`` to stderr and exits with
``exit_code``. Errors from asyncssh, aiosqlite and NVML are translated into these at the boundary
(``raise Ours(...) from exc``), so callers never see a library's exception types.

The exit codes are a contract with scripts (README.md, "Exit codes"): 1 a failure (FtError), 2 bad input
(UsageError: a usage error, an invalid config or job spec, an object that does not exist), 3 no scheduler to
talk to (NotRunning). A new error class takes one of these; a new code is added here and in the docs, never
reused for another meaning.
"""

from __future__ import annotations

from dataclasses import dataclass


class FtError(Exception):
    """Root of every error ftconsole raises on purpose."""

    title = "error"
    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(FtError):
    """Bad input on the command line or in a file the user gave us."""

    title = "bad input"
    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One problem found in a file: where it is and what is wrong."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.path}:" if self.path else ""
        return f"{where}:{key} {self.message}"


class ConfigError(UsageError):
    """The cluster config (or another YAML file) is invalid; carries every problem found."""

    title = "invalid config"

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class JobSpecError(ConfigError):
    """A job spec (a job's YAML file) is invalid; carries every problem found. A ConfigError, so that callers
    that catch those still catch it; only its title differs."""

    title = "invalid job spec"


class SSHError(FtError):
    """A node could not be reached or a command on it could not be run. `hung`: the node's kernel took the
    connection (or its sshd the command) and nothing answered: alive but frozen or stalled, not down."""

    title = "ssh"
    hung = False

    def __init__(self, node: str, message: str, *, hung: bool | None = None) -> None:
        self.node = node
        super().__init__(f"{node}: {message}")
        self.reason = message
        if hung is not None:
            self.hung = hung


class UnreachableError(SSHError):
    """Connect refused, timed out, or the connection was lost."""

    title = "unreachable"


class HostKeyError(SSHError):
    """The node's host key is unknown or has changed: nothing is run there."""

    title = "host key"

    def __init__(self, node: str, message: str, *, changed: bool) -> None:
        super().__init__(node, message)
        self.changed = changed


class AuthError(SSHError):
    """The node refused our credentials."""

    title = "authentication"


class CommandTimeout(SSHError):
    """A command on a node ran past its timeout."""

    title = "timeout"
    hung = True


def silence_text(exc: SSHError) -> str:
    """Why a node gave no answer, telling a hung node (alive: TCP or the command was taken, nothing answered)
    from one that is down (refused, no TCP answer, connection lost), as the job's events say it."""
    if exc.hung:
        return f"hung: it takes connections but does not answer ({exc.reason})"
    if isinstance(exc, UnreachableError):
        return f"down or cut off: {exc.reason}"
    return exc.reason


class StoreError(FtError):
    """The state store could not be opened, migrated or written."""

    title = "state store"


class NotLeader(StoreError):
    """A write refused because this scheduler does not lead (a standby, or a leader whose lease another took):
    several schedulers share one PostgreSQL store and only the one holding its lease writes."""

    title = "standby"


class Fenced(Exception):
    """A node command or notification not made because this scheduler's lease may have run out (by its own
    clock). Deliberately no FtError: the loop must not record the action as failed, only leave it undone."""


class NotFound(UsageError):
    """A node, job or other object named by the user does not exist."""

    title = "not found"


class LabError(FtError):
    """The local lab cluster could not be started, stopped or read."""

    title = "lab"


class AlreadyRunning(FtError):
    """Another scheduler already holds this state directory or answers on this API socket."""

    title = "already running"


class NotRunning(FtError):
    """No scheduler answers on the API socket: the CLI has nothing to talk to. Its own exit code, so that a
    script can tell "start the scheduler" from a command that failed."""

    title = "not running"
    exit_code = 3


class PermissionDenied(FtError):
    """The caller may not act on this object (for example, another user's job)."""

    title = "permission denied"
