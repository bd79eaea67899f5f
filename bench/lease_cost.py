"""CPU of one lease acquire + release, as a request takes and gives back its scope's lease.

Starts a throw-away embedded Redis (no PostgreSQL) in a temporary directory, then runs
BENCH_LEASE_PAIRS (20,000) acquire/release pairs from BENCH_LEASE_TASKS (32) concurrent
tasks, each on a key of its own per pair, through ``service.leases.LeaseManager`` on the
client ``make_lease_redis`` builds (as the server does), under uvloop (the server's loop) and
under the default asyncio loop, BENCH_LEASE_ROUNDS (3) times each, alternating. Prints, per
loop, the process CPU per pair (``time.process_time``: this process only, Redis's own CPU
is not in it) of the cheapest round, the part of it spent in the kernel (sending to Redis
over loopback runs Redis's side of TCP too), the median round's CPU, and the wall time per
pair of the cheapest: on a machine shared with other work the cheapest round is the least
disturbed.

Run: ``.venv/bin/python -m bench.lease_cost``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

# Pairs run before the clock starts: connections opened, scripts loaded.
WARMUP = 500


async def _measure(url: str, pairs: int, tasks: int) -> tuple[float, float, float]:
    """(CPU us per pair, of it in the kernel, wall us per pair) of ``pairs`` pairs."""
    from service.config import Settings
    from service.leases import LeaseManager, make_lease_redis

    settings = Settings.from_env({})
    client = make_lease_redis(settings, url)
    leases = LeaseManager(
        client,
        ttl=settings.lease_ttl,
        timeout=settings.redis_timeout,
        prefix=f"bench:{uuid.uuid4().hex}:",
    )

    async def worker(index: int, count: int) -> None:
        for i in range(count):
            lease = await leases.acquire(f"{index}:{i}")
            assert lease is not None
            assert await leases.release(lease) is True

    async def run(total: int) -> None:
        share, extra = divmod(total, tasks)
        await asyncio.gather(*(worker(t, share + (t < extra)) for t in range(tasks)))

    try:
        await run(WARMUP)
        cpu, system = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
        wall = time.perf_counter()
        await run(pairs)
        return (
            1e6 * (time.process_time() - cpu) / pairs,
            1e6 * (resource.getrusage(resource.RUSAGE_SELF).ru_stime - system) / pairs,
            1e6 * (time.perf_counter() - wall) / pairs,
        )
    finally:
        await client.aclose()


def main() -> None:
    import uvloop

    from devstack import EmbeddedServices

    pairs = int(os.environ.get("BENCH_LEASE_PAIRS", "20000"))
    tasks = int(os.environ.get("BENCH_LEASE_TASKS", "32"))
    rounds = int(os.environ.get("BENCH_LEASE_ROUNDS", "3"))
    runners: dict[str, Callable[[Coroutine[Any, Any, tuple[float, float, float]]], Any]] = {
        "uvloop": uvloop.run,
        "asyncio": asyncio.run,
    }
    with tempfile.TemporaryDirectory(prefix="lease-cost-") as data_dir:
        services = EmbeddedServices(
            Path(data_dir), want_postgres=False, want_redis=True, durable=False
        )
        with services:
            print(f"{pairs} acquire/release pairs, {tasks} concurrent tasks, {rounds} rounds")
            measured: dict[str, list[tuple[float, float, float]]] = {n: [] for n in runners}
            for _ in range(rounds):
                for name, run in runners.items():
                    measured[name].append(run(_measure(services.redis_url, pairs, tasks)))
            for name, results in measured.items():
                cpu = sorted(results)
                cheapest, median = cpu[0], cpu[len(cpu) // 2]
                print(
                    f"  {name:8} cpu {cheapest[0]:7.1f} us/pair (kernel {cheapest[1]:5.1f};"
                    f" median {median[0]:7.1f})   wall {cheapest[2]:7.1f} us/pair"
                )


if __name__ == "__main__":
    main()
