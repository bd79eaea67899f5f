"""One call's retry loop without I/O: what to send next, and what to do with each answer.

``Client`` and ``AsyncClient`` drive a :class:`Call` the same way (send, ``observe``, then
return, raise or sleep and resend); only the sending and sleeping differ.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import httpx
import msgspec

from .observe import AttemptEvent, Hook, log, trace_headers
from .policy import Decision, Observed, RetryBudget, RetryPolicy
from .problems import PROBLEM_CONTENT_TYPE, Problem, SettlementError, TransportFailed, problem_from

__all__ = ["Answer", "Call", "Request"]

T = TypeVar("T")

# Transport errors raised before any byte of the request left: resending is always safe.
NOT_SENT: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)


class Answer(msgspec.Struct, Generic[T], frozen=True):
    """A final 2xx answer: the decoded body and how it came.

    ``replayed``: the server answered from its stored outcome (``Idempotent-Replayed``);
    ``attempts``: requests this call sent; ``content``: the body's bytes as received."""

    value: T
    status: int
    replayed: bool
    operation_id: str | None
    request_id: str | None
    key: str | None
    attempts: int
    content: bytes


class Request(msgspec.Struct, frozen=True):
    """What one call sends. ``key`` is set on idempotent routes (and makes resends safe)."""

    method: str
    path: str
    body: bytes | None = None
    params: dict[str, str] | None = None
    key: str | None = None
    prefer_wait: int = 0
    # statuses besides 2xx whose body (not a problem document) is the answer: GET /health's
    # 503 names the dependency that is down
    answers: tuple[int, ...] = ()


def _slug(response: httpx.Response) -> str:
    if not response.headers.get("content-type", "").startswith(PROBLEM_CONTENT_TYPE):
        return ""
    try:
        kind = msgspec.json.decode(response.content).get("type", "")
    except (msgspec.DecodeError, AttributeError):
        return ""
    return str(kind).rsplit("/", 1)[-1]


class Call:
    def __init__(
        self,
        request: Request,
        *,
        policy: RetryPolicy,
        budget: RetryBudget | None,
        rng: random.Random,
        hooks: Sequence[Hook],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request = request
        self.policy = policy
        self.budget = budget
        self.rng = rng
        self.hooks = hooks
        self.clock = clock
        self.started = clock()
        self.attempts = 0
        self.prefer_wait = request.prefer_wait
        self.last_error: httpx.TransportError | None = None

    def headers(self) -> dict[str, str]:
        """Headers of the next request (authorization and content type are the client's)."""
        self.attempts += 1
        headers = trace_headers()
        if self.request.key is not None:
            headers["Idempotency-Key"] = self.request.key
        if self.prefer_wait > 0:
            headers["Prefer"] = f"wait={self.prefer_wait}"
        return headers

    def timeout(self, base: httpx.Timeout) -> httpx.Timeout:
        """The request timeout, its read part lengthened by the wait asked of the server."""
        if self.prefer_wait <= 0 or base.read is None:
            return base
        return httpx.Timeout(
            connect=base.connect,
            read=base.read + self.prefer_wait,
            write=base.write,
            pool=base.pool,
        )

    def observe_answer(self, response: httpx.Response) -> Decision:
        slug = _slug(response)
        seen = Observed(
            status=response.status_code,
            slug=slug,
            retry_after=response.headers.get("retry-after"),
        )
        return self._decide(seen, response)

    def observe_error(self, error: httpx.TransportError) -> Decision:
        self.last_error = error
        seen = Observed(error=type(error).__name__, sent=not isinstance(error, NOT_SENT))
        return self._decide(seen, None)

    def _decide(self, seen: Observed, response: httpx.Response | None) -> Decision:
        elapsed = self.clock() - self.started
        if seen.status in self.request.answers and not seen.slug:
            decision = Decision("return")  # the route's own answer, not a failure
        else:
            decision = self.policy.decide(
                seen,
                attempt=self.attempts,
                elapsed=elapsed,
                idempotent=self.request.key is not None or self.request.method == "GET",
                rng=self.rng,
                budget=self.budget,
            )
        self.prefer_wait = decision.prefer_wait if decision.action == "retry" else 0
        headers = response.headers if response is not None else httpx.Headers()
        event = AttemptEvent(
            method=self.request.method,
            path=self.request.path,
            key=self.request.key,
            attempt=self.attempts,
            status=seen.status,
            slug=seen.slug,
            error=seen.error,
            decision=decision.action,
            wait=decision.wait,
            prefer_wait=decision.prefer_wait,
            gave_up=decision.why if decision.action == "raise" else "",
            replayed=headers.get("idempotent-replayed") == "true",
            operation_id=headers.get("operation-id"),
            request_id=headers.get("request-id"),
            elapsed=elapsed,
        )
        if decision.action == "retry":
            log.debug(
                "retry %s %s key=%s attempt=%d answer=%s wait=%.3fs prefer_wait=%d",
                self.request.method,
                self.request.path,
                self.request.key,
                self.attempts,
                seen.error or f"{seen.status} {seen.slug}".strip(),
                decision.wait,
                decision.prefer_wait,
            )
        for hook in self.hooks:
            hook(event)
        return decision

    def answer(self, response: httpx.Response, kind: type[T] | Any) -> Answer[T]:
        value: T = msgspec.json.decode(response.content, type=kind) if kind else None  # type: ignore[assignment]
        return Answer(
            value=value,
            status=response.status_code,
            replayed=response.headers.get("idempotent-replayed") == "true",
            operation_id=response.headers.get("operation-id"),
            request_id=response.headers.get("request-id"),
            key=self.request.key,
            attempts=self.attempts,
            content=response.content,
        )

    def failure(self, decision: Decision, response: httpx.Response | None) -> SettlementError:
        error: SettlementError
        if response is None:
            assert self.last_error is not None
            sent = not isinstance(self.last_error, NOT_SENT)
            error = TransportFailed(
                f"{self.request.method} {self.request.path}: "
                f"{type(self.last_error).__name__}: {self.last_error}",
                sent=sent,
            )
            error.__cause__ = self.last_error
        else:
            error = problem_from(
                response.content,
                status=response.status_code,
                operation_id=response.headers.get("operation-id"),
                request_id=response.headers.get("request-id"),
                replayed=response.headers.get("idempotent-replayed") == "true",
                retry_after=response.headers.get("retry-after"),
            )
        error.key = self.request.key
        error.attempts = self.attempts
        error.gave_up = decision.why
        return error


def is_problem(error: SettlementError) -> bool:
    return isinstance(error, Problem)
