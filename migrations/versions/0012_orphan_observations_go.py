"""observations about an operation that was never here are found for the retention purge

An observer's evidence, or a feed event past its grace, about an operation that is not here
is recorded as a quarantined ``unknown-operation`` observation. Nothing ever deleted these:
the purge deletes observations with their operation or its tombstone, and these have
neither. A partial index finds them oldest first; every other observation (one per
settlement, the bulk) never enters it. It is built concurrently: a server still running
the previous revision keeps writing observations meanwhile.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNKNOWN = sa.text("reason = 'unknown-operation'")


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_observations_unknown_operation_created_at",
            "observations",
            ["created_at"],
            unique=False,
            postgresql_where=UNKNOWN,
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_observations_unknown_operation_created_at",
            table_name="observations",
            postgresql_where=UNKNOWN,
            postgresql_concurrently=True,
        )
