"""An operator settles a stuck operation (``POST /admin/v1/operations/{id}/resolve``).

An admin of the operation's tenant says how an ``unknown`` or ``conflict`` operation ended
(``completed`` or ``failed``), with the provider's reference, a reason and the result to
store. The resolution is one more observation (source ``admin``, ``resolution``) through the
settlement core: the tuple gate, the rank merge and the terminal resolver decide as for any
observation (``service/core/settle.py``, "Resolution"), so a terminal operation is never
overwritten and a live attempt is left to settle its own row. What the core does not apply is
refused with ``resolution-refused`` and the core's reason.

What a resolution stores is what signed evidence of the same outcome stores
(:mod:`service.evidence`): the status, ``application/json`` for ``completed`` or
``application/problem+json`` for ``failed``, the canonical JSON of the body (keys sorted, no
whitespace) and its digest. The client's next retry with the same key replays exactly that,
and a provider's answer that says the same thing (the same body) strengthens it instead of
conflicting with it.

The audit is the observation row itself: who (the admin's id and name), when (the row's
``created_at``), why (``reason``) and what evidence (``provider_reference``), kept in its
``detail`` and listed on the operation's status resource and console timeline.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec

from service.app.answers import Problem
from service.app.status import pinned_tenant
from service.core import (
    Apply,
    Observation,
    ObservationKind,
    ReservationTuple,
    Result,
    Scope,
    Source,
    Strengthen,
)
from service.domain.principals import Principal
from service.evidence import canonical, content_type_for, result_digest
from service.leases import LeaseManager
from service.store.pool import HotPool
from service.store.settlement import OperationNotFound, SettlementStore
from service.store.status import OperationView, operation_view

__all__ = ["ResolutionResult", "ResolveBody", "Resolved", "resolve"]

# What a person writes: printable, no NUL, bounded.
Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=r"^[^\x00]*$")]
Reference = Annotated[str, msgspec.Meta(pattern=r"^[\x20-\x7e]{1,256}(?!\n)$")]
# Largest stored body of a resolution, encoded (a provider's answer is a few hundred bytes).
MAX_RESOLUTION_BODY = 64 * 1024


class ResolutionResult(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The answer to store: a 2xx and its body for ``completed``, a 4xx (a problem's fields,
    or any JSON object) for ``failed``."""

    status: Annotated[int, msgspec.Meta(ge=200, le=499)]
    body: dict[str, Any]


# the one rule of a resolution JSON Schema does not state (its schema says it in words)
OUTCOME_RULE = "completed with a 2xx result.status, failed with a 4xx one"


class ResolveBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    outcome: Annotated[Literal["completed", "failed"], msgspec.Meta(description=OUTCOME_RULE)]
    provider_reference: Reference
    reason: Reason
    result: ResolutionResult

    def __post_init__(self) -> None:
        status = self.result.status
        if self.outcome == "completed" and not 200 <= status < 300:
            raise ValueError("a completed resolution stores a 2xx status")
        if self.outcome == "failed" and not 400 <= status < 500:
            raise ValueError("a failed resolution stores a 4xx status")
        if len(canonical(self.result.body)) > MAX_RESOLUTION_BODY:
            raise ValueError(f"result.body is over {MAX_RESOLUTION_BODY} bytes")


class Resolved(msgspec.Struct):
    operation: OperationView
    disposition: str  # applied, or strengthened: it said so already
    reason: str  # the core's reason


# the core's reasons for not applying a resolution, as an operator reads them
_REFUSED = {
    "attempt-live": "an attempt holds a live lease: its own answer settles the operation",
    "terminal-not-overwritten": "the operation is already terminal with another outcome; "
    "a resolution never overwrites one",
    "not-a-conflicting-outcome": "none of the conflicting observations reported this outcome",
    "tuple-mismatch": "the operation moved to another epoch meanwhile",
}


def stored_result(body: ResolveBody) -> Result:
    """What the operation stores and replays (the same bytes evidence would store)."""
    content_type = content_type_for(body.outcome)
    stored = canonical(body.result.body)
    return Result(
        status=body.result.status,
        content_type=content_type,
        body=stored,
        digest=result_digest(body.result.status, content_type, stored),
    )


async def resolve(
    *,
    store: SettlementStore,
    views: HotPool,
    leases: LeaseManager,
    admin: Principal,
    operation_id: uuid.UUID,
    body: ResolveBody,
) -> Resolved | Problem:
    view = await operation_view(views, operation_id, tenant=pinned_tenant(admin))
    if view is None or not admin.may_act_in(view.tenant):
        return Problem("not-found", f"no operation {operation_id}")
    if view.state == "in_progress":
        # the row's lease time lags the lease in Redis (heartbeats extend it there): ask it
        scope = Scope(view.tenant, view.principal_id, view.route, view.key)
        if await leases.remaining(scope.lease_name()) is not None:
            return _refused("attempt-live", view)
    observation = Observation(
        reservation=ReservationTuple(
            operation_id=str(view.id),
            request_fingerprint=view.request_fingerprint,
            binding_generation=view.binding_generation,
        ),
        kind=ObservationKind(body.outcome),
        source=Source.ADMIN,
        result=stored_result(body),
        resolution=True,
    )
    detail = {
        "resolution": body.outcome,
        "admin_id": str(admin.id),
        "admin_name": admin.name,
        "reason": body.reason,
        "provider_reference": body.provider_reference,
        "state_before": view.state,
    }
    try:
        settled = await store.settle(operation_id, observation, detail=detail, tenant=view.tenant)
    except OperationNotFound:
        return Problem("not-found", f"no operation {operation_id}")
    decision = settled.decision
    if not isinstance(decision, Apply | Strengthen):
        return _refused(decision.reason.value, view, settled.record.state.value)
    after = await operation_view(views, operation_id, tenant=pinned_tenant(admin))
    assert after is not None  # a settled operation is not purged within one request
    return Resolved(
        operation=after, disposition=decision.disposition.value, reason=decision.reason.value
    )


def _refused(reason: str, view: OperationView, state: str | None = None) -> Problem:
    why = _REFUSED.get(reason, reason)
    return Problem(
        "resolution-refused",
        f"{reason}: {why}; the operation is unchanged (the refusal is on its timeline)",
        str(view.id),
        state=state or view.state,
    )
