"""Answers of the use cases as HTTP responses: one ``match``, nothing decided here.

An idempotent route's answer is a :class:`~service.http.reply.Reply`; every one goes through
:func:`stamp_idempotency_headers`, which sets ``Idempotent-Replayed`` and, once an operation
exists, ``Operation-Id``.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Response

from service.app.answers import Answer, Problem, Stored
from service.http.problems import problem_reply
from service.http.reply import Reply, to_response

__all__ = [
    "json_response",
    "prefer_wait",
    "render",
    "render_json_or_problem",
    "render_problem",
    "stamp_idempotency_headers",
]

_PREFER_WAIT = re.compile(r"(?:^|[;,\s])wait\s*=\s*(\d{1,6})(?:$|[;,\s])", re.IGNORECASE)


def render(answer: Answer) -> Reply:
    """The reply of an idempotent route."""
    match answer:
        case Stored(result=result, operation_id=op, replayed=replayed):
            reply = Reply(result.status, result.content_type, result.body)
            stamp_idempotency_headers(reply, op, replayed=replayed)
        case Problem(operation_id=op):
            reply = stamp_idempotency_headers(render_problem(answer), op)
    if answer.preference_applied is not None:
        reply.headers["Preference-Applied"] = answer.preference_applied
    return reply


def render_problem(problem: Problem) -> Reply:
    """A problem document with its ``Retry-After`` and ``Location`` headers."""
    headers: dict[str, str] = {}
    if problem.retry_after:
        headers["Retry-After"] = str(problem.retry_after_seconds or 1)
    if problem.location is not None:
        headers["Location"] = problem.location
    return problem_reply(
        problem.slug,
        problem.detail,
        headers=headers or None,
        operation_id=problem.operation_id,
        state=problem.state,
        expired_at=problem.expired_at,
        forget_at=problem.forget_at,
    )


def stamp_idempotency_headers(
    reply: Reply, operation_id: str | None = None, *, replayed: bool = False
) -> Reply:
    reply.headers["Idempotent-Replayed"] = "true" if replayed else "false"
    if operation_id:
        reply.headers["Operation-Id"] = operation_id
    return reply


def prefer_wait(header: str | None, cap: float) -> float:
    """Seconds of ``Prefer: wait=N``, capped; 0 without the preference."""
    if not header:
        return 0.0
    match = _PREFER_WAIT.search(header)
    return 0.0 if match is None else min(float(match.group(1)), cap)


def json_response(value: Any, status_code: int = 200) -> Response[bytes]:
    return Response(
        content=msgspec.json.encode(value), status_code=status_code, media_type="application/json"
    )


def render_json_or_problem(answer: Any, status_code: int = 200) -> Response[bytes]:
    """A use case's value as JSON, or its refusal as a problem document."""
    match answer:
        case Problem():
            return to_response(render_problem(answer))
        case value:
            return json_response(value, status_code)
