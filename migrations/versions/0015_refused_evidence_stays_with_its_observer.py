"""refused evidence stays with the observer that sent it, and is counted per observer

An observer's evidence that is refused as about no operation (unknown, another tenant's, or
not an external effect) was recorded under the operation id it named, so it was listed in
that operation's history, another tenant's too. It is now recorded without an operation id
(``operation_id`` may be null), kept only with the principal id that sent it, and goes with
the other orphans (``ix_observations_unknown_operation_created_at``). The rows already
written that way leave the operation they named: every ``unknown-operation`` evidence, and
unsigned evidence sent by a principal of another tenant than the operation's (each in a
statement of its own, after the schema change).

The intake refuses an observer that had too many of its evidence quarantined lately
(``SETTLEMENT_EVIDENCE_QUARANTINE_LIMIT`` within ``SETTLEMENT_EVIDENCE_QUARANTINE_WINDOW``):
a partial index finds one principal's quarantined evidence by time. It is built
concurrently: a server still running the previous revision keeps writing observations.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 00:45:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_observations_quarantined_evidence_by_principal"
QUARANTINED_EVIDENCE = sa.text("source = 'evidence' AND disposition = 'quarantined'")


# what an observer sent that named an operation it could not speak of
_UNTIE = [
    """UPDATE observations SET operation_id = NULL
        WHERE reason = 'unknown-operation' AND source = 'evidence'
          AND operation_id IS NOT NULL""",
    """UPDATE observations o SET operation_id = NULL, reason = 'unknown-operation'
         FROM operations op, principals p
        WHERE o.reason = 'unverified-evidence' AND o.source = 'evidence'
          AND op.id = o.operation_id
          AND p.id::text = o.detail ->> 'principal_id'
          AND p.tenant <> op.tenant""",
]


def upgrade() -> None:
    op.alter_column("observations", "operation_id", existing_type=sa.UUID(), nullable=True)
    with op.get_context().autocommit_block():
        for statement in _UNTIE:
            op.execute(statement)
        op.create_index(
            INDEX,
            "observations",
            [sa.text("(detail ->> 'principal_id')"), "created_at"],
            unique=False,
            postgresql_where=QUARANTINED_EVIDENCE,
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            INDEX,
            table_name="observations",
            postgresql_where=QUARANTINED_EVIDENCE,
            postgresql_concurrently=True,
        )
    # the orphans kept without an operation id cannot be listed under one: they go
    op.execute("DELETE FROM observations WHERE operation_id IS NULL")
    op.alter_column("observations", "operation_id", existing_type=sa.UUID(), nullable=False)
