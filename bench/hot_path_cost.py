"""CPU per request of a new transfer and of a replay, the whole application driven in process.

    .venv/bin/python -m bench.hot_path_cost

Starts embedded PostgreSQL and Redis (not durable, ``bench.stack.Stack``), makes a client and
two accounts, and drives the production app over ASGI in this process
(:class:`devstack.asgi.Asgi`, its lifespan started; no HTTP server, no load generator),
BENCH_HOT_CONCURRENCY (16) requests at a time: 300 new transfers to warm up (their keys are
then replayed), BENCH_HOT_NEW (1500) new transfers, a fresh key each, then BENCH_HOT_REPLAY
(3000) replays of the warm-up's keys. BENCH_HOT_CLAIM_SETTLE: the app's
SETTLEMENT_DB_CLAIM_SETTLE (statement).
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
from devstack.asgi import Asgi

# replays cycle through the warm-up's keys
WARM_UP = 300
# an opening balance no run can spend
FUNDS = 10**12


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


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
        db_claim_settle=os.environ.get("BENCH_HOT_CLAIM_SETTLE", "statement"),
    )
    app = Asgi(create_app(settings))
    await app.start()
    try:

        async def post(path: str, body: dict[str, Any], idem: str) -> Any:
            headers = {
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/json",
                "Idempotency-Key": idem,
            }
            status, _, raw = await app.request("POST", path, headers, json.dumps(body).encode())
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
    mode = os.environ.get("BENCH_HOT_CLAIM_SETTLE", "statement")
    print(json.dumps({"checkout": os.getcwd(), "claim_settle": mode, **figures}))


if __name__ == "__main__":
    main()
