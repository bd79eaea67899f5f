"""The fault bench's cut answers (``python -m bench.faults``): a TCP relay in front of a server
that forwards every request and, for a share of them, closes the client's connection when the
answer arrives instead of forwarding it. The request was sent and ran to its end on the server;
the client gets no answer (a reset or an end of stream) and must retry the key to learn it.

The share is counted, not drawn: request ``n`` (1-based, over all connections) is cut when
``floor(n * share)`` grows, so a share of 0.1 cuts every tenth request, the same ones in every
run. Each connection carries one request at a time (``bench.client.Connection`` waits for an
answer before it sends the next), so whatever the server sends after a cut request is that
request's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Self

__all__ = ["CuttingRelay"]

HOST = "127.0.0.1"
# The most one read moves from one side to the other.
CHUNK = 65536
# How long the relay waits for the server to accept its connection.
CONNECT_TIMEOUT = 10.0


class CuttingRelay:
    """``async with CuttingRelay(port, share) as relay``: clients connect to ``relay.port``.

    ``relayed`` counts the requests forwarded, ``cut`` the answers withheld (each request
    whose answer began to arrive while it was marked).
    """

    def __init__(self, target_port: int, share: float) -> None:
        if not 0 <= share <= 1:
            raise ValueError(f"share must be within [0, 1], got {share}")
        self._target_port = target_port
        self._share = share
        self._server: asyncio.Server | None = None
        self.port = 0
        self.relayed = 0
        self.cut = 0

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)

    def _mark(self) -> bool:
        """Count one request; whether its answer is to be cut."""
        self.relayed += 1
        n = self.relayed
        return math.floor(n * self._share) > math.floor((n - 1) * self._share)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self._target_port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        marked = asyncio.Event()  # the request in flight on this connection is to be cut

        async def forward_requests() -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await reader.read(CHUNK):
                    if self._mark():
                        marked.set()
                    up_writer.write(data)
                    await up_writer.drain()
            with contextlib.suppress(OSError, ConnectionError):
                up_writer.write_eof()

        upward = asyncio.create_task(forward_requests())
        try:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await up_reader.read(CHUNK):
                    if marked.is_set():
                        self.cut += 1
                        return  # the answer arrived: close instead of forwarding it
                    writer.write(data)
                    await writer.drain()
        finally:
            upward.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upward
            for side in (writer, up_writer):
                side.close()
