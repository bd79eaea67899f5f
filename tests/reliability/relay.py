"""A TCP relay on a fixed loopback port in front of PostgreSQL or Redis, in its own thread.

The servers under test connect to the relay, so the nemesis can take a dependency away and
bring it back without the address changing: :meth:`Relay.cut` drops every connection and
refuses new ones (an outage), :meth:`Relay.restore` ends it, :meth:`Relay.retarget` points it
at a restarted server's new port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

__all__ = ["Relay"]

HOST = "127.0.0.1"
CHUNK = 65536


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = _free_port()
        self._open = True
        self._streams: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"relay-{self.port}", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> Relay:
        self._thread.start()
        assert self._ready.wait(10), "the relay did not start"
        return self

    def url_for(self, url: str, backend_port: int) -> str:
        """``url`` (a database or Redis URL on ``backend_port``) through this relay."""
        return url.replace(f":{backend_port}/", f":{self.port}/")

    def cut(self) -> None:
        self._call(self._cut)

    def restore(self) -> None:
        self._open = True

    def retarget(self, port: int) -> None:
        self.target_port = port

    def stop(self) -> None:
        self._call(self._cut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the relay's own thread ---------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, HOST, self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    def _call(self, fn: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn()  # type: ignore[operator]
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def _cut(self) -> None:
        self._open = False
        for writer in list(self._streams):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._streams.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._streams.update((writer, up_writer))
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            self._streams.discard(w)
            w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port
