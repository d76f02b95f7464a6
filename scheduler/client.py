"""The one client interface of the CLI and the console: `call(op, **args)` and `stream(op, **args)`.

`open_client` connects to the scheduler's API socket when one answers (`ftconsole serve`, or a console in
embedded mode); otherwise it runs the same operations in-process on the store (`embedded` is then True and
nothing places or watches jobs until a scheduler starts: a submitted job waits queued).
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import AsyncIterator
from typing import Any, Protocol

from ftconsole.scheduler.api import ApiClient, Caller
from ftconsole.scheduler.config import LoadedConfig
from ftconsole.scheduler.daemon import Operations
from ftconsole.scheduler.engine import Scheduler
from ftconsole.scheduler.errors import NotRunning, UsageError
from ftconsole.scheduler.service import ClusterService


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


@contextlib.asynccontextmanager
async def open_client(loaded: LoadedConfig, *, timeout: float = 5.0) -> AsyncIterator[Client]:
    try:
        # the scheduler's user is the owner of state_dir: a socket owned by anyone else (but root) is refused
        api = await ApiClient.connect(loaded.socket_path, timeout=timeout, scheduler_dir=loaded.state_dir)
    except NotRunning:
        async with ClusterService.open(loaded) as service:
            yield LocalClient(Operations(Scheduler(service)), this_process())
        return
    try:
        yield SocketClient(api)
    finally:
        await api.close()
