"""Read models for the status resource (reconciliation queries). Reads only; no authority.

One statement per view, prepared on asyncpg (:mod:`service.store.pool`): the operation row with its
attempts, epochs and observations as JSON arrays (through SQLAlchemy these were four
statements and about 2.4 ms of CPU per answer).

Observations come a page at a time: the newest ``MAX_OBSERVATIONS`` (or the newest before
``observations_before``, an observation id), listed oldest first, with the cursor to the
next older page in ``older_observations``. The observation that moved the row to its
current revision (applied, strengthened or conflict, with a revision before it lower than
after: a replay of the same outcome is "strengthened" too, and moves nothing) is on every
page, wherever it falls, so no number of later observations hides what settled it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec

__all__ = [
    "MAX_OBSERVATION_ID",
    "ClientAnswer",
    "ConflictingResult",
    "Explanation",
    "OperationView",
    "find_by_key",
    "operation_view",
]


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
    superseded_by_name: Annotated[
        str | None, msgspec.Meta(description="the name of the admin who superseded it")
    ] = None


class ObservationView(msgspec.Struct):
    """One observation settled (or refused) about the operation: who reported what, and
    what the core did with it. ``id``: its place (ids grow with time), the paging cursor."""

    id: int
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
    # the name of the admin the detail names (admin_id), when it does
    admin_name: Annotated[
        str | None, msgspec.Meta(description="the name of the admin its detail names")
    ] = None
    # the result it reported (a terminal observation's)
    result_status: int | None = None
    result_digest: str | None = None


class ClientAnswer(msgspec.Struct):
    """What a client sending the operation's key is answered now."""

    status: int
    type: str
    """the problem type (``/problems/<slug>``); empty for a replayed stored answer"""
    title: str


class ConflictingResult(msgspec.Struct):
    """One of a conflict's incompatible outcomes, in arrival order."""

    kind: str
    digest: str
    status: int | None
    """the result's status as its observation recorded it (None: not on the page read)"""
    stored: bool
    """the row's stored result (its body below); only its digest is kept of the other"""
    body: Any = None


class Explanation(msgspec.Struct):
    """Why the operation is in its state, in an operator's words, and what clients sending
    its key are answered."""

    why: str
    """one or two sentences: why the operation is in its state, and what moves it"""
    last_error: str | None = None
    """the last attempt's error as it recorded it (None: it recorded none)"""
    clients_answered: ClientAnswer | None = None
    conflicting_results: list[ConflictingResult] | None = None


# The most observations one status answer lists besides the settling one (a page: the
# newest, oldest first); older ones are read page by page.
MAX_OBSERVATIONS = 100
# The largest observation id (a bigint): an observations_before above it is refused.
MAX_OBSERVATION_ID = 2**63 - 1


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
    # observations_before for the next older page of observations; None: none are older
    older_observations: int | None = None
    principal_name: Annotated[
        str | None, msgspec.Meta(description="the name of the principal that owns it")
    ] = None
    request: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(
            description="what was asked: the request body as its fingerprint covers it "
            "(decoded, defaults filled in; amounts in minor units of the currency); null: "
            "the operation was claimed before requests were recorded"
        ),
    ] = None
    request_path: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(description="the path parameters the fingerprint covers; null: none"),
    ] = None
    sink_key: Annotated[
        str | None,
        msgspec.Meta(
            description="an external route's: the Idempotency-Key the provider is sent "
            "(operation id and binding generation); null on a local route"
        ),
    ] = None
    explanation: Explanation | None = None


def _body(content_type: str | None, body: bytes | None) -> Any:
    if body is None:
        return None
    if content_type and "json" in content_type:
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError:
            pass
    return body.decode("utf-8", "replace")


