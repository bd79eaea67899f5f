"""The SQL of the hot path (:mod:`service.store.hot`), built from :mod:`service.store.tables`
with SQLAlchemy Core, compiled once for asyncpg and prepared on its connections.

* ``TENANT_OF``: the tenant of a live principal's key (once per key and process: the
  caller remembers it, :class:`service.store.principals.KeyTenants`).
* ``IDENTIFY``: the caller's principal, its scope's row and the scope's tombstone if it
  still stands at ``now``, the tenant given (``tenant``).
* ``CLAIM_NEW``: a new operation row and its attempt row (its own transaction).
* ``LOCK``: the operation row under its lock; ``BY_SCOPE``: the scope's row, no lock.
* :func:`finish_with`: a local effect's SQL (an :class:`EffectSql`), the row's CAS, the
  observation and the attempt's end, in one statement.
* :func:`claim_settle_with`: a new operation claimed, run and settled in one statement.

Both answer the observation's id (NULL: nothing was written) and the guard's ``refusal``
(NULL: the effect applied, or would have). :data:`NO_EFFECT` is the effect of nothing, whose
guard never refuses: with it, either statement settles an outcome without an effect.

Every reference to a tenant's table is pinned by ``tenant = $n`` (docs/scaling.md, the hot
path), so that on Citus each statement goes to the one node of its tenant; ``principals`` is
a reference table, its ``tenant`` pins nothing.

Every parameter is named (``bindparam``): a :class:`Prepared` statement takes a mapping of
names to values and puts them in the order of the compiled ``$n`` (``positiontup``). The
store's names are the columns' own (the row's after the write) plus those below; an
effect's names start with ``e_`` (checked when its statements are compiled).

An operation is never inserted under a live tombstone: the schema's trigger (migration 0006)
fails such an insert with SQLSTATE SK410, which
:func:`service.store.phase.database_refusals` raises as ``KeyExpired``.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    DateTime,
    Select,
    and_,
    bindparam,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.selectable import CTE

from service.store.outcomes import EffectSql, never_refused
from service.store.prepared import Prepared
from service.store.tables import attempts, observations, operations, principals, tombstones

__all__ = [
    "BY_SCOPE",
    "CLAIM_NEW",
    "IDENTIFY",
    "LOCK",
    "NO_EFFECT",
    "RECORD_ALONE",
    "ROW_COLUMNS",
    "TENANT_OF",
    "Prepared",
    "claim_settle_with",
    "effect_ok_of",
    "finish_with",
]

# the prefix of an effect's parameter names, so they never meet the store's
EFFECT_PREFIX = "e_"


def _typed(column: Any, name: str | None = None) -> BindParameter[Any]:
    """A parameter named ``name`` (default: the column's name) of the column's type."""
    return bindparam(name or column.name, type_=column.type)


# the operation row as the core's Record reads it
_RECORD = [
    operations.c[name]
    for name in (
        "id",
        "binding_generation",
        "request_fingerprint",
        "bound_principal_id",
        "bound_credential_generation",
        "state",
        "revision",
        "fencing_token",
        "lease_expires_at",
        "result_status",
        "result_content_type",
        "result_body",
        "result_digest",
        "conflict",
    )
]
# the columns a Record determines, named as rows.record_values names them: the parameters
# of the row a write leaves
ROW_COLUMNS = tuple(column.name for column in _RECORD[1:])
_SCOPE = ("tenant", "principal_id", "route", "idempotency_key")


# the tenant every statement pins (the scope's own, a parameter)
_TENANT = _typed(operations.c.tenant)


def _scope_is_given(table: Any) -> ColumnElement[bool]:
    return and_(*(table.c[name] == _typed(operations.c[name]) for name in _SCOPE))


_PRINCIPAL = ("id", "tenant", "name", "role", "key_hash", "credential_generation", "all_tenants")
_TOMBSTONE = ("operation_id", "request_fingerprint", "final_state", "expired_at", "forget_at")


def _same_scope(table: Any, *more: ColumnElement[bool]) -> ColumnElement[bool]:
    """``table``'s row of the caller's scope: its principal's, at the route and key given,
    in the tenant given."""
    return and_(
        table.c.tenant == _TENANT,
        table.c.principal_id == principals.c.id,
        table.c.route == _typed(operations.c.route),
        table.c.idempotency_key == _typed(operations.c.idempotency_key),
        *more,
    )


# the request's clock: a new row's created_at, the moment a tombstone is judged at
_NOW = bindparam("now", type_=DateTime(timezone=True))
# Whether a tombstone still stands at ``now``: the schema's function (migration 0011), which
# the claim's trigger asks too
_STANDS = func.tombstone_stands(tombstones.c.forget_at, _NOW)


IDENTIFY = Prepared(
    select(
        *(principals.c[name].label(f"p_{name}") for name in _PRINCIPAL),
        *_RECORD,
        *(tombstones.c[name].label(f"t_{name}") for name in _TOMBSTONE),
    )
    .select_from(
        principals.outerjoin(operations, _same_scope(operations)).outerjoin(
            tombstones, _same_scope(tombstones, _STANDS)
        )
    )
    .where(
        principals.c.key_hash == _typed(principals.c.key_hash),
        principals.c.revoked_at.is_(None),
        principals.c.tenant == _TENANT,
    )
)

# the tenant of a live principal's key: what IDENTIFY is given, looked up once per key
TENANT_OF = Prepared(
    select(principals.c.tenant).where(
        principals.c.key_hash == _typed(principals.c.key_hash),
        principals.c.revoked_at.is_(None),
    )
)

LOCK = Prepared(
    select(*_RECORD)
    .where(operations.c.id == _typed(operations.c.id), operations.c.tenant == _TENANT)
    .with_for_update()
)

# the scope's row, no lock (a 409's re-read, Prefer: wait's)
BY_SCOPE = Prepared(select(*_RECORD).where(_scope_is_given(operations)))

# the attempt's own parameters (the row's columns of the same names are the operation's)
_ATTEMPT_ID = _typed(attempts.c.id, "attempt_id")
_LEASE_TOKEN = _typed(attempts.c.lease_token)


def _operation_insert(*, settled: bool) -> Any:
    """The insert of a scope's new row: as claimed (``in_progress``), or already settled
    (with its result and ``expires_at``); None of it when another claimer's row exists."""
    # the request the fingerprint covers is written where the fingerprint first is
    names = ["id", *_SCOPE, *ROW_COLUMNS, "canonical_request"]
    if not settled:
        names = [name for name in names if not name.startswith(("result_", "conflict"))]
    values: dict[str, Any] = {name: _typed(operations.c[name]) for name in names}
    values.update(current_attempt_id=_ATTEMPT_ID, created_at=_NOW, updated_at=_NOW)
    if settled:
        values["expires_at"] = _typed(operations.c.expires_at)
    return values


# an attempt's row as it begins; its tenant is its operation's, as the insert of the row
# returns it (every insert into a tenant's table sets ``tenant``: docs/scaling.md)
_ATTEMPT_BEGUN: tuple[str, ...] = ("id", "operation_id", "fencing_token", "binding_generation")
_ATTEMPT_BEGUN += ("lease_token", "lease_expires_at", "started_at", "tenant")

CLAIM_NEW = Prepared(
    insert(attempts)
    .from_select(
        list(_ATTEMPT_BEGUN),
        select(
            _ATTEMPT_ID,
            (
                claimed := pg_insert(operations)
                .values(_operation_insert(settled=False))
                .on_conflict_do_nothing(constraint="uq_operations_scope")
                .returning(operations.c.id, operations.c.tenant)
                .cte("claimed")
            ).c.id,
            _typed(operations.c.fencing_token),
            _typed(operations.c.binding_generation),
            _LEASE_TOKEN,
            _typed(operations.c.lease_expires_at),
            _NOW,
            claimed.c.tenant,
        ),
    )
    .returning(attempts.c.operation_id)
)


def _recorded_alone() -> Select[Any]:
    """An observation the core did not apply, recorded under the row's lock: the row is
    not written (revision before = after), and the attempt ends with the decision's reason."""
    recorded = (
        insert(observations)
        .values(
            {"tenant": _TENANT, "operation_id": _typed(operations.c.id)}
            | {name: _typed(observations.c[name], f"o_{name}") for name in OBSERVATION_COLUMNS}
            | {
                "revision_before": _typed(observations.c.revision_before, "revision"),
                "revision_after": _typed(observations.c.revision_after, "revision"),
                "attempt_id": _ATTEMPT_ID,
            }
        )
        .returning(observations.c.id)
        .cte("recorded")
    )
    closed = (
        update(attempts)
        .where(attempts.c.id == _ATTEMPT_ID, attempts.c.tenant == _TENANT)
        .values(
            finished_at=_NOW,
            outcome=_typed(attempts.c.outcome, "o_kind"),
            response_status=_typed(attempts.c.response_status, "o_result_status"),
            error=_typed(attempts.c.error, "o_reason"),
        )
        .cte("closed")
    )
    return select(recorded.c.id.label("observation_id")).add_cte(closed)


def _written_exists(written: CTE) -> ColumnElement[bool]:
    return exists(select(written.c.id))


# the observation's columns a write records, as rows.observation_values names them; each a
# parameter "o_<column>"
OBSERVATION_COLUMNS: tuple[str, ...] = ("source", "kind", "binding_generation", "verified")
OBSERVATION_COLUMNS += ("request_fingerprint", "fencing_token", "result_status", "result_digest")
OBSERVATION_COLUMNS += ("lease_expires_at", "stage", "disposition", "reason")


# an observation the core did not apply, and the attempt's end (:func:`_recorded_alone`):
# ``id``, ``revision`` (the row's, unchanged), ``now``, ``attempt_id``, ``o_<column>``
RECORD_ALONE = Prepared(_recorded_alone())


def _recorded(written: CTE) -> CTE:
    """The observation, inserted when ``written`` wrote the row (it returns the row's id and
    tenant): revision before (the CAS's) and after (the row's)."""
    return (
        insert(observations)
        .from_select(
            [
                "tenant",
                "operation_id",
                *OBSERVATION_COLUMNS,
                "revision_before",
                "revision_after",
                "attempt_id",
            ],
            select(
                written.c.tenant,
                written.c.id,
                *(_typed(observations.c[name], f"o_{name}") for name in OBSERVATION_COLUMNS),
                _typed(observations.c.revision_before, "expected_revision"),
                _typed(observations.c.revision_after, "revision"),
                _ATTEMPT_ID,
            ),
        )
        .returning(observations.c.id)
        .cte("recorded")
    )


def _answer(verdict: CTE, recorded: CTE, *writes: CTE) -> Select[Any]:
    """What each statement answers: the observation's id, the guard's refusal."""
    return select(
        select(recorded.c.id).scalar_subquery().label("observation_id"),
        select(verdict.c.refusal).scalar_subquery().label("refusal"),
    ).add_cte(*writes)


def effect_ok_of(verdict: CTE) -> CTE:
    """The guard's verdict when it lets the effect through: one row, or none."""
    return select(verdict).where(verdict.c.refusal.is_(None)).cte("effect_ok")


def _finish(effect: EffectSql) -> Select[Any]:
    verdict = effect.guard()
    effect_ok = effect_ok_of(verdict)
    written = (
        update(operations)
        .where(
            operations.c.id == _typed(operations.c.id),
            operations.c.tenant == _TENANT,
            operations.c.request_fingerprint
            == _typed(operations.c.request_fingerprint, "expected_fingerprint"),
            operations.c.binding_generation
            == _typed(operations.c.binding_generation, "expected_generation"),
            operations.c.revision == _typed(operations.c.revision, "expected_revision"),
            exists(select(effect_ok)),
        )
        .values(
            {name: _typed(operations.c[name]) for name in ROW_COLUMNS}
            | {
                "updated_at": _NOW,
                "expires_at": func.coalesce(
                    _typed(operations.c.expires_at), operations.c.expires_at
                ),
            }
        )
        .returning(operations.c.id, operations.c.tenant)
        .cte("written")
    )
    recorded = _recorded(written)
    closed = (
        update(attempts)
        .where(attempts.c.id == _ATTEMPT_ID, attempts.c.tenant == _TENANT, _written_exists(written))
        .values(
            finished_at=_NOW,
            outcome=_typed(attempts.c.outcome, "o_kind"),
            response_status=_typed(attempts.c.response_status, "o_result_status"),
        )
        .cte("closed")
    )
    return _answer(verdict, recorded, *_writes(effect, verdict, written, effect_ok), closed)


def _claim_settle(effect: EffectSql) -> Select[Any]:
    verdict = effect.guard()
    effect_ok = effect_ok_of(verdict)
    values = _operation_insert(settled=True)
    written = (
        pg_insert(operations)
        .from_select(list(values), select(*values.values()).where(exists(select(effect_ok))))
        .on_conflict_do_nothing(constraint="uq_operations_scope")
        .returning(operations.c.id, operations.c.tenant)
        .cte("written")
    )
    begun = (
        insert(attempts)
        .from_select(
            [*_ATTEMPT_BEGUN, "finished_at", "outcome", "response_status"],
            select(
                _ATTEMPT_ID,
                written.c.id,
                _typed(attempts.c.fencing_token, "attempt_fencing_token"),
                _typed(attempts.c.binding_generation, "attempt_generation"),
                _LEASE_TOKEN,
                _typed(attempts.c.lease_expires_at, "attempt_lease_expires_at"),
                _NOW,
                written.c.tenant,
                _NOW,
                _typed(attempts.c.outcome, "o_kind"),
                _typed(attempts.c.response_status, "o_result_status"),
            ),
        )
        .cte("begun")
    )
    recorded = _recorded(written)
    return _answer(verdict, recorded, *_writes(effect, verdict, written, effect_ok), begun)


@functools.cache
def finish_with(effect: EffectSql) -> Prepared:
    """The finishing statement carrying ``effect``: its guard gates the CAS, the CAS gates
    its writes. Parameters: the row as read (``id``, ``expected_fingerprint``,
    ``expected_generation``, ``expected_revision``), the row as written (:data:`ROW_COLUMNS`,
    ``expires_at``: NULL keeps it), ``now``, the observation (``o_<column>``),
    ``attempt_id``, and the effect's."""
    return Prepared(_finish(effect))


@functools.cache
def claim_settle_with(effect: EffectSql) -> Prepared:
    """The one statement of a new operation carrying ``effect``: its guard gates the insert
    of the settled row, the insert gates its writes. Parameters: the row (``id``, the
    scope's columns, :data:`ROW_COLUMNS`, ``expires_at``), ``now``, the attempt
    (``attempt_id``, ``lease_token``, ``attempt_fencing_token``, ``attempt_generation``,
    ``attempt_lease_expires_at``), the observation (``o_<column>``, ``expected_revision``),
    and the effect's."""
    return Prepared(_claim_settle(effect))


def _nothing(written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
    return ()


NO_EFFECT = EffectSql("no-effect", guard=never_refused, apply=_nothing)


def _writes(effect: EffectSql, verdict: CTE, written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
    """The effect's writes, once every parameter the effect brings (its guard's, its
    writes') is named ``e_...``: a name of the store's would silently take the store's
    value."""
    writes = tuple(effect.apply(written, effect_ok))
    store = _binds(written)  # the store's, and (through effect_ok) the guard's
    own = _binds(verdict) | {bind for bind in _binds(*writes) if bind not in store}
    strays = sorted({bind.key for bind in own if not bind.key.startswith(EFFECT_PREFIX)})
    if strays:
        raise ValueError(f"effect {effect.name}: parameters {strays} must be named e_...")
    return writes


def _binds(*elements: Any) -> set[BindParameter[Any]]:
    return {
        node
        for element in elements
        for node in visitors.iterate(element)
        if isinstance(node, BindParameter)
    }
