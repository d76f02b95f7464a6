"""The one client interface of the CLI and the console: `call(op, **args)` and `stream(op, **args)`.

`connect` reaches the scheduler's API socket when one answers (`ftconsole serve`, or a console running it
embedded). `local_client` runs the same operations in this process on the store, with no scheduler loop
(`embedded` is then True, and nothing places or watches jobs until a scheduler starts: a submitted job waits
queued). `open_client` is the first, else the second. `scheduler_here` runs a whole scheduler in this process
for as long as its block lasts: a one-off local run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from ftconsole.scheduler.caller import Caller
from ftconsole.scheduler.errors import FtError, NotRunning, UsageError
from ftconsole.scheduler.serve.api import ApiClient
from ftconsole.scheduler.spec.config import LoadedConfig

# The scheduler itself (its loop, SSH, the store) is imported only where it runs in this process (`local_client`,
# `scheduler_here`): a command that talks to a running scheduler's socket starts without it (a third of a second)
if TYPE_CHECKING:
    from ftconsole.scheduler.jobops import Scheduler
    from ftconsole.scheduler.serve.daemon import Operations


class Client(Protocol):
    embedded: bool

    async def call(self, op: str, **args: Any) -> Any: ...

    def stream(self, op: str, **args: Any) -> AsyncIterator[Any]: ...


def this_process() -> Caller:
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Caller(uid=uid, gid=os.getgid(), pid=os.getpid(), user=user)


class SocketClient:
    embedded = False

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def call(self, op: str, **args: Any) -> Any:
        return await self._api.call(op, **args)

    def stream(self, op: str, **args: Any) -> AsyncIterator[Any]:
        return self._api.stream(op, **args)

    async def close(self) -> None:
        await self._api.close()


class LocalClient:
    """The operations run in this process, as this process's user (no scheduler loop)."""

    embedded = True

    def __init__(self, operations: Operations, caller: Caller) -> None:
        self._ops = operations
        self._caller = caller

    async def call(self, op: str, **args: Any) -> Any:
        result = await self._ops(self._caller, op, args)
        if isinstance(result, AsyncIterator):
            raise UsageError(f"{op} is a stream: use stream()")
        return result

    async def stream(self, op: str, **args: Any) -> AsyncIterator[Any]:
        result = await self._ops(self._caller, op, args)
        async for item in result:
            yield item


async def connect(loaded: LoadedConfig, *, timeout: float = 5.0) -> SocketClient | None:
    """A client of the scheduler serving `loaded`'s state_dir, or None when none answers on its socket."""
    try:
        # the scheduler's user is the owner of state_dir: a socket owned by anyone else (but root) is refused
        api = await ApiClient.connect(loaded.socket_path, timeout=timeout, scheduler_dir=loaded.state_dir)
    except NotRunning:
        return None
    return SocketClient(api)


@contextlib.asynccontextmanager
async def local_client(loaded: LoadedConfig) -> AsyncIterator[LocalClient]:
    """The operations in this process on the store, without a scheduler: what they change waits for one."""
    from ftconsole.scheduler.jobops import Scheduler
    from ftconsole.scheduler.nodeops import ClusterService
    from ftconsole.scheduler.serve.daemon import Operations

    async with ClusterService.open(loaded) as service:
        yield LocalClient(Operations(Scheduler(service)), this_process())


@contextlib.asynccontextmanager
async def open_client(loaded: LoadedConfig, *, timeout: float = 5.0) -> AsyncIterator[Client]:
    """The running scheduler's client, else the operations in this process (`local_client`)."""
    client = await connect(loaded, timeout=timeout)
    if client is None:
        async with local_client(loaded) as local:
            yield local
        return
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def scheduler_here(loaded: LoadedConfig) -> AsyncIterator[LocalClient]:
    """A scheduler in this process (its loop, probes and API socket, as `ftconsole serve` runs them) for as long
    as the block lasts, and a client of it. AlreadyRunning when another scheduler holds the state_dir."""
    from ftconsole.scheduler.serve.daemon import serve

    stop = asyncio.Event()
    started: asyncio.Future[Scheduler] = asyncio.get_running_loop().create_future()
    answering: list[Operations] = []  # the API's own: on a standby they name the leader when they refuse a change
    task = asyncio.create_task(serve(loaded, stop, ready=started.set_result, answering=answering.append))
    first: list[asyncio.Future[Any]] = [started, task]
    await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():  # it stopped before it served: say why
        await task
        raise FtError(f"the scheduler for {loaded.state_dir} stopped before it started")
    try:
        yield LocalClient(answering[0], this_process())
    finally:
        stop.set()
        await task  # a scheduler that failed meanwhile says why here
