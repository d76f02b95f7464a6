"""The SSH layer: one narrow seam (`Transport.run`) in front of every remote command.

`SSHPool` keeps one persistent asyncssh connection per node, with keepalives, reconnects with exponential
backoff, bounds the number of concurrent connection attempts (`ssh.max_parallel`), and puts a timeout on
every connect and every command, so a sweep over a thousand nodes is never held up by one that hangs.

Host keys are verified against `known_hosts`. An unknown host or a changed key raises `HostKeyError` and
nothing runs there; with `host_key_policy: accept-new` a first-seen key is recorded (as OpenSSH's
StrictHostKeyChecking=accept-new does) but a changed key is still refused. The hops of a `ProxyJump` (from the
ssh config) are opened here too, and checked the same way against the same file: asyncssh is never left to
open them with its own defaults.

Remote commands are argv lists, joined with `shlex.join`: no value is ever glued into a shell string.
asyncssh's exceptions are translated here into ours (`scheduler.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import random
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import asyncssh

from ftconsole.scheduler.errors import AuthError, CommandTimeout, FtError, HostKeyError, SSHError, UnreachableError
from ftconsole.scheduler.spec.config import LoadedConfig, Node, SSHSettings
from ftconsole.scheduler.ssh.ciphers import ciphers
from ftconsole.scheduler.ssh.hostkeys import HostKeyClient, KnownHosts, Verdict

log = logging.getLogger("ftconsole.ssh")

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
KEEPALIVE_COUNT_MAX = 3
REFUSED = "down or rebooting"  # a knock that finds the SSH port refusing: no sshd (dead, or booting)
MAX_JUMP_DEPTH = 8  # ProxyJump hops nested through the ssh config (a loop there must end)


@dataclass(frozen=True)
class CommandResult:
    node: str
    argv: tuple[str, ...]
    exit_status: int | None
    signal: str | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def describe_failure(self) -> str:
        how = f"killed by {self.signal}" if self.signal else f"exit status {self.exit_status}"
        tail = self.stderr.strip().splitlines()[-3:]
        return f"{how}" + (f": {' / '.join(tail)}" if tail else "")


class Transport(Protocol):
    """Run one command on one node. The only way the scheduler touches a node."""

    async def run(
        self, node: Node, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None
    ) -> CommandResult: ...

    async def close(self) -> None: ...


def remote_command(argv: Sequence[str]) -> str:
    """The command line sent to the node's shell: every argument quoted."""
    if not argv:
        raise ValueError("empty argv")
    return shlex.join(str(a) for a in argv)


# -- the pool ------------------------------------------------------------------------------------------------


@dataclass
class _NodeConn:
    conn: asyncssh.SSHClientConnection | None = None
    lock: asyncio.Lock | None = None
    failures: int = 0
    retry_at: float = 0.0
    last_error: SSHError | None = None


def ssh_files(loaded: LoadedConfig) -> tuple[Path, Path | None, Path | None]:
    """known_hosts, identity file and ssh config of the config, resolved against the config file's folder (an
    ssh config that does not exist is none). The pool and `ftconsole shell` reach nodes with the same ones."""
    s = loaded.cluster.ssh
    known = loaded.resolve(s.known_hosts)
    assert known is not None
    config_file = loaded.resolve(s.config_file)
    if config_file is not None and not _there(config_file):
        config_file = None
    return known, loaded.resolve(s.identity_file), config_file


