"""The schema as SQLAlchemy Core tables: the one source the migrations are checked against.

A test compares the whole schema (these and an effect's own, ``service.app.routes.SCHEMA``)
with the migrated database, so the two never drift.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.sql.elements import BindParameter

__all__ = [
    "CITUS_KINDS",
    "OPERATION_STATES",
    "accounts",
    "attempts",
    "citus",
    "console_sessions",
    "inline",
    "metadata",
    "observations",
    "one_of",
    "operation_epochs",
    "operations",
    "principals",
    "tombstones",
    "transfers",
]


def inline(value: str) -> BindParameter[str]:
    """``value`` written into the statement's text, not sent as a parameter: a generic plan
    (``plan_cache_mode``, :func:`service.store.db.server_settings`) cannot prove a partial
    index's predicate (``state = 'in_progress'``) from ``state = $1``: a sweep would read
    the whole table. Each state filtered on where a partial index names it is inline."""
    return literal(value, literal_execute=True)


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

# Each table's kind on Citus (docs/scaling.md), in ``Table(..., info=...)``: distributed by
# its ``tenant`` column, a reference table (a copy on every node) or local to the
# coordinator. tests/citus_rules.py checks every table has one and the keys it implies.
CITUS_KINDS = ("distributed", "reference", "local")


def citus(kind: str) -> dict[str, str]:
    """A table's ``info`` naming its kind on Citus (one of :data:`CITUS_KINDS`)."""
    if kind not in CITUS_KINDS:
        raise ValueError(f"not a Citus table kind: {kind!r}")
    return {"citus": kind}


OPERATION_STATES = ("in_progress", "unknown", "completed", "failed", "conflict")
OBSERVATION_KINDS = ("in_progress", "unknown", "completed", "failed")
OBSERVATION_SOURCES = ("attempt", "late_response", "evidence", "feed", "sweeper", "claim", "admin")
DISPOSITIONS = ("applied", "strengthened", "ignored", "quarantined", "conflict")
ROLES = ("client", "observer", "admin")


def one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _now() -> Column[object]:
    return Column(
        "created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
    )


principals = Table(
    "principals",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("name", String(256), nullable=False),
    Column("role", String(16), nullable=False),
    Column("key_hash", LargeBinary(32), nullable=False, unique=True),
    Column("credential_generation", Integer, nullable=False, server_default=text("1")),
    Column("all_tenants", Boolean, nullable=False, server_default=text("false")),
    _now(),
    Column("revoked_at", DateTime(timezone=True)),
    CheckConstraint(one_of("role", ROLES), name="role"),
    CheckConstraint("credential_generation >= 1", name="credential_generation"),
    CheckConstraint("NOT all_tenants OR role = 'admin'", name="all_tenants_admin"),
    UniqueConstraint("tenant", "name"),
    info=citus("reference"),
)

# The database's own word on operations.canonical_request (migration 0017 sets it too).
CANONICAL_REQUEST_COMMENT = (
    "What the request fingerprint covers (SHA-256 of this text): canonical JSON of the route, "
    "path parameters and decoded body (service.evidence.canonical_request). Bounded by the "
    "request body limit (SETTLEMENT_BODY_LIMIT, 1 MiB by default); the routes' schemas keep "
    "it near 200 bytes plus a memo. NULL: claimed before migration 0017."
)

