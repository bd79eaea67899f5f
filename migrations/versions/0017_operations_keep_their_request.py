"""operations keep their request: what the fingerprint covers, to show what was asked

``operations.canonical_request`` holds the canonical JSON text the request fingerprint is
the SHA-256 of (service.evidence.canonical_request), written by the statements that write
the fingerprint (a claim's insert, a supersede that edits the request). The column is
nullable with no default, so adding it rewrites nothing and takes the table's lock for a
moment only; rows claimed before stay NULL ("request not recorded"). A server still on the
previous revision keeps working: it never names the column, and its inserts leave it NULL.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 06:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# as service.store.tables.CANONICAL_REQUEST_COMMENT says it (a migration keeps its own copy)
COMMENT = (
    "What the request fingerprint covers (SHA-256 of this text): canonical JSON of the route, "
    "path parameters and decoded body (service.evidence.canonical_request). Bounded by the "
    "request body limit (SETTLEMENT_BODY_LIMIT, 1 MiB by default); the routes' schemas keep "
    "it near 200 bytes plus a memo. NULL: claimed before migration 0017."
)


def upgrade() -> None:
    op.add_column(
        "operations", sa.Column("canonical_request", sa.Text(), nullable=True, comment=COMMENT)
    )


def downgrade() -> None:
    op.drop_column("operations", "canonical_request")
