"""An app driven over ASGI in this process, its lifespan started: no HTTP server. The tests'
driver, and ``bench.hot_path_cost``'s (CPU per request with nothing around the app)."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Asgi"]


class Asgi:
    """One app, driven over ASGI in this process, its lifespan started."""

    def __init__(self, app: Any) -> None:
        """``app``: an ASGI app (a Litestar app; typed loosely, as an ASGI server takes it)."""
        self.app = app
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        assert (await self._from_app.get())["type"] == "lifespan.startup.complete"

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await self._from_app.get()
        assert self._task is not None
        await self._task

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | list[tuple[str, str]],
        body: bytes | list[bytes] = b"",
        *,
        lower: bool = True,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``body``: one chunk, or the chunks of a streamed body (an empty list: the client
        hangs up instead); ``lower``: header names lowercased, as the ASGI servers send them."""
        pairs = headers.items() if isinstance(headers, dict) else headers
        path, _, query = path.partition("?")
        raw = [((k.lower() if lower else k).encode(), v.encode("latin-1")) for k, v in pairs]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": raw,
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        chunks = [body] if isinstance(body, bytes) else list(body)
        hang_up = not chunks

        async def receive() -> dict[str, Any]:
            if chunks:
                chunk = chunks.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            if not hang_up:  # a client that neither sends more nor leaves: until cancelled
                await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = sent[0]
        content = b"".join(m.get("body", b"") for m in sent[1:])
        return start["status"], list(start["headers"]), content
