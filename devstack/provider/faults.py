"""Armed faults: a FIFO, in memory, each entry covering the next ``count`` new payments.

Only a ``POST /payments`` that would create a new payment takes a fault; a replay of a
committed sink key is always answered normally and leaves the queue alone.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Annotated

import msgspec

__all__ = [
    "MAX_DELAY_MS",
    "MAX_FAULT_COUNT",
    "MAX_FAULT_ENTRIES",
    "Fault",
    "FaultError",
    "FaultMode",
    "FaultQueue",
    "FaultRequest",
]

# A delay past this is a hung provider, not a slow one; it also bounds a graceful shutdown.
MAX_DELAY_MS = 120_000
# Payments one arming request covers: more than any test or demo needs, and a fault that
# outlives the run that armed it is a misconfiguration, not a scenario.
MAX_FAULT_COUNT = 1_000
# Arming requests kept at once; bounds the simulator's memory against a runaway test.
MAX_FAULT_ENTRIES = 1_000


class FaultMode(enum.StrEnum):
    DROP_RESPONSE = "drop_response"  # commit, then close the connection mid-response
    ERROR_5XX = "error_5xx"  # answer 503 before committing anything
    DECLINE = "decline"  # commit a declined payment, answer 402
    DELAY = "delay"  # sleep delay_ms, then commit and answer


class FaultRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /_sim/faults``."""

    mode: FaultMode
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_FAULT_COUNT)]
    delay_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_DELAY_MS)] | None = None


class Fault(msgspec.Struct, frozen=True, omit_defaults=True):
    """One armed entry; ``count`` is what is left of it."""

    mode: FaultMode
    count: int
    delay_ms: int | None = None

    @property
    def delay(self) -> float:
        return (self.delay_ms or 0) / 1000


class FaultError(ValueError):
    """An arming request the queue refuses."""


class FaultQueue:
    def __init__(self) -> None:
        self._entries: deque[Fault] = deque()

    def arm(self, request: FaultRequest) -> None:
        if request.mode is FaultMode.DELAY and request.delay_ms is None:
            raise FaultError("delay_ms is required for mode delay")
        if request.mode is not FaultMode.DELAY and request.delay_ms is not None:
            raise FaultError("delay_ms applies to mode delay only")
        if len(self._entries) >= MAX_FAULT_ENTRIES:
            raise FaultError(f"at most {MAX_FAULT_ENTRIES} fault entries may be armed; clear them")
        self._entries.append(Fault(request.mode, request.count, request.delay_ms))

    def take(self) -> Fault | None:
        """The fault for the next new payment, or None; consumes one unit of its entry."""
        if not self._entries:
            return None
        head = self._entries.popleft()
        if head.count > 1:
            self._entries.appendleft(msgspec.structs.replace(head, count=head.count - 1))
        return msgspec.structs.replace(head, count=1)

    def clear(self) -> None:
        self._entries.clear()

    def armed(self) -> list[Fault]:
        return list(self._entries)
