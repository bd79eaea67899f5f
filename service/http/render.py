"""Claim decisions and outcomes as HTTP responses: problem documents, replays, headers.

Every response of an idempotent route goes through :func:`fresh`, which sets
``Idempotent-Replayed`` and, once an operation exists, ``Operation-Id``.
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import urlencode

import msgspec
from litestar import Response

from service.core import (
    BindingMismatch,
    Claim,
    ClaimDecision,
    FingerprintMismatch,
    InProgress,
    OperationConflict,
    Replay,
    Result,
)
from service.domain.ledger import BusinessFailure
from service.http.problems import PROBLEM_CONTENT_TYPE, Problem, problem_response
from service.store.rows import Scope

__all__ = [
    "Outcome",
    "answer",
    "business_outcome",
    "busy",
    "fresh",
    "prefer_wait",
    "result_response",
]

JSON = "application/json"


class Outcome(msgspec.Struct, frozen=True):
    """What a handler produced: the response to store and replay."""

    status: int
    body: bytes
    content_type: str = JSON


# Business failures a route may store as terminal outcomes, with their status.
BUSINESS_STATUS = {
    "insufficient-funds": 402,
    "account-not-found": 404,
    "currency-mismatch": 422,
    "balance-limit": 422,
    "payout-declined": 402,
}
BUSINESS_TITLE = {
    "insufficient-funds": "Insufficient funds",
    "account-not-found": "Account not found",
    "currency-mismatch": "Currency mismatch",
    "balance-limit": "Balance limit exceeded",
    "payout-declined": "Payout declined",
}
_PREFER_WAIT = re.compile(r"(?:^|[;,\s])wait\s*=\s*(\d{1,6})(?:$|[;,\s])", re.IGNORECASE)


def answer(decision: ClaimDecision) -> Response[bytes]:
    """The HTTP response for a claim decision that is answered, not executed."""
    match decision:
        case Replay(result=result, operation_id=op):
            return result_response(result, op, replayed=True)
        case FingerprintMismatch(operation_id=op):
            return fresh(
                problem_response(
                    "fingerprint-mismatch",
                    "this key was used with a different request",
                    operation_id=op,
                ),
                op,
            )
        case BindingMismatch(operation_id=op):
            return fresh(
                problem_response(
                    "binding-mismatch",
                    "the operation is bound to another credential generation; "
                    "an admin supersede is needed",
                    operation_id=op,
                ),
                op,
            )
        case OperationConflict(operation_id=op):
            return fresh(
                problem_response(
                    "operation-conflict",
                    "incompatible outcomes were observed; see the status resource",
                    operation_id=op,
                    state="conflict",
                ),
                op,
            )
        case InProgress(operation_id=op):
            headers = {"Retry-After": "1"}
            if op:
                headers["Location"] = f"/v1/operations/{op}"
            return fresh(
                problem_response(
                    "operation-in-progress",
                    "another attempt holds this operation's lease",
                    headers=headers,
                    operation_id=op or None,
                    state="in_progress",
                ),
                op or None,
            )
        case Claim():  # pragma: no cover - claims are executed, never answered
            raise AssertionError("a claim is executed, not answered")


def result_response(result: Result, operation_id: str | None, *, replayed: bool) -> Response[bytes]:
    return fresh(
        Response(
            content=result.body,
            status_code=result.status,
            media_type=result.content_type,
        ),
        operation_id,
        replayed=replayed,
    )


def fresh(
    response: Response[bytes], operation_id: str | None = None, *, replayed: bool = False
) -> Response[bytes]:
    response.headers["Idempotent-Replayed"] = "true" if replayed else "false"
    if operation_id:
        response.headers["Operation-Id"] = operation_id
    return response


def business_outcome(failure: BusinessFailure, operation_id: uuid.UUID) -> Outcome:
    status = BUSINESS_STATUS[failure.slug]
    problem = Problem(
        type=f"/problems/{failure.slug}",
        title=BUSINESS_TITLE[failure.slug],
        status=status,
        detail=failure.detail,
        operation_id=str(operation_id),
        state="failed",
    )
    return Outcome(
        status=status, body=msgspec.json.encode(problem), content_type=PROBLEM_CONTENT_TYPE
    )


def busy(scope: Scope) -> Response[bytes]:
    """409 for a scope whose operation id is not known here: point at the key lookup."""
    location = "/v1/operations?" + urlencode({"key": scope.idempotency_key, "route": scope.route})
    return fresh(
        problem_response(
            "operation-in-progress",
            "another attempt holds this operation",
            headers={"Retry-After": "1", "Location": location},
            state="in_progress",
        )
    )


def prefer_wait(header: str | None, cap: float) -> float:
    if not header:
        return 0.0
    match = _PREFER_WAIT.search(header)
    return 0.0 if match is None else min(float(match.group(1)), cap)
