"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 13:53:01.582472
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "observations",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("binding_generation", sa.Integer(), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("result_status", sa.Integer(), nullable=True),
        sa.Column("result_digest", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stage", sa.String(length=1), nullable=False),
        sa.Column("disposition", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("revision_before", sa.BigInteger(), nullable=True),
        sa.Column("revision_after", sa.BigInteger(), nullable=True),
        sa.Column("attempt_id", sa.UUID(), nullable=True),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "disposition IN ('applied', 'strengthened', 'ignored', 'quarantined', 'conflict')",
            name=op.f("ck_observations_disposition"),
        ),
        sa.CheckConstraint(
            "kind IN ('in_progress', 'unknown', 'completed', 'failed')",
            name=op.f("ck_observations_kind"),
        ),
        sa.CheckConstraint(
            "source IN ('attempt', 'late_response', 'evidence', 'feed', 'sweeper', 'claim', 'admin')",
            name=op.f("ck_observations_source"),
        ),
        sa.CheckConstraint("stage IN ('A', 'B', 'C')", name=op.f("ck_observations_stage")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_observations")),
    )
    op.create_index(
        op.f("ix_observations_operation_id"), "observations", ["operation_id"], unique=False
    )
    op.create_table(
        "principals",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.LargeBinary(length=32), nullable=False),
        sa.Column(
            "credential_generation", sa.Integer(), server_default=sa.text("1"), nullable=False
        ),
        sa.Column("all_tenants", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "NOT all_tenants OR role = 'admin'", name=op.f("ck_principals_all_tenants_admin")
        ),
        sa.CheckConstraint(
            "role IN ('client', 'observer', 'admin')", name=op.f("ck_principals_role")
        ),
        sa.CheckConstraint(
            "credential_generation >= 1", name=op.f("ck_principals_credential_generation")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_principals")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_principals_key_hash")),
        sa.UniqueConstraint("tenant", "name", name=op.f("uq_principals_tenant_name")),
    )
    op.create_table(
        "tombstones",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("principal_id", sa.UUID(), nullable=False),
        sa.Column("route", sa.String(length=256), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=False),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("forget_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant", "principal_id", "route", "idempotency_key", name=op.f("pk_tombstones")
        ),
    )
    op.create_index(op.f("ix_tombstones_forget_at"), "tombstones", ["forget_at"], unique=False)
    op.create_table(
        "operations",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("principal_id", sa.UUID(), nullable=False),
        sa.Column("route", sa.String(length=256), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("binding_generation", sa.Integer(), nullable=False),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("bound_principal_id", sa.UUID(), nullable=False),
        sa.Column("bound_credential_generation", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("current_attempt_id", sa.UUID(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result_status", sa.Integer(), nullable=True),
        sa.Column("result_content_type", sa.String(length=255), nullable=True),
        sa.Column("result_body", sa.LargeBinary(), nullable=True),
        sa.Column("result_digest", sa.String(length=64), nullable=True),
        sa.Column("conflict", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state <> 'conflict' OR conflict IS NOT NULL",
            name=op.f("ck_operations_conflict_recorded"),
        ),
        sa.CheckConstraint(
            "state IN ('in_progress', 'unknown', 'completed', 'failed', 'conflict')",
            name=op.f("ck_operations_state"),
        ),
        sa.CheckConstraint(
            "state NOT IN ('completed', 'failed', 'conflict') OR (result_status IS NOT NULL AND result_digest IS NOT NULL AND result_content_type IS NOT NULL AND result_body IS NOT NULL)",
            name=op.f("ck_operations_terminal_has_result"),
        ),
        sa.CheckConstraint(
            "binding_generation >= 1", name=op.f("ck_operations_binding_generation")
        ),
        sa.CheckConstraint("fencing_token >= 1", name=op.f("ck_operations_fencing_token")),
        sa.CheckConstraint(
            "result_status IS NULL OR result_status BETWEEN 100 AND 599",
            name=op.f("ck_operations_result_status"),
        ),
        sa.CheckConstraint("revision >= 1", name=op.f("ck_operations_revision")),
        sa.ForeignKeyConstraint(
            ["bound_principal_id"],
            ["principals.id"],
            name=op.f("fk_operations_bound_principal_id_principals"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["principal_id"],
            ["principals.id"],
            name=op.f("fk_operations_principal_id_principals"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operations")),
        sa.UniqueConstraint(
            "tenant", "principal_id", "route", "idempotency_key", name="uq_operations_scope"
        ),
    )
    op.create_index(
        "ix_operations_in_progress_lease",
        "operations",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'in_progress'"),
    )
    op.create_index("ix_operations_tenant_state", "operations", ["tenant", "state"], unique=False)
    op.create_table(
        "accounts",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("balance", sa.BigInteger(), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_accounts_currency")),
        sa.CheckConstraint("balance >= 0", name=op.f("ck_accounts_balance_non_negative")),
        sa.ForeignKeyConstraint(
            ["operation_id"], ["operations.id"], name=op.f("fk_accounts_operation_id_operations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
        sa.UniqueConstraint("operation_id", name=op.f("uq_accounts_operation_id")),
    )
    op.create_index(op.f("ix_accounts_tenant"), "accounts", ["tenant"], unique=False)
    op.create_table(
        "attempts",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("binding_generation", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('in_progress', 'unknown', 'completed', 'failed')",
            name=op.f("ck_attempts_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["operations.id"],
            name=op.f("fk_attempts_operation_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint(
            "operation_id", "fencing_token", name=op.f("uq_attempts_operation_id_fencing_token")
        ),
    )
    op.create_table(
        "operation_epochs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=False),
        sa.Column("binding_generation", sa.Integer(), nullable=False),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("bound_principal_id", sa.UUID(), nullable=False),
        sa.Column("bound_credential_generation", sa.Integer(), nullable=False),
        sa.Column("final_state", sa.String(length=16), nullable=False),
        sa.Column("result_digest", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("superseded_by", sa.UUID(), nullable=True),
        sa.Column(
            "superseded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "final_state IN ('in_progress', 'unknown', 'completed', 'failed', 'conflict')",
            name=op.f("ck_operation_epochs_final_state"),
        ),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["operations.id"],
            name=op.f("fk_operation_epochs_operation_id_operations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["superseded_by"],
            ["principals.id"],
            name=op.f("fk_operation_epochs_superseded_by_principals"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operation_epochs")),
        sa.UniqueConstraint(
            "operation_id",
            "binding_generation",
            name=op.f("uq_operation_epochs_operation_id_binding_generation"),
        ),
    )
    op.create_table(
        "transfers",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("operation_id", sa.UUID(), nullable=False),
        sa.Column("source_id", sa.UUID(), nullable=False),
        sa.Column("destination_id", sa.UUID(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("memo", sa.String(length=512), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_transfers_currency")),
        sa.CheckConstraint("amount > 0", name=op.f("ck_transfers_amount_positive")),
        sa.CheckConstraint(
            "source_id <> destination_id", name=op.f("ck_transfers_distinct_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["destination_id"], ["accounts.id"], name=op.f("fk_transfers_destination_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["operation_id"], ["operations.id"], name=op.f("fk_transfers_operation_id_operations")
        ),
        sa.ForeignKeyConstraint(
            ["source_id"], ["accounts.id"], name=op.f("fk_transfers_source_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transfers")),
        sa.UniqueConstraint("operation_id", name=op.f("uq_transfers_operation_id")),
    )


def downgrade() -> None:
    op.drop_table("transfers")
    op.drop_table("operation_epochs")
    op.drop_table("attempts")
    op.drop_index(op.f("ix_accounts_tenant"), table_name="accounts")
    op.drop_table("accounts")
    op.drop_index("ix_operations_tenant_state", table_name="operations")
    op.drop_index(
        "ix_operations_in_progress_lease",
        table_name="operations",
        postgresql_where=sa.text("state = 'in_progress'"),
    )
    op.drop_table("operations")
    op.drop_index(op.f("ix_tombstones_forget_at"), table_name="tombstones")
    op.drop_table("tombstones")
    op.drop_table("principals")
    op.drop_index(op.f("ix_observations_operation_id"), table_name="observations")
    op.drop_table("observations")
