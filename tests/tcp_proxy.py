"""A TCP relay on 127.0.0.1 that a test can cut: the network between a client and its server, made real.

`TcpRelay(port)` listens on a free loopback port and relays every connection to 127.0.0.1:`port`. `cut()`
stops relaying both ways while the connections stay open, as a partition does (the peers' writes go
unanswered; nothing is closed, so no side learns of it but by waiting). `mend()` relays again. The relay stops,
closing every connection, on leaving its `async with`.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType


class TcpRelay:
    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.wait_for(self._server.wait_closed(), 10)

    def cut(self) -> None:
        self._flowing.clear()

    def mend(self) -> None:
        self._flowing.set()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                await self._flowing.wait()  # cut: what was read is held, as a dead link holds it
                sink.write(data)
                await sink.drain()
        sink.close()
