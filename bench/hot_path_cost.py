"""CPU per request of a new transfer and of a replay, the whole application driven in process.

    .venv/bin/python -m bench.hot_path_cost

Starts embedded PostgreSQL and Redis (not durable, ``bench.stack.Stack``), makes a client and
two accounts, and drives the production app over ASGI in this process (:class:`_Asgi`, its
lifespan started; no HTTP server, no load generator), BENCH_HOT_CONCURRENCY (16) requests at
a time: 300 new transfers to warm up (their keys are then replayed), BENCH_HOT_NEW (1500) new
transfers, a fresh key each, then BENCH_HOT_REPLAY (3000) replays of the warm-up's keys.
Prints one JSON line: per scenario, this process's CPU per request (``time.process_time``:
the app and the driver, which is the same for every version), PostgreSQL's (every one of its
processes, ``psutil``) and requests per second.

To compare two versions, run it in a checkout of each (``git worktree add``), alternately,
a few times each: the module runs the checkout it is started in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.stack import Stack

# replays cycle through the warm-up's keys
WARM_UP = 300
# an opening balance no run can spend
FUNDS = 10**12


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class _Asgi:
    """The app called as an ASGI server calls it, with the least around it: one queue each
    way for the lifespan, a request's body in one message."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self._app(scope, self._to_app.get, self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        assert (await self._from_app.get())["type"] == "lifespan.startup.complete"

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await self._from_app.get()
        assert self._task is not None
        await self._task

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        sent = False
        status, chunks = 0, []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()  # no disconnect while the answer is made
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self._app(scope, receive, send)
        return status, b"".join(chunks)


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # a backend that closed meanwhile
            continue
        total += times.user + times.system
    return total


async def _drive(stack: Stack) -> dict[str, dict[str, float]]:
    from service.config import Settings
    from service.domain.principals import Role
    from service.http.app import create_app
    from service.store.db import make_engine
    from service.store.principals import PrincipalStore

    engine = make_engine(Settings.from_env({}), stack.database_url, pool_size=1)
    try:
        _, key = await PrincipalStore(engine).create("bench", "client", Role.CLIENT)
    finally:
        await engine.dispose()
    settings = Settings.from_env(
        {},
        database_url=stack.database_url,
        redis_url=stack.redis_url,
        sweep_interval=3600.0,
        log_format="text",
        access_log=False,
    )
    app = _Asgi(create_app(settings))
    await app.start()
    try:

        async def post(path: str, body: dict[str, Any], idem: str) -> Any:
            headers = {
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/json",
                "Idempotency-Key": idem,
            }
            status, raw = await app.post(path, headers, json.dumps(body).encode())
            assert status == 201, raw
            return json.loads(raw)

        ids = [
            (await post("/v1/accounts", {"currency": "EUR", "opening_balance": b}, f"a{n}"))["id"]
            for n, b in enumerate((FUNDS, 0))
        ]
        transfer = {"source": ids[0], "destination": ids[1], "amount": 1, "currency": "EUR"}
        gate = asyncio.Semaphore(_env("BENCH_HOT_CONCURRENCY", 16))

        async def one(idem: str) -> None:
            async with gate:
                await post("/v1/transfers", transfer, idem)

        async def run(keys: list[str]) -> None:
            await asyncio.gather(*(one(k) for k in keys))

        await run([f"w{i}" for i in range(WARM_UP)])
        scenarios: dict[str, Callable[[], list[str]]] = {
            "new": lambda: [uuid.uuid4().hex for _ in range(_env("BENCH_HOT_NEW", 1500))],
            "replay": lambda: [f"w{i % WARM_UP}" for i in range(_env("BENCH_HOT_REPLAY", 3000))],
        }
        figures: dict[str, dict[str, float]] = {}
        for name, keys_of in scenarios.items():
            keys = keys_of()
            cpu, pg, wall = time.process_time(), _cpu(stack.postgres_processes()), time.monotonic()
            await run(keys)
            n = len(keys)
            figures[name] = {
                "app_cpu_ms": 1000 * (time.process_time() - cpu) / n,
                "postgres_cpu_ms": 1000 * (_cpu(stack.postgres_processes()) - pg) / n,
                "requests_per_second": n / (time.monotonic() - wall),
            }
        return figures
    finally:
        await app.stop()


def main() -> None:
    logging.disable(logging.WARNING)  # the app's request log is not the figure
    with Stack(Path(tempfile.mkdtemp(prefix="hot-path-cost-"))) as stack:
        figures = asyncio.run(_drive(stack))
    print(json.dumps({"checkout": os.getcwd(), **figures}))


if __name__ == "__main__":
    main()