operations = Table(
    "operations",
    metadata,
    Column("id", UUID(as_uuid=True), nullable=False),
    # scope: (tenant, principal, route, key)
    Column("tenant", String(128), nullable=False),
    Column(
        "principal_id",
        UUID(as_uuid=True),
        ForeignKey("principals.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    Column("route", String(256), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    # reservation tuple (with id) and binding
    Column("binding_generation", Integer, nullable=False),
    Column("request_fingerprint", String(64), nullable=False),
    # what the fingerprint covers (service.evidence.canonical_request), written with it;
    # NULL on rows claimed before migration 0017
    Column("canonical_request", Text, comment=CANONICAL_REQUEST_COMMENT),
    Column(
        "bound_principal_id",
        UUID(as_uuid=True),
        ForeignKey("principals.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    Column("bound_credential_generation", Integer, nullable=False),
    # authoritative state
    Column("state", String(16), nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    # no foreign key: attempts reference operations, and the row is written before its attempt
    Column("current_attempt_id", UUID(as_uuid=True)),
    Column("lease_expires_at", DateTime(timezone=True)),
    # stored outcome
    Column("result_status", Integer),
    Column("result_content_type", String(255)),
    Column("result_body", LargeBinary),
    Column("result_digest", String(64)),
    Column("conflict", JSONB(none_as_null=True)),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("tenant", "id"),
    UniqueConstraint(
        "tenant", "principal_id", "route", "idempotency_key", name="uq_operations_scope"
    ),
    CheckConstraint(one_of("state", OPERATION_STATES), name="state"),
    CheckConstraint("binding_generation >= 1", name="binding_generation"),
    CheckConstraint("revision >= 1", name="revision"),
    CheckConstraint("fencing_token >= 1", name="fencing_token"),
    CheckConstraint(
        "state NOT IN ('completed', 'failed', 'conflict') OR "
        "(result_status IS NOT NULL AND result_digest IS NOT NULL "
        "AND result_content_type IS NOT NULL AND result_body IS NOT NULL)",
        name="terminal_has_result",
    ),
    CheckConstraint("state <> 'conflict' OR conflict IS NOT NULL", name="conflict_recorded"),
    CheckConstraint(
        "result_status IS NULL OR result_status BETWEEN 100 AND 599", name="result_status"
    ),
    info=citus("distributed"),
)

# Every key of a distributed table starts with its tenant (docs/scaling.md, "Keys"); a plain
# index on ``id`` (or ``operation_id``) alone serves the statements that still look a row up
# without its tenant (a server on migration 0017's code while 0018 runs, and the statements
# not yet pinned): a later migration drops them once every statement pins its tenant.
Index("ix_operations_id", operations.c.id)
Index(
    "ix_operations_in_progress_lease",
    operations.c.lease_expires_at,
    postgresql_where=text("state = 'in_progress'"),
)
# the work list: open operations of a tenant in one state, oldest first (terminal rows, the
# bulk, never enter it: a completed operation costs this index nothing)
Index(
    "ix_operations_open_tenant_state",
    operations.c.tenant,
    operations.c.state,
    operations.c.created_at,
    postgresql_where=text("state IN ('in_progress', 'unknown', 'conflict')"),
)
# the oldest operation not settled for good (a metric): a small index, these rows are few
Index(
    "ix_operations_open_created_at",
    operations.c.created_at,
    postgresql_where=text("state IN ('in_progress', 'unknown', 'conflict')"),
)
# what the retention purge reads: terminal rows that may expire, oldest first
Index(
    "ix_operations_purgeable_expires_at",
    operations.c.expires_at,
    postgresql_where=text("state IN ('completed', 'failed')"),
)

operation_epochs = Table(
    "operation_epochs",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("operation_id", UUID(as_uuid=True), nullable=False, index=True),
    Column("binding_generation", Integer, nullable=False),
    Column("request_fingerprint", String(64), nullable=False),
    Column("bound_principal_id", UUID(as_uuid=True), nullable=False),
    Column("bound_credential_generation", Integer, nullable=False),
    Column("final_state", String(16), nullable=False),
    Column("result_digest", String(64)),
    Column("reason", Text, nullable=False),
    Column("superseded_by", UUID(as_uuid=True), ForeignKey("principals.id")),
    Column("superseded_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("tenant", "id"),
    UniqueConstraint("tenant", "operation_id", "binding_generation"),
    ForeignKeyConstraint(
        ["tenant", "operation_id"], ["operations.tenant", "operations.id"], ondelete="CASCADE"
    ),
    CheckConstraint(one_of("final_state", OPERATION_STATES), name="final_state"),
    info=citus("distributed"),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", UUID(as_uuid=True), nullable=False, index=True),
    Column("tenant", String(128), nullable=False),
    Column("operation_id", UUID(as_uuid=True), nullable=False, index=True),
    Column("fencing_token", BigInteger, nullable=False),
    Column("binding_generation", Integer, nullable=False),
    Column("lease_token", String(64)),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("outcome", String(16)),
    Column("response_status", Integer),
    Column("error", Text),
    PrimaryKeyConstraint("tenant", "id"),
    UniqueConstraint("tenant", "operation_id", "fencing_token"),
    ForeignKeyConstraint(
        ["tenant", "operation_id"], ["operations.tenant", "operations.id"], ondelete="CASCADE"
    ),
    CheckConstraint("outcome IS NULL OR " + one_of("outcome", OBSERVATION_KINDS), name="outcome"),
    info=citus("distributed"),
)

observations = Table(
    "observations",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    # the operation's tenant; about no operation here: the observer's (app.evidence)
    Column("tenant", String(128), nullable=False),
    # no foreign key: unknown operations' are kept too; null: refused evidence (app.evidence)
    Column("operation_id", UUID(as_uuid=True), index=True),
    Column("source", String(16), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("binding_generation", Integer),
    Column("request_fingerprint", String(64)),
    Column("fencing_token", BigInteger),
    Column("verified", Boolean, nullable=False),
    Column("result_status", Integer),
    Column("result_digest", String(64)),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("stage", String(1), nullable=False),
    Column("disposition", String(16), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("revision_before", BigInteger),
    Column("revision_after", BigInteger),
    Column("attempt_id", UUID(as_uuid=True)),
    Column("detail", JSONB(none_as_null=True)),
    _now(),
    PrimaryKeyConstraint("tenant", "id"),
    CheckConstraint(one_of("source", OBSERVATION_SOURCES), name="source"),
    CheckConstraint(one_of("kind", OBSERVATION_KINDS), name="kind"),
    CheckConstraint("stage IN ('A', 'B', 'C')", name="stage"),
    CheckConstraint(one_of("disposition", DISPOSITIONS), name="disposition"),
    info=citus("distributed"),
)

# what the retention purge reads: observations about an operation that was never here, oldest
# first (the observations of every settlement, the bulk, never enter it)
Index(
    "ix_observations_unknown_operation_created_at",
    observations.c.created_at,
    postgresql_where=text("reason = 'unknown-operation'"),
)
# one observer's quarantined evidence by time: the intake's cap (service.app.evidence)
Index(
    "ix_observations_quarantined_evidence_by_principal",
    text("(detail ->> 'principal_id')"),
    observations.c.created_at,
    postgresql_where=text("source = 'evidence' AND disposition = 'quarantined'"),
)

tombstones = Table(
    "tombstones",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("principal_id", UUID(as_uuid=True), primary_key=True),
    Column("route", String(256), primary_key=True),
    Column("idempotency_key", String(255), primary_key=True),
    Column("operation_id", UUID(as_uuid=True), nullable=False, index=True),
    Column("request_fingerprint", String(64), nullable=False),
    # the operation's terminal state when it was purged (completed or failed)
    Column("final_state", String(16), nullable=False, server_default=text("'completed'")),
    Column("expired_at", DateTime(timezone=True), nullable=False),
    Column("forget_at", DateTime(timezone=True), nullable=False, index=True),
    CheckConstraint("final_state IN ('completed', 'failed')", name="final_state"),
    info=citus("distributed"),
)

accounts = Table(
    "accounts",
    metadata,
    Column("id", UUID(as_uuid=True), nullable=False, index=True),
    Column("tenant", String(128), nullable=False, index=True),
    Column("currency", String(3), nullable=False),
    Column("balance", BigInteger, nullable=False),
    # the operation that opened it; kept after retention purges the operation (no foreign key)
    Column("operation_id", UUID(as_uuid=True)),
    # the reservation epoch that opened it: one account per operation and epoch
    Column("binding_generation", Integer, nullable=False, server_default=text("1")),
    _now(),
    PrimaryKeyConstraint("tenant", "id"),
    UniqueConstraint("tenant", "operation_id", "binding_generation"),
    CheckConstraint("balance >= 0", name="balance_non_negative"),
    CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency"),
    info=citus("distributed"),
)

transfers = Table(
    "transfers",
    metadata,
    Column("id", UUID(as_uuid=True), nullable=False),
    Column("tenant", String(128), nullable=False),
    # kept after retention purges the operation (its tombstone keeps the id): no foreign key
    Column("operation_id", UUID(as_uuid=True), nullable=False),
    # one transfer per operation and reservation epoch: a forced supersede may run it again
    Column("binding_generation", Integer, nullable=False, server_default=text("1")),
    Column("source_id", UUID(as_uuid=True), nullable=False),
    Column("destination_id", UUID(as_uuid=True), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("memo", String(512)),
    _now(),
    Column("refunded", BigInteger, nullable=False, server_default=text("0")),  # refunds' sum
    PrimaryKeyConstraint("tenant", "id"),
    UniqueConstraint("tenant", "operation_id", "binding_generation"),
    # named: both start with tenant, which the convention would name them by
    ForeignKeyConstraint(
        ["tenant", "source_id"],
        ["accounts.tenant", "accounts.id"],
        name="fk_transfers_source_id_accounts",
    ),
    ForeignKeyConstraint(
        ["tenant", "destination_id"],
        ["accounts.tenant", "accounts.id"],
        name="fk_transfers_destination_id_accounts",
    ),
    CheckConstraint("amount > 0", name="amount_positive"),
    CheckConstraint("refunded >= 0 AND refunded <= amount", name="refunded_within_amount"),
    CheckConstraint("source_id <> destination_id", name="distinct_accounts"),
    CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency"),
    info=citus("distributed"),
)


# An operator's console session (service/store/console_sessions.py): found by the SHA-256 of
# its random id; key_fingerprint (SHA-256 of the principal's key_hash at sign-in) stops
# matching when the key is rotated or revoked, which ends the session at once.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id_hash", LargeBinary(32), primary_key=True),
    Column(
        "principal_id",
        UUID(as_uuid=True),
        ForeignKey("principals.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("key_fingerprint", LargeBinary(32), nullable=False),
    Column("csrf_token", String(64), nullable=False),
    _now(),
    Column("expires_at", DateTime(timezone=True), nullable=False, index=True),
    info=citus("reference"),
)
