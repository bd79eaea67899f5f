"""The HTTP/1.1 protocol every server process runs: uvicorn's httptools protocol with two
changes (``settlement serve`` passes it to uvicorn as ``http=``; see
:func:`service.cli.uvicorn_options` for what httptools bought).

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

from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.app.answers import ProblemDocument
from service.app.effects import PROBLEM_CONTENT_TYPE
from service.telemetry.context import new_request_id

__all__ = ["SettlementHttpProtocol"]


class SettlementHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header values left to the app and problem documents
    for unparseable requests (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser.set_dangerous_leniencies(lenient_headers=True)

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
