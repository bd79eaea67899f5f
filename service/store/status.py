"""Read models for the status resource (reconciliation queries). Reads only; no authority."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.store.tables import attempts, observations, operation_epochs, operations

__all__ = ["OperationView", "find_by_key", "operation_view"]


class ResultView(msgspec.Struct):
    status: int
    digest: str
    content_type: str
    body: Any


class LeaseView(msgspec.Struct):
    attempt: uuid.UUID | None
    fencing_token: int
    expires_at: datetime | None


class AttemptView(msgspec.Struct):
    id: uuid.UUID
    fencing_token: int
    binding_generation: int
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    response_status: int | None
    error: str | None


class EpochView(msgspec.Struct):
    binding_generation: int
    request_fingerprint: str
    final_state: str
    result_digest: str | None
    reason: str
    superseded_by: uuid.UUID | None
    superseded_at: datetime


class ObservationView(msgspec.Struct):
    """One observation settled (or refused) about the operation: who reported what, and
    what the core did with it."""

    source: str
    kind: str
    verified: bool
    stage: str
    disposition: str
    reason: str
    revision_before: int | None
    revision_after: int | None
    detail: dict[str, Any] | None
    created_at: datetime


# The most observations one status answer lists (oldest first).
MAX_OBSERVATIONS = 100


class OperationView(msgspec.Struct):
    id: uuid.UUID
    tenant: str
    principal_id: uuid.UUID
    key: str
    route: str
    state: str
    binding_generation: int
    request_fingerprint: str
    revision: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    result: ResultView | None
    lease: LeaseView | None
    attempts: list[AttemptView]
    epochs: list[EpochView]
    conflict: dict[str, Any] | None
    observations: list[ObservationView]


def _body(content_type: str | None, body: bytes | None) -> Any:
    if body is None:
        return None
    if content_type and "json" in content_type:
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError:
            pass
    return body.decode("utf-8", "replace")


async def _view(conn: AsyncConnection, row: Any) -> OperationView:
    attempt_rows = (
        await conn.execute(
            select(attempts)
            .where(attempts.c.operation_id == row.id)
            .order_by(attempts.c.fencing_token)
        )
    ).all()
    epoch_rows = (
        await conn.execute(
            select(operation_epochs)
            .where(operation_epochs.c.operation_id == row.id)
            .order_by(operation_epochs.c.binding_generation)
        )
    ).all()
    observation_rows = (
        await conn.execute(
            select(observations)
            .where(observations.c.operation_id == row.id)
            .order_by(observations.c.id)
            .limit(MAX_OBSERVATIONS)
        )
    ).all()
    result = None
    if row.result_digest is not None:
        result = ResultView(
            status=row.result_status,
            digest=row.result_digest,
            content_type=row.result_content_type,
            body=_body(row.result_content_type, row.result_body),
        )
    lease = None
    if row.state == "in_progress":
        lease = LeaseView(
            attempt=row.current_attempt_id,
            fencing_token=row.fencing_token,
            expires_at=row.lease_expires_at,
        )
    return OperationView(
        id=row.id,
        tenant=row.tenant,
        principal_id=row.principal_id,
        key=row.idempotency_key,
        route=row.route,
        state=row.state,
        binding_generation=row.binding_generation,
        request_fingerprint=row.request_fingerprint,
        revision=row.revision,
        created_at=row.created_at,
        updated_at=row.updated_at,
        expires_at=row.expires_at,
        result=result,
        lease=lease,
        attempts=[
            AttemptView(
                id=a.id,
                fencing_token=a.fencing_token,
                binding_generation=a.binding_generation,
                started_at=a.started_at,
                finished_at=a.finished_at,
                outcome=a.outcome,
                response_status=a.response_status,
                error=a.error,
            )
            for a in attempt_rows
        ],
        epochs=[
            EpochView(
                binding_generation=e.binding_generation,
                request_fingerprint=e.request_fingerprint,
                final_state=e.final_state,
                result_digest=e.result_digest,
                reason=e.reason,
                superseded_by=e.superseded_by,
                superseded_at=e.superseded_at,
            )
            for e in epoch_rows
        ],
        conflict=row.conflict,
        observations=[
            ObservationView(
                source=o.source,
                kind=o.kind,
                verified=o.verified,
                stage=o.stage,
                disposition=o.disposition,
                reason=o.reason,
                revision_before=o.revision_before,
                revision_after=o.revision_after,
                detail=o.detail,
                created_at=o.created_at,
            )
            for o in observation_rows
        ],
    )


async def operation_view(engine: AsyncEngine, operation_id: uuid.UUID) -> OperationView | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(operations).where(operations.c.id == operation_id))
        ).first()
        return None if row is None else await _view(conn, row)


async def find_by_key(
    engine: AsyncEngine, tenant: str, principal_id: uuid.UUID, key: str, route: str | None
) -> OperationView | None:
    """The caller's most recent operation under ``key`` (optionally on one route)."""
    stmt = select(operations).where(
        operations.c.tenant == tenant,
        operations.c.principal_id == principal_id,
        operations.c.idempotency_key == key,
    )
    if route is not None:
        stmt = stmt.where(operations.c.route == route)
    async with engine.connect() as conn:
        row = (await conn.execute(stmt.order_by(operations.c.created_at.desc()).limit(1))).first()
        return None if row is None else await _view(conn, row)
