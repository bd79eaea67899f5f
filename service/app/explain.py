"""Why an operation is where it is, in an operator's words: what the status resource and the
console's operation page say beside the facts. Pure: a view in, an explanation out.

* ``unknown``: the last attempt's error ("provider answered 503", "timed out after 2 s",
  "lease lost ...", written where the attempt ended: :mod:`service.app.external_attempts`),
  or, for an attempt that never reported, that its lease ran out (a worker gone) and the
  sweeper marked the operation.
* ``in_progress``: which attempt holds the lease, what clients sending the key are answered.
* ``conflict``: what clients are answered (409 and its problem type) and both conflicting
  results: the stored one with its body, the other with the status and digest its
  observation recorded (only the first result's body is kept).
"""

from __future__ import annotations

from typing import Any

from service.core import ReservationTuple
from service.domain.payouts import sink_key
from service.problem_types import PROBLEM_TYPES
from service.store.status import (
    AttemptView,
    ClientAnswer,
    ConflictingResult,
    Explanation,
    OperationView,
)

__all__ = ["explain"]


def _answered(slug: str) -> ClientAnswer:
    problem = PROBLEM_TYPES[slug]
    return ClientAnswer(status=problem.status, type=f"/problems/{slug}", title=problem.title)


def _current(view: OperationView) -> list[AttemptView]:
    """The attempts of the current reservation epoch: an earlier epoch's ran under another
    sink key, and say nothing of what a retry does now."""
    return [a for a in view.attempts if a.binding_generation == view.binding_generation]


def _last(view: OperationView) -> AttemptView | None:
    return max(_current(view), key=lambda attempt: attempt.fencing_token, default=None)


def _last_error(view: OperationView) -> str | None:
    """The error of the current epoch's newest attempt that ended with one."""
    ended = [attempt for attempt in _current(view) if attempt.error]
    return max(ended, key=lambda attempt: attempt.fencing_token).error if ended else None


def _earlier_unknown(view: OperationView) -> str:
    """For an external effect, what an earlier epoch that ended ``unknown`` may have done:
    its sink key may have been paid, and a retry now sends another one."""
    if view.sink_key is None:
        return ""
    unknown = [e for e in view.epochs if e.final_state == "unknown"]
    if not unknown:
        return ""
    epoch = max(unknown, key=lambda e: e.binding_generation)
    previous = epoch.binding_generation
    key = sink_key(ReservationTuple(str(view.id), epoch.request_fingerprint, previous))
    return (
        f" Epoch {previous} ended unknown: its sink key {key} may have been paid, and the "
        f"provider does not match {view.sink_key} against it, so check the provider's record "
        f"of {key} before a retry runs this epoch."
    )


def explain(view: OperationView) -> Explanation:
    """Why ``view`` is in its state, and what clients sending its key are answered (its
    ``sink_key``, set for an external route, is named in what a retry does)."""
    match view.state:
        case "unknown":
            return _unknown(view)
        case "in_progress":
            return _in_progress(view)
        case "conflict":
            return _conflict(view)
        case state:  # completed or failed
            status = view.result.status if view.result is not None else 0
            return Explanation(
                why=f"{state}: the outcome is stored; a retry with the same key is answered "
                f"with it again (status {status}, Idempotent-Replayed: true).",
                last_error=_last_error(view),
                clients_answered=ClientAnswer(status=status, type="", title="the stored answer"),
            )


def _unknown(view: OperationView) -> Explanation:
    last, error = _last(view), _last_error(view)
    retry = " A retry with the same key runs it again"
    if view.sink_key is not None:  # an external effect: the provider dedupes by its key
        retry += (
            f" (the provider is sent the same sink key, {view.sink_key}, and never pays "
            "twice); an operator may resolve it from the provider's record."
        )
    else:
        retry += "; an operator may resolve it."
    if last is None:
        why = "No attempt has run in this reservation epoch yet."
    elif last.finished_at is None:
        swept = any(seen.source == "sweeper" for seen in view.observations)
        why = (
            f"Lease lost: attempt {last.fencing_token} never reported (its worker stopped or "
            "was cut off), its lease ran out"
            + (" and the lease sweeper marked the operation unknown." if swept else ".")
        )
    elif last.error:
        why = f"Attempt {last.fencing_token} got no definitive answer: {last.error}."
    else:
        why = f"Attempt {last.fencing_token} ended without an outcome."
    return Explanation(why=why + retry + _earlier_unknown(view), last_error=error)


def _in_progress(view: OperationView) -> Explanation:
    last = _last(view)
    who = "An attempt" if last is None else f"Attempt {last.fencing_token}"
    if view.lease is not None and view.lease.expires_at is not None:
        why = (
            f"{who} holds the lease and is running; clients sending the key are answered 409 "
            "(or wait for it with Prefer: wait)."
        )
    else:
        why = (
            f"{who} no longer holds its lease (its worker stopped or was cut off): the lease "
            "sweeper marks it unknown, and a retry with the same key takes it over."
        )
    return Explanation(
        why=why, last_error=_last_error(view), clients_answered=_answered("operation-in-progress")
    )


def _conflict(view: OperationView) -> Explanation:
    conflict: dict[str, Any] = view.conflict or {}
    statuses = {
        seen.result_digest: seen.result_status
        for seen in view.observations
        if seen.result_digest is not None
    }
    stored = view.result
    results = [
        ConflictingResult(
            kind=str(kind),
            digest=str(digest),
            status=stored.status
            if stored is not None and stored.digest == digest
            else statuses.get(digest),
            stored=stored is not None and stored.digest == digest,
            body=stored.body if stored is not None and stored.digest == digest else None,
        )
        for kind, digest in zip(
            conflict.get("kinds", []), conflict.get("digests", []), strict=False
        )
    ]
    kinds = sorted({result.kind for result in results})
    what = " and ".join(kinds) or "not named"
    if len(kinds) == 1:
        what = f"{kinds[0]}, with different results"
    return Explanation(
        why=(
            f"Two incompatible outcomes ({what}) were observed under one reservation: clients "
            "sending the key are answered 409 operation-conflict until an operator resolves "
            "it to one of them."
        ),
        last_error=_last_error(view),
        clients_answered=_answered("operation-conflict"),
        conflicting_results=results,
    )