# The operation and everything listed under it, in one statement: its attempts, epochs,
# one page of observations (one more than MAX_OBSERVATIONS, newest first below the cursor
# {before}: to know whether older ones exist) and the settling observation as JSON, each
# pinned to the operation's tenant ({tenant}: the parameter the statement takes it in), whose
# keys are the views' fields, sent as text (the connections' json codec is SQLAlchemy's,
# which would decode them to Python lists first) and decoded by msgspec into the views.
# admin_name: of the admin an observation's detail names (a resolution's), cast only when it
# has a UUID's shape (so no detail fails the answer); the regex's braces are doubled because
# _LISTS is str.format()ted
_OBSERVATION = """id, source, kind, verified, stage, disposition, reason, revision_before,
                  revision_after, detail, created_at, result_status, result_digest,
                  coalesce((SELECT p.name FROM principals p WHERE p.id = CASE
                              WHEN observations.detail->>'admin_id'
                                   ~ '^[0-9a-f]{{8}}(-[0-9a-f]{{4}}){{3}}-[0-9a-f]{{12}}$'
                              THEN (observations.detail->>'admin_id')::uuid END),
                           observations.detail->>'admin_name') AS admin_name"""
_LISTS = f"""
  (SELECT coalesce(json_agg(a ORDER BY a.fencing_token), '[]')::text
     FROM (SELECT id, fencing_token, binding_generation, started_at, finished_at, outcome,
                  response_status, error
             FROM attempts WHERE tenant = {{tenant}} AND operation_id = o.id) a) AS attempts_json,
  (SELECT coalesce(json_agg(e ORDER BY e.binding_generation), '[]')::text
     FROM (SELECT binding_generation, request_fingerprint, final_state, result_digest, reason,
                  superseded_by, superseded_at,
                  (SELECT p.name FROM principals p WHERE p.id = superseded_by) AS superseded_by_name
             FROM operation_epochs
            WHERE tenant = {{tenant}} AND operation_id = o.id) e) AS epochs_json,
  (SELECT coalesce(json_agg(b ORDER BY b.id), '[]')::text
     FROM (SELECT {_OBSERVATION}
             FROM observations WHERE tenant = {{tenant}} AND operation_id = o.id
              AND id < {{before}}
            ORDER BY id DESC LIMIT {MAX_OBSERVATIONS + 1}) b) AS observations_json,
  (SELECT row_to_json(s)::text
     FROM (SELECT {_OBSERVATION}
             FROM observations WHERE tenant = {{tenant}} AND operation_id = o.id
              AND revision_after = o.revision
              AND (revision_before IS NULL OR revision_before < revision_after)
              AND disposition IN ('applied', 'strengthened', 'conflict')
            ORDER BY id DESC LIMIT 1) s) AS settling_json"""

_COLUMNS = """o.id, o.tenant, o.principal_id, o.idempotency_key, o.route, o.state,
  o.binding_generation, o.request_fingerprint, o.revision, o.created_at, o.updated_at,
  o.expires_at, o.result_status, o.result_digest, o.result_content_type, o.result_body,
  o.current_attempt_id, o.fencing_token, o.lease_expires_at, o.conflict, o.canonical_request,
  (SELECT p.name FROM principals p WHERE p.id = o.principal_id) AS principal_name"""

BY_ID = (
    f"SELECT {_COLUMNS}, {_LISTS.format(before='$2', tenant='$3')}\n"
    "  FROM operations o WHERE o.tenant = $3 AND o.id = $1"
)
# The tenant of an operation named by its id alone, for a reader of every tenant (an
# all-tenant admin): the one statement that is not pinned; the view is then read pinned.
TENANT_OF = (
    "/* spans tenants: an all-tenant admin names an operation by its id alone; this finds its"
    " tenant (by the id's index), and the view is read pinned to it */"
    " SELECT tenant FROM operations WHERE id = $1"
)

# the caller's most recent operation under a key (any route, or $4's)
_LATEST = """SELECT * FROM operations
     WHERE tenant = $1 AND principal_id = $2 AND idempotency_key = $3{route}
     ORDER BY created_at DESC LIMIT 1"""
BY_KEY = (
    f"SELECT {_COLUMNS}, {_LISTS.format(before='$4', tenant='$1')}\n"
    f"  FROM ({_LATEST.format(route='')}) o"
)
BY_KEY_ON_ROUTE = (
    f"SELECT {_COLUMNS}, {_LISTS.format(before='$5', tenant='$1')}\n"
    f"  FROM ({_LATEST.format(route=' AND route = $4')}) o"
)

