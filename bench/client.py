"""A small asyncio HTTP/1.1 client for what wrk cannot do: seeding (every request once), and
clients that retry one key until it is terminal (``contention``).

Every request here is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bench.loadgen import LoadResult, percentiles, rank

# One request of the asyncio client.
REQUEST_TIMEOUT = 30.0


class Connection:
    """One keep-alive HTTP/1.1 connection; requests are raw bytes, answers are parsed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), REQUEST_TIMEOUT
        )
        return cls(reader, writer)

    async def send(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            self._writer.write(raw)
            await self._writer.drain()
            head = await self._reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", ""):
                raise RuntimeError("chunked answers are not expected from these routes")
            body = await self._reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 2)


async def send_all(
    port: int, requests: Sequence[bytes], *, concurrency: int
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send every request once over ``concurrency`` connections; the answers in order."""
    answers: list[tuple[int, dict[str, str], bytes] | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)

    async def worker() -> None:
        conn = await Connection.open(port)
        try:
            while not queue.empty():
                i = queue.get_nowait()
                answers[i] = await conn.send(requests[i])
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return [a for a in answers if a is not None]


@dataclass
class ContentionRound:
    key: str
    requests: int = 0
    in_progress: int = 0
    finals: dict[int, int] = field(default_factory=dict)
    distinct_final_bodies: int = 0
    executions: int = -1  # transfers written for the key's operation (SQL count)
    attempts: int = -1  # attempt rows of the key's operation (SQL count)
    seconds: float = 0.0


async def contention(
    port: int,
    build: Callable[[str], bytes],
    *,
    clients: int,
    duration: float,
    count_effects: Callable[[str], Awaitable[tuple[int, int]]],
) -> tuple[list[ContentionRound], LoadResult]:
    """Rounds of ``clients`` clients that send one new key at once and retry it at once on
    every 409 until they get another answer; a new key each round until ``duration`` ends.

    ``build(key)`` gives the raw request; ``count_effects(key)`` -> (transfers, attempts)
    written for the key's operation. Returns the rounds and the run as a LoadResult over all
    answers whose percentiles are those of the 409 answers (client-side, in ms).
    """
    conns = [await Connection.open(port) for _ in range(clients)]
    rounds: list[ContentionRound] = []
    latencies_409: list[float] = []
    statuses: dict[str, int] = {}
    deadline = time.perf_counter() + duration
    try:
        while time.perf_counter() < deadline or not rounds:
            key = f"contention-{os.getpid()}-{time.time_ns()}"
            current = await _contention_round(
                conns, key, build(key), deadline + REQUEST_TIMEOUT, latencies_409, statuses
            )
            current.executions, current.attempts = await count_effects(key)
            rounds.append(current)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    ordered = sorted(latencies_409)
    p50, p99 = percentiles(ordered)
    result = LoadResult(
        requests=sum(r.requests for r in rounds),
        seconds=sum(r.seconds for r in rounds),
        p50_ms=p50,
        p99_ms=p99,
        p90_ms=rank(ordered, 0.90) if ordered else 0.0,
        mean_ms=statistics.fmean(ordered) if ordered else 0.0,
        max_ms=ordered[-1] if ordered else 0.0,
        statuses=statuses,
    )
    return rounds, result


async def _contention_round(
    conns: Sequence[Connection],
    key: str,
    raw: bytes,
    give_up_at: float,
    latencies_409: list[float],
    statuses: dict[str, int],
) -> ContentionRound:
    current = ContentionRound(key=key)
    start = asyncio.Event()
    finals: list[bytes] = []

    async def client(conn: Connection) -> None:
        await start.wait()
        while True:  # bounded: a key that never settles is given up at give_up_at
            sent = time.perf_counter()
            status, _, body = await conn.send(raw)
            elapsed = (time.perf_counter() - sent) * 1000
            current.requests += 1
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status != 409:
                current.finals[status] = current.finals.get(status, 0) + 1
                finals.append(body)
                return
            current.in_progress += 1
            latencies_409.append(elapsed)
            if time.perf_counter() > give_up_at:
                return

    began = time.perf_counter()
    tasks = [asyncio.create_task(client(c)) for c in conns]
    start.set()
    await asyncio.gather(*tasks)
    current.seconds = time.perf_counter() - began
    current.distinct_final_bodies = len(set(finals))
    return current
