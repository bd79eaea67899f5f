"""Armed faults, in memory: payment faults and feed faults.

Payment faults are a FIFO, each entry covering the next ``count`` new payments. Only a
``POST /payments`` that would create a new payment takes a fault; a replay of a committed
sink key is always answered normally and leaves the queue alone.

Feed faults (:class:`FeedFaultQueue`) cover the next ``count`` feed pages or commits they
concern; :mod:`devstack.provider.feeds` says which and what each does.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Annotated, TypeVar

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
    "FeedFault",
    "FeedFaultMode",
    "FeedFaultQueue",
    "FeedFaultRequest",
]

T = TypeVar("T")

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


class FeedFaultMode(enum.StrEnum):
    """Misbehaviour of the event feeds; what each does is in :mod:`devstack.provider.feeds`."""

    OVERLAP = "overlap"
    BACKFILL = "backfill"
    EMPTY_ADVANCE = "empty_advance"
    SKIP_ADVANCE = "skip_advance"
    STUCK_TOKEN = "stuck_token"
    BIG_TIE = "big_tie"
    LATE_TIE = "late_tie"
    CONFLICTING_IDENTITY = "conflicting_identity"
    BAD_SIGNATURE = "bad_signature"
    PAGE_CAP = "page_cap"
    LYING_WATERMARK = "lying_watermark"


class FeedFaultRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /_sim/feed-faults``."""

    mode: FeedFaultMode
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_FAULT_COUNT)]


class FeedFault(msgspec.Struct, frozen=True):
    """One armed entry; ``count`` is what is left of it."""

    mode: FeedFaultMode
    count: int


class FeedFaultQueue:
    """Armed feed faults in arming order. Not thread-safe: its owner serialises the calls.

    Unlike :class:`FaultQueue`, an entry does not wait for the ones before it: the next page
    (or commit) takes the earliest entry whose mode concerns it *and* applies to it.
    """

    def __init__(self) -> None:
        self._entries: list[FeedFault] = []

    def arm(self, request: FeedFaultRequest) -> None:
        if len(self._entries) >= MAX_FAULT_ENTRIES:
            raise FaultError(f"at most {MAX_FAULT_ENTRIES} fault entries may be armed; clear them")
        self._entries.append(FeedFault(request.mode, request.count))

    def first(
        self, modes: frozenset[FeedFaultMode], attempt: Callable[[FeedFaultMode], T | None]
    ) -> tuple[int, FeedFaultMode, T] | None:
        """The earliest entry with a mode in ``modes`` for which ``attempt(mode)`` is not None,
        with that result; each mode is attempted at most once. Nothing is consumed."""
        refused: set[FeedFaultMode] = set()
        for index, entry in enumerate(self._entries):
            if entry.mode not in modes or entry.mode in refused:
                continue
            result = attempt(entry.mode)
            if result is not None:
                return index, entry.mode, result
            refused.add(entry.mode)
        return None

    def consume(self, index: int) -> bool:
        """Take one unit of the entry at ``index``; True when it was the entry's last."""
        entry = self._entries[index]
        if entry.count > 1:
            self._entries[index] = msgspec.structs.replace(entry, count=entry.count - 1)
            return False
        del self._entries[index]
        return True

    def clear(self) -> None:
        self._entries.clear()

    def armed(self) -> list[FeedFault]:
        return list(self._entries)