def _there(path: Path) -> bool:
    """Whether a file is there; True where that cannot be told (in a folder the caller may not enter, as a user's
    `ftconsole shell` meets root's: there, not theirs to read), where `Path.exists` says False from Python 3.14."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


class SSHPool:
    """The real Transport: asyncssh, one persistent connection per node."""

    def __init__(
        self,
        settings: SSHSettings,
        *,
        known_hosts: Path,
        identity_file: Path | None = None,
        config_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.known = KnownHosts(known_hosts, settings.host_key_policy)
        self.identity_file = identity_file
        self.config_file = config_file
        self._ciphers = ciphers(config_file)
        self._clock = clock
        self._conns: dict[str, _NodeConn] = {}
        self._connect_slots = asyncio.Semaphore(settings.max_parallel)
        self._closed = False

    @classmethod
    def from_config(cls, loaded: LoadedConfig) -> SSHPool:
        known, identity, config_file = ssh_files(loaded)
        return cls(loaded.cluster.ssh, known_hosts=known, identity_file=identity, config_file=config_file)

    async def run(
        self, node: Node, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        command = remote_command(argv)
        limit = timeout if timeout is not None else self.settings.command_timeout
        conn = await self._connection(node)
        started = time.monotonic()
        try:
            result = await conn.run(command, input=input, check=False, timeout=limit)
        except asyncssh.TimeoutError as exc:
            raise CommandTimeout(node.name, f"command timed out after {limit:g}s: {argv[0]}") from exc
        except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as exc:
            self._drop(node.name)
            raise UnreachableError(node.name, f"connection lost: {_reason(exc)}") from exc
        return CommandResult(
            node=node.name,
            argv=tuple(argv),
            exit_status=result.exit_status,
            signal=result.exit_signal[0] if result.exit_signal else None,
            stdout=_text(result.stdout),
            stderr=_text(result.stderr),
            duration_s=time.monotonic() - started,
        )

    async def open_session(
        self,
        node: Node,
        argv: Sequence[str],
        factory: Callable[[], asyncssh.SSHClientSession[bytes]],
        *,
        timeout: float | None = None,
    ) -> asyncssh.SSHClientChannel[bytes]:
        """A process on the node that stays, its output handed to the session `factory` makes as it comes (the
        node channel's: no stream reader to wake per line); write its stdin with the channel returned."""
        command = remote_command(argv)
        limit = timeout if timeout is not None else self.settings.command_timeout
        conn = await self._connection(node)
        try:
            chan, _ = await asyncio.wait_for(conn.create_session(factory, command, encoding=None), timeout=limit)
        except TimeoutError as exc:
            raise CommandTimeout(node.name, f"starting {argv[0]} timed out after {limit:g}s") from exc
        except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as exc:
            self._drop(node.name)
            raise UnreachableError(node.name, f"connection lost: {_reason(exc)}") from exc
        return chan

    async def close(self) -> None:
        self._closed = True
        conns = [c.conn for c in self._conns.values() if c.conn is not None]
        self._conns.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), timeout=2)

    async def __aenter__(self) -> SSHPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def forget(self, node_name: str) -> None:
        """Drop the connection and the backoff state of a node (after an operator fixed it)."""
        self._drop(node_name)
        self._conns.pop(node_name, None)

    # -- connecting ---------------------------------------------------------------------------------------

    def _state(self, name: str) -> _NodeConn:
        state = self._conns.get(name)
        if state is None:
            state = self._conns[name] = _NodeConn(lock=asyncio.Lock())
        return state

    def _drop(self, name: str) -> None:
        state = self._conns.get(name)
        if state is not None and state.conn is not None:
            state.conn.close()
            state.conn = None

    async def _connection(self, node: Node) -> asyncssh.SSHClientConnection:
        if self._closed:
            raise UnreachableError(node.name, "SSH pool is closed")
        state = self._state(node.name)
        assert state.lock is not None
        async with state.lock:
            if state.conn is not None and not state.conn.is_closed():
                return state.conn
            now = self._clock()
            if state.last_error is not None and now < state.retry_at:
                raise _again(state.last_error, state.retry_at - now)
            try:
                async with self._connect_slots:
                    state.conn = await self._connect(node)
            except SSHError as exc:
                state.failures += 1
                delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (state.failures - 1))
                state.retry_at = self._clock() + delay * random.uniform(0.8, 1.0)
                state.last_error = exc
                raise
            state.failures, state.retry_at, state.last_error = 0, 0.0, None
            return state.conn

    def _base_options(self) -> dict[str, object]:
        """What every connection of ours sets, the node's and each ProxyJump hop's alike."""
        s = self.settings
        return {
            "connect_timeout": s.connect_timeout,
            "login_timeout": s.connect_timeout,
            "keepalive_interval": s.keepalive_interval,
            "keepalive_count_max": KEEPALIVE_COUNT_MAX,
            "config": [str(self.config_file)] if self.config_file else [],
            **({"encryption_algs": list(self._ciphers)} if self._ciphers else {}),
        }

    async def knock(self, node: Node, timeout: float) -> str | None:
        """Tell a hung node from a dead one with a fresh TCP connection to its SSH port, as the events say it:
        the kernel answers and sshd greets (alive, its commands stalled), the kernel answers and nothing greets
        (hung), refused (up, no sshd: rebooting?), or no TCP answer at all (down, or cut off). None through a
        ProxyJump (only the jump host could say) or when the ssh config cannot be read."""
        try:
            if await self._proxy_jump(node, node.host, node.port, node.user):
                return None
            options = await asyncssh.SSHClientConnectionOptions.construct(
                host=node.host, port=node.port if node.port is not None else (),
                config=[str(self.config_file)] if self.config_file else [], known_hosts=None, client_keys=None,
            )  # fmt: skip
        except (SSHError, OSError, ValueError):
            return None
        host, port = str(options.host or node.host), int(options.port or 22)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except TimeoutError:
            return f"down or cut off: no TCP answer from {host}:{port} within {timeout:g}s"
        except ConnectionRefusedError:
            return f"{REFUSED}: {host}:{port} refuses connections (no sshd)"
        except OSError as exc:
            return f"down or cut off: {_reason(exc)}"
        try:
            left = max(0.1, deadline - asyncio.get_running_loop().time())
            greeting = await asyncio.wait_for(reader.readline(), left)
        except (TimeoutError, OSError):
            greeting = b""
        finally:
            writer.close()
        if greeting.startswith(b"SSH-"):
            return "stalled: sshd answers, the commands do not (overloaded, or its processes frozen)"
        return f"hung: {host}:{port} takes TCP connections, SSH does not answer"

    async def ping(self, node: Node, timeout: float) -> bool | None:
        """Whether the node's sshd answers on the connection already open, within `timeout`: a keepalive request,
        the one OpenSSH's ServerAliveInterval sends, which sshd answers itself (no process started, none of a job's
        user involved). None: no connection is open to ask on."""
        state = self._conns.get(node.name)
        conn = state.conn if state is not None else None
        request = getattr(conn, "_make_global_request", None)  # asyncssh's own keepalive call; not public
        if conn is None or conn.is_closed() or request is None:
            return None
        try:
            await asyncio.wait_for(request(b"keepalive@openssh.com"), timeout)
        except TimeoutError:
            return False
        except (asyncssh.Error, OSError):
            return None
        return True

    def _connect_options(self, node: Node) -> dict[str, object]:
        options = self._base_options()
        if node.port is not None:
            options["port"] = node.port
        if node.user:
            options["username"] = node.user
        if self.identity_file is not None:
            options["client_keys"] = [str(self.identity_file)]
        return options

    async def _proxy_jump(self, node: Node, host: str, port: int | None, user: str | None) -> str | None:
        """The ssh config's ProxyJump for this host (None without one, or with `ProxyJump none`)."""
        if self.config_file is None:
            return None
        try:
            options = await asyncssh.SSHClientConnectionOptions.construct(
                host=host,
                port=port if port is not None else (),
                username=user or (),
                config=[str(self.config_file)],
                known_hosts=None,  # only the config is read here: no keys, no known hosts
                client_keys=None,
            )
        except (OSError, ValueError) as exc:  # an unreadable or broken ssh config
            raise SSHError(node.name, f"cannot connect: ssh config {self.config_file}: {exc}") from exc
        tunnel = options.tunnel
        return tunnel if isinstance(tunnel, str) and tunnel.strip() else None

    async def _connect(self, node: Node) -> asyncssh.SSHClientConnection:
        """Connect to the node; through its ProxyJump hops, if the ssh config names any.

        asyncssh would open the hops itself, with its own defaults (`~/.ssh/known_hosts` or the config's
        `UserKnownHostsFile`, no host key policy of ours), so we open them here, each checked against
        `ssh.known_hosts` with `ssh.host_key_policy` like the node, and hand the last one to asyncssh as the
        tunnel. Closing the node's connection closes its hops."""
        hops: list[asyncssh.SSHClientConnection] = []
        try:
            spec = await self._proxy_jump(node, node.host, node.port, node.user)
            tunnel = await self._open_hops(node, spec, hops) if spec else None
            conn = await self._dial(node, node.host, self._connect_options(node), tunnel, jump=None)
        except BaseException:
            for hop in reversed(hops):
                hop.close()
            raise
        if tunnel is not None:
            conn.set_tunnel(tunnel)
        return conn

    async def _open_hops(
        self, node: Node, spec: str, opened: list[asyncssh.SSHClientConnection], depth: int = 0
    ) -> asyncssh.SSHClientConnection:
        """Open a ProxyJump chain (`[user@]host[:port],...`) as OpenSSH does: the first hop through its own
        ProxyJump, if any; each next hop through the previous one. Returns the last hop."""
        if depth >= MAX_JUMP_DEPTH:
            raise SSHError(
                node.name, f"ProxyJump of {node.host} nests more than {MAX_JUMP_DEPTH} deep (a loop in the ssh config?)"
            )
        conn: asyncssh.SSHClientConnection | None = None
        for hop in spec.split(","):
            user, host, port = _parse_hop(hop)
            if not host:
                raise SSHError(node.name, f"cannot connect: bad ProxyJump {spec!r}")
            tunnel = conn
            if tunnel is None:
                own = await self._proxy_jump(node, host, port, user)
                if own:
                    tunnel = await self._open_hops(node, own, opened, depth + 1)
            options = self._base_options()
            if port is not None:
                options["port"] = port
            if user:
                options["username"] = user
            # The hop authenticates as the ssh config says for it (IdentityFile, agent), as OpenSSH does.
            conn = await self._dial(node, host, options, tunnel, jump=hop.strip())
            opened.append(conn)
            if tunnel is not None:
                conn.set_tunnel(tunnel)
        assert conn is not None
        return conn

    async def _dial(
        self,
        node: Node,
        host: str,
        options: dict[str, object],
        tunnel: asyncssh.SSHClientConnection | None,
        *,
        jump: str | None,
    ) -> asyncssh.SSHClientConnection:
        """One SSH connection (to the node, or to a hop of its ProxyJump when `jump` names it), its host key
        checked by `HostKeyClient` against our known_hosts. `tunnel=None` stops asyncssh from opening a ProxyJump
        of its own."""
        verdict = Verdict()
        try:
            conn, _ = await asyncio.wait_for(
                asyncssh.create_connection(
                    lambda: HostKeyClient(self.known, verdict),
                    host,
                    known_hosts=self.known.current(),
                    tunnel=tunnel,
                    **options,  # type: ignore[arg-type]
                ),
                timeout=self.settings.connect_timeout + 1,
            )
            return conn
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self._host_key_error(node, jump, verdict, exc) from exc
        except asyncssh.PermissionDenied as exc:
            raise AuthError(node.name, f"{_via(jump)}authentication refused: {_reason(exc)}") from exc
        except (TimeoutError, asyncssh.misc.ConnectionLost) as exc:
            waited = f"{_via(jump)}connect timed out after {self.settings.connect_timeout:g}s"
            if verdict.tcp and isinstance(exc, TimeoutError):  # the kernel took it, nothing spoke SSH: frozen
                raise UnreachableError(node.name, f"{waited}: TCP connects, SSH does not answer", hung=True) from exc
            raise UnreachableError(node.name, waited) from exc
        except asyncssh.DisconnectError as exc:
            raise UnreachableError(node.name, f"{_via(jump)}disconnected: {_reason(exc)}") from exc
        except (OSError, asyncssh.Error) as exc:
            raise UnreachableError(node.name, f"{_via(jump)}{_reason(exc)}") from exc
        except ValueError as exc:  # asyncssh raises ValueError for bad options (e.g. an unreadable key file)
            raise SSHError(node.name, f"cannot connect: {_via(jump)}{exc}") from exc

    def _host_key_error(
        self, node: Node, jump: str | None, verdict: Verdict, exc: asyncssh.HostKeyNotVerifiable
    ) -> HostKeyError:
        path = self.known.path
        if jump is None:
            if verdict.changed:
                return HostKeyError(
                    node.name,
                    f"host key changed: the key of {node.host} does not match {path}; "
                    "nothing was run there (if the node was reinstalled, remove its old key)",
                    changed=True,
                )
            if verdict.unknown:
                return HostKeyError(
                    node.name,
                    f"unknown host key: {node.host} is not in {path}; nothing was run there "
                    "(add its key, or set ssh.host_key_policy: accept-new)",
                    changed=False,
                )
            return HostKeyError(node.name, f"host key of {node.host} not verified: {_reason(exc)}", changed=False)
        hop = f"jump host {jump} (ProxyJump to {node.host})"
        if verdict.changed:
            return HostKeyError(
                node.name,
                f"host key changed: the key of {hop} does not match {path}; nothing was run on {node.host} "
                "(if the jump host was reinstalled, remove its old key)",
                changed=True,
            )
        if verdict.unknown:
            return HostKeyError(
                node.name,
                f"unknown host key: {hop} is not in {path}; nothing was run on {node.host} "
                "(add its key, or set ssh.host_key_policy: accept-new)",
                changed=False,
            )
        return HostKeyError(node.name, f"host key of {hop} not verified: {_reason(exc)}", changed=False)


