"""The HTTP/1.1 protocol every server process runs: uvicorn's httptools protocol with three
changes (``settlement serve`` passes it to uvicorn as ``http=``; see
:func:`service.cli.uvicorn_options` for what httptools bought).

* **One write per response.** uvicorn writes a response's header block as soon as the app
  sends ``http.response.start``, and the body in a second write: two sends, each of which
  can wake the client. :class:`_Coalesced` holds the header block until the body's first
  write (or the response's end, or anything else written, or the connection's close).

* **Header values judged by the app, not the parser.** llhttp refuses control characters and
  obs-text (bytes 0x80-0xFF) in a header value with a plain-text 400 before the app runs, so
  an Idempotency-Key of ``"\\x1f"`` would not get its ``idempotency-key-invalid`` document.
  ``lenient_headers`` lets such values through to the app's own rules (as h11 does); CR and LF
  stay strict (a bare CR or LF inside a header is still a parse error), so header framing
  and request smuggling are unaffected.
* **Parse errors as problem documents.** A request that is not HTTP/1.1 at all gets a
  ``validation-error`` problem+json 400 (uvicorn's own is plain text), and the connection
  is closed: the parser cannot tell where a next request would start.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.app.answers import ProblemDocument
from service.app.effects import PROBLEM_CONTENT_TYPE
from service.telemetry.context import new_request_id

__all__ = ["SettlementHttpProtocol"]


class _Coalesced:
    """The connection's transport, holding each response's header block until the next
    write (its body), the response's end or the connection's close."""

    __slots__ = ("_cycle", "_held", "_protocol", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: SettlementHttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._held: bytes | None = None
        self._cycle: object = None  # the request whose header block was held last

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
            return
        cycle = self._protocol.cycle
        if (
            cycle is not None
            and cycle is not self._cycle
            and cycle.response_started
            and not cycle.response_complete
        ):
            # a started response's first write: its status line and headers
            self._cycle = cycle
            self._held = data
            return
        self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class SettlementHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with one write per response, header values left to the
    app, and problem documents for unparseable requests (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser.set_dangerous_leniencies(lenient_headers=True)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Coalesced(transport, self))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        # a response without a body write (HEAD, a 304) ends here: its header block goes now
        flush = getattr(self.transport, "flush", None)
        if flush is not None:
            flush()
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        body = msgspec.json.encode(
            ProblemDocument(
                type="/problems/validation-error",
                title="Invalid request",
                status=400,
                detail=f"the request is not valid HTTP/1.1: {msg}",
            )
        )
        head = (
            b"HTTP/1.1 400 Bad Request\r\n"
            b"content-type: " + PROBLEM_CONTENT_TYPE.encode() + b"\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"request-id: " + new_request_id().encode() + b"\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.write(head + body)
        self.transport.close()