_attempts = msgspec.json.Decoder(list[AttemptView])
_epochs = msgspec.json.Decoder(list[EpochView])
_observations = msgspec.json.Decoder(list[ObservationView])
_observation = msgspec.json.Decoder(ObservationView)


def _page(row: Any) -> tuple[list[ObservationView], int | None]:
    """The page of observations (oldest first) with the settling one in its place, and the
    cursor to the next older page."""
    page = _observations.decode(row["observations_json"])
    older = None
    if len(page) > MAX_OBSERVATIONS:
        page = page[1:]
        older = page[0].id
    if row["settling_json"] is not None:
        settling = _observation.decode(row["settling_json"])
        if all(seen.id != settling.id for seen in page):
            page = sorted([*page, settling], key=lambda seen: seen.id)
    return page, older


def _request(canonical: str | None) -> dict[str, Any]:
    """The request's body and path parameters from what its fingerprint covers."""
    if canonical is None:
        return {}
    covered = msgspec.json.decode(canonical)
    return {"request": covered.get("body"), "request_path": covered.get("path") or None}


def _view(row: Any) -> OperationView:
    observations, older = _page(row)
    result = None
    if row["result_digest"] is not None:
        result = ResultView(
            status=row["result_status"],
            digest=row["result_digest"],
            content_type=row["result_content_type"],
            body=_body(row["result_content_type"], row["result_body"]),
        )
    lease = None
    if row["state"] == "in_progress":
        lease = LeaseView(
            attempt=row["current_attempt_id"],
            fencing_token=row["fencing_token"],
            expires_at=row["lease_expires_at"],
        )
    return OperationView(
        id=row["id"],
        tenant=row["tenant"],
        principal_id=row["principal_id"],
        key=row["idempotency_key"],
        route=row["route"],
        state=row["state"],
        binding_generation=row["binding_generation"],
        request_fingerprint=row["request_fingerprint"],
        revision=row["revision"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        expires_at=row["expires_at"],
        result=result,
        lease=lease,
        attempts=_attempts.decode(row["attempts_json"]),
        epochs=_epochs.decode(row["epochs_json"]),
        conflict=row["conflict"],
        observations=observations,
        older_observations=older,
        principal_name=row["principal_name"],
        **_request(row["canonical_request"]),
    )


async def operation_view(
    pool: Any,
    operation_id: uuid.UUID,
    observations_before: int | None = None,
    *,
    tenant: str | None,
) -> OperationView | None:
    """``pool``: the hot path's :class:`service.store.pool.HotPool`, whose sessions (every
    connection's: :func:`service.store.db.server_settings`) write timestamps in JSON in
    UTC. ``observations_before``: list the observations older than this id (a page).
    ``tenant``: the operation's tenant as the reader knows it (its own); None: a reader of
    every tenant, for whom :data:`TENANT_OF` finds it first."""
    async with pool.acquire() as conn:
        if tenant is None:
            tenant = await conn.fetchval(TENANT_OF, operation_id)
            if tenant is None:
                return None
        row = await conn.fetchrow(BY_ID, operation_id, _cursor(observations_before), tenant)
    return None if row is None else _view(row)


async def find_by_key(
    pool: Any,
    tenant: str,
    principal_id: uuid.UUID,
    key: str,
    route: str | None,
    observations_before: int | None = None,
) -> OperationView | None:
    """The caller's most recent operation under ``key`` (optionally on one route)."""
    before = _cursor(observations_before)
    async with pool.acquire() as conn:
        if route is None:
            row = await conn.fetchrow(BY_KEY, tenant, principal_id, key, before)
        else:
            row = await conn.fetchrow(BY_KEY_ON_ROUTE, tenant, principal_id, key, route, before)
    return None if row is None else _view(row)


def _cursor(observations_before: int | None) -> int:
    return MAX_OBSERVATION_ID if observations_before is None else observations_before