def _via(jump: str | None) -> str:
    return f"jump host {jump}: " if jump else ""


def _parse_hop(hop: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` of a ProxyJump list (`[v6addr]:port` too) as (user, host, port)."""
    hop = hop.strip()
    user: str | None = None
    if "@" in hop:
        user, hop = hop.rsplit("@", 1)
    port: int | None = None
    if hop.startswith("[") and "]" in hop:
        host, _, rest = hop[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return user or None, host, port
    if hop.count(":") == 1:
        host, _, port_s = hop.partition(":")
        if port_s.isdigit():
            return user or None, host, int(port_s)
    return user or None, hop, port


def _again(err: SSHError, wait_s: float) -> SSHError:
    """The error of the last attempt, raised again while the node is in backoff."""
    if isinstance(err, HostKeyError):
        return HostKeyError(err.node, err.reason, changed=err.changed)
    return type(err)(err.node, f"{err.reason} (next retry in {wait_s:.0f}s)")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, asyncssh.Error):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


# -- fan-out -------------------------------------------------------------------------------------------------


T = TypeVar("T")


async def run_on_all(
    nodes: Iterable[Node], action: Callable[[Node], Awaitable[T]], *, limit: int = 256
) -> dict[str, T | FtError]:
    """Run `action` on every node concurrently (at most `limit` at once); collect results or our errors.

    A node that hangs costs its own timeout, not the others'; an unexpected error on one node (a bug, a reply
    nobody foresaw) is that node's result, as an `FtError` naming it, never the whole fan-out's."""
    slots = asyncio.Semaphore(limit)

    async def one(node: Node) -> tuple[str, T | FtError]:
        async with slots:
            try:
                return node.name, await action(node)
            except FtError as exc:
                return node.name, exc
            except Exception as exc:
                log.exception("%s: unexpected error", node.name)
                return node.name, FtError(f"{node.name}: unexpected {type(exc).__name__}: {exc}")

    pairs = await asyncio.gather(*(one(n) for n in nodes))
    return dict(pairs)


def local_user() -> str:
    """Who runs this process: $USER, else the password database, else the numeric uid."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
