"""The client's exception classes that belong to no one problem slug: the root
:class:`SettlementError`, :class:`TransportFailed`, :class:`Problem` (a problem+json answer)
and the groups its generated subclasses sit under (``problems.py``, one class per slug)."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from settlement_client.models import ProblemDocument

__all__ = [
    "PROBLEM_CONTENT_TYPE",
    "Problem",
    "SettlementError",
    "SupersedeRequired",
    "TransportFailed",
    "UnknownProblem",
    "read_problem",
    "slug_of",
]

PROBLEM_CONTENT_TYPE = "application/problem+json"
_decode = msgspec.json.Decoder(ProblemDocument)


class SettlementError(Exception):
    """Anything the client raises. ``key`` is the call's Idempotency-Key (None on routes
    without one), ``attempts`` how many requests the call sent, ``gave_up`` why retrying
    stopped (``"final"`` for an answer that is never retried, else ``"attempts"``,
    ``"deadline"``, ``"budget"`` or ``"not-idempotent"``)."""

    key: str | None = None
    attempts: int = 0
    gave_up: str = "final"


class TransportFailed(SettlementError):
    """No HTTP answer: the connection failed, or was lost, or timed out. ``sent`` is False
    only when the request certainly never reached the server (no connection was made); when
    True the effect may have run: resend with the same key, or follow the operation."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class Problem(SettlementError):
    """A ``application/problem+json`` answer. Subclasses name one slug each."""

    slug: ClassVar[str] = ""
    status: int
    retry_safe: ClassVar[bool] = False

    def __init__(
        self,
        problem: ProblemDocument,
        *,
        content: bytes = b"",
        operation_id: str | None = None,
        request_id: str | None = None,
        replayed: bool = False,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(f"{problem.status} {problem.type}: {problem.detail}")
        self.problem = problem
        self.status = problem.status
        self.content = content
        self.operation_id = operation_id or problem.operation_id
        self.request_id = request_id
        self.replayed = replayed
        self.retry_after = retry_after


class UnknownProblem(Problem):
    """A slug this client does not know (a newer server): final unless 429/500/503."""


class SupersedeRequired(Problem):
    """The operation under this key cannot go on as it is: an operator decides (supersede
    it, or leave it). The client never picks a new key for the same intended action."""


def slug_of(problem: ProblemDocument) -> str:
    return problem.type.rsplit("/", 1)[-1]


def read_problem(content: bytes, *, status: int) -> ProblemDocument:
    """A problem answer's document (an unreadable body becomes a ``/problems/unknown`` one)."""
    try:
        return _decode.decode(content)
    except msgspec.DecodeError:
        return ProblemDocument(
            type="/problems/unknown",
            title="Unreadable problem document",
            status=status,
            detail=content[:200].decode(errors="replace"),
        )
