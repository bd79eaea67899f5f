"""The retry policy: which answers are retried, how long to wait, when to stop. Pure: no
I/O, no clock of its own (``now`` and the random source are parameters).

=========================================  =========================================
answer                                     what the client does
=========================================  =========================================
2xx (fresh or replayed)                    return it (``replayed`` from the header)
402, 404, 410, 422, other 4xx              raise its exception at once, never retried
409 operation-in-progress                  retry with ``Prefer: wait=N`` at once
409 effect-refused, operation-superseded   retry after backoff / ``Retry-After``
429, 500, 502, 503                         retry after backoff / ``Retry-After``
504 (operation-outcome-unknown)            resend the same key after backoff
                                           (``resend_unknown=False``: raise at once)
connection refused, connect timeout        retry after backoff (nothing was sent)
connection lost, read timeout              resend the same key after backoff
409 binding-mismatch, operation-conflict   raise (an operator decides; no new key)
=========================================  =========================================

Every retry of one call reuses its Idempotency-Key. A call stops retrying after
``max_attempts`` requests, when the next wait would pass ``deadline`` seconds from its
first send, or when the client-wide :class:`RetryBudget` is empty; it then raises the last
answer's exception with ``gave_up`` set. Requests without an Idempotency-Key that may have
reached the server (admin POSTs) are only retried when they certainly did not.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal

import msgspec

__all__ = [
    "RETRYABLE_STATUSES",
    "Decision",
    "Observed",
    "RetryBudget",
    "RetryPolicy",
    "parse_retry_after",
]

# Statuses retried whatever their body says: busy or failing servers and proxies, whose
# answer says nothing ran to completion (with a key, a resend replays or resolves it).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
# Slugs retried although their status (409) is otherwise final.
RETRYABLE_SLUGS = frozenset(
    {"operation-in-progress", "effect-refused", "operation-superseded", "internal-error"}
)
IN_PROGRESS = "operation-in-progress"
OUTCOME_UNKNOWN = "operation-outcome-unknown"


class Observed(msgspec.Struct, frozen=True):
    """What one attempt got: an HTTP status (and problem slug), or a transport error.

    ``sent``: False when the request certainly never reached the server (connect errors)."""

    status: int | None = None
    slug: str = ""
    error: str | None = None
    sent: bool = True
    retry_after: str | None = None


class Decision(msgspec.Struct, frozen=True):
    """``retry`` after ``wait`` seconds (asking ``Prefer: wait=prefer_wait`` when > 0), or
    ``stop`` (``why``: final, attempts, deadline, budget, not-idempotent, unknown)."""

    action: Literal["return", "raise", "retry"]
    wait: float = 0.0
    prefer_wait: int = 0
    why: str = "final"


@dataclass
class RetryBudget:
    """A token bucket shared by every call of one client: each retry takes a token, tokens
    come back at ``refill_per_second`` up to ``capacity``. A server failing every request
    then sees about ``refill_per_second`` retries a second from this client, not
    ``max_attempts`` times its request rate. First attempts never need a token."""

    # Retries allowed in a burst (an outage's first seconds, a restart).
    capacity: float = 20.0
    # Sustained retries a second once the burst is spent.
    refill_per_second: float = 2.0
    clock: Callable[[], float] | None = None
    _tokens: float = field(init=False, default=-1.0)
    _at: float = field(init=False, default=0.0)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def _now(self) -> float:
        if self.clock is not None:
            return self.clock()
        import time

        return time.monotonic()

    def _refill(self) -> None:
        now = self._now()
        if self._tokens < 0:
            self._tokens, self._at = self.capacity, now
        elapsed = max(0.0, now - self._at)
        self._tokens = min(self.capacity, self._tokens + elapsed * self.refill_per_second)
        self._at = now

    def try_take(self) -> bool:
        """Take a token for one retry; False (and nothing taken) when fewer than one is left."""
        with self._lock:
            self._refill()
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    @property
    def tokens(self) -> float:
        with self._lock:
            self._refill()
            return self._tokens


@dataclass(frozen=True)
class RetryPolicy:
    """How one call retries. The defaults suit an interactive caller; a batch job may give
    a longer ``deadline``."""

    # Requests per call, the first included.
    max_attempts: int = 6
    # Seconds from the first send after which no retry is started.
    deadline: float = 30.0
    # Backoff: a full-jitter wait in [0, min(max_backoff, base_backoff * 2**(retry-1))].
    base_backoff: float = 0.1
    max_backoff: float = 5.0
    # A Retry-After above this is clipped (a misconfigured proxy must not park the caller).
    max_retry_after: float = 30.0
    # Seconds of ``Prefer: wait`` asked on the retry of an in-progress operation (0: never);
    # the server caps it by its own SETTLEMENT_MAX_WAIT.
    prefer_wait: int = 5
    # False: a 504 operation-outcome-unknown is raised at once, for callers that follow the
    # operation (wait_for_outcome) instead of resending.
    resend_unknown: bool = True

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Full jitter (AWS architecture blog, "Exponential Backoff And Jitter")."""
        ceiling = min(self.max_backoff, self.base_backoff * math.pow(2, max(0, retry - 1)))
        return rng.uniform(0.0, ceiling)

    def retryable(self, seen: Observed, *, idempotent: bool) -> bool:
        if seen.status is None:  # a transport error
            return idempotent or not seen.sent
        if not idempotent:  # it reached the server: only a key makes a resend safe, but a
            return seen.status == 429  # 429 is refused before anything runs
        if seen.slug == OUTCOME_UNKNOWN or (seen.status == 504 and not seen.slug):
            return self.resend_unknown
        return seen.status in RETRYABLE_STATUSES or seen.slug in RETRYABLE_SLUGS

    def decide(
        self,
        seen: Observed,
        *,
        attempt: int,
        elapsed: float,
        idempotent: bool,
        rng: random.Random,
        budget: RetryBudget | None,
        now: datetime | None = None,
    ) -> Decision:
        """What to do after ``attempt`` requests (1-based) and ``elapsed`` seconds."""
        if seen.status is not None and 200 <= seen.status < 300:
            return Decision("return")
        if not self.retryable(seen, idempotent=idempotent):
            why = "final" if seen.status is not None or idempotent else "not-idempotent"
            return Decision("raise", why=why)
        if attempt >= self.max_attempts:
            return Decision("raise", why="attempts")
        left = self.deadline - elapsed
        if seen.slug == IN_PROGRESS and self.prefer_wait > 0:
            asked = min(self.prefer_wait, math.floor(left))
            if asked >= 1:
                if budget is not None and not budget.try_take():
                    return Decision("raise", why="budget")
                return Decision("retry", wait=0.0, prefer_wait=asked)
        wait = self.backoff(attempt, rng)
        after = parse_retry_after(seen.retry_after, now=now)
        if after is not None:
            wait = max(wait, min(after, self.max_retry_after))
        if wait >= left:
            return Decision("raise", why="deadline")
        if budget is not None and not budget.try_take():
            return Decision("raise", why="budget")
        return Decision("retry", wait=wait)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds of a ``Retry-After`` (delay-seconds or an HTTP-date, RFC 9110 10.2.3);
    None when absent or unreadable; never negative."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
