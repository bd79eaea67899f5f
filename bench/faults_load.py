"""The fault bench's load (``python -m bench.faults``): each key's request sent once over a
few keep-alive connections, with a fault struck midway, then each key sent again.

``send_pass`` sends every request once and returns each key's answer status (``0``: no
answer: the connection was reset or closed, or the request timed out after
``bench.client.REQUEST_TIMEOUT``; the connection is then opened anew for the next key).
``strike_at`` answers into the pass it awaits ``strike(hold)``, the fault, at once (its first
step runs in the next turn of the event loop, with the other connections' requests in
flight) while the load goes on; once the fault calls ``hold()``, no connection sends a new
request until ``strike`` returns (each then opens a new connection: a killed server left the
old ones dead). A retry is a plain resend: the same
bytes (key, body and headers), once, whatever the first answer was.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bench.client import Connection

__all__ = ["Pass", "send_pass"]

# How long a connection keeps trying to open while the server is restarting or refusing.
CONNECT_PATIENCE = 30.0
# The pause between two attempts to open a connection.
CONNECT_PAUSE = 0.05


@dataclass
class Pass:
    """One pass over the keys: each key's status, and what was in flight when the fault
    struck."""

    statuses: dict[str, int] = field(default_factory=dict)
    answered: int = 0
    answered_at_strike: int = -1  # -1: no fault struck during this pass
    in_flight_at_strike: int = -1  # requests sent and not answered when the load was held
    seconds: float = 0.0


async def send_pass(
    port: int,
    requests: Sequence[tuple[str, bytes]],
    *,
    connections: int,
    strike_at: int | None = None,
    strike: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
) -> Pass:
    """Send each ``(key, raw request)`` once over ``connections`` connections to ``port``;
    with ``strike_at``, await ``strike(hold)`` after that many answers; from ``hold()`` until
    it returns, no new request is sent."""
    result = Pass()
    gate = asyncio.Event()
    gate.set()
    in_flight = 0
    next_index = 0
    epoch = 0  # counts the faults struck: a connection opened before one is opened anew
    loop = asyncio.get_running_loop()
    began = loop.time()

    def hold() -> None:
        if gate.is_set():
            gate.clear()
            result.in_flight_at_strike = in_flight

    async def fault_window() -> None:
        assert strike is not None
        nonlocal epoch
        try:
            await strike(hold)
        finally:
            hold()
            epoch += 1
            gate.set()

    async def worker() -> None:
        nonlocal in_flight, next_index
        conn: Connection | None = None
        opened_in = epoch
        try:
            while True:
                await gate.wait()
                if next_index >= len(requests):
                    return
                key, raw = requests[next_index]
                next_index += 1
                in_flight += 1
                if conn is not None and opened_in != epoch:
                    await conn.close()  # a server killed meanwhile left it dead
                    conn = None
                if conn is None:
                    opened_in = epoch
                    conn = await _open(port)
                try:
                    if conn is None:
                        raise ConnectionError("no connection")
                    status, _, _ = await conn.send(raw)  # bounded by REQUEST_TIMEOUT
                except (OSError, EOFError, ValueError, IndexError, asyncio.LimitOverrunError):
                    status = 0
                    if conn is not None:
                        await conn.close()
                    conn = None
                finally:
                    in_flight -= 1
                result.statuses[key] = status
                result.answered += 1
                if strike is not None and result.answered == strike_at:
                    result.answered_at_strike = result.answered
                    tasks.append(asyncio.create_task(fault_window()))
        finally:
            if conn is not None:
                await conn.close()

    tasks: list[asyncio.Task[None]] = []
    await asyncio.gather(*(worker() for _ in range(max(1, min(connections, len(requests))))))
    for task in tasks:
        await task
    result.seconds = loop.time() - began
    return result


async def _open(port: int) -> Connection | None:
    """A connection to ``port``, trying for up to ``CONNECT_PATIENCE``; None if it never
    opens (the key is then counted as unanswered)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONNECT_PATIENCE
    while True:
        with contextlib.suppress(OSError, TimeoutError):
            return await Connection.open(port)
        if loop.time() > deadline:
            return None
        await asyncio.sleep(CONNECT_PAUSE)
