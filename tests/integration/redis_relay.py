"""A TCP relay in front of Redis, for tests that take Redis away from a live client: cut it
whole (every connection at once), or mute one connection (the one that carried a command
naming ``mute_on``: that command still reaches Redis, its answer never comes back)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

__all__ = ["RedisRelay"]

# bytes read from one side before they are passed on
CHUNK = 65_536


class RedisRelay:
    def __init__(self, url: str, *, mute_on: str | None = None) -> None:
        self._target = urlsplit(url)
        self._marker = None if mute_on is None else mute_on.encode()
        self.muted = asyncio.Event()  # set once a connection went silent
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        """Listen; the URL of the relay (the target's, with the relay's host and port)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        credentials, _, _ = self._target.netloc.rpartition("@")  # the password, if any
        netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
        return urlunsplit(self._target._replace(netloc=netloc))

    async def cut(self) -> None:
        """Close the relay and every connection through it."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(
            self._target.hostname, self._target.port
        )
        self._writers += [writer, up_writer]
        muted = [False]

        async def upstream() -> None:
            while data := await reader.read(CHUNK):
                if self._marker is not None and self._marker in data:
                    muted[0] = True
                    self.muted.set()
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(CHUNK):
                if not muted[0]:
                    writer.write(data)
                    await writer.drain()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        writer.close()
        up_writer.close()
