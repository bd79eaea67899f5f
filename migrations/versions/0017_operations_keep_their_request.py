"""operations keep their request: what the fingerprint covers, to show what was asked

``operations.canonical_request`` holds the canonical JSON text the request fingerprint is
the SHA-256 of (service.evidence.canonical_request), written by the statements that write
the fingerprint (a claim's insert, a supersede that edits the request). The column is
nullable with no default, so adding it rewrites nothing; the table's lock is waited for
briefly and given way to (service.store.online_ddl.briefly), so a long reader never makes
every statement on operations queue behind the ALTER; rows claimed before stay NULL ("request not recorded"). A server still on the
previous revision keeps working: it never names the column, and its inserts leave it NULL.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 06:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from service.store.online_ddl import briefly

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
    with op.get_context().autocommit_block():
        briefly(
            op.get_bind(),
            ["operations"],
            [
                "ALTER TABLE operations ADD COLUMN canonical_request text",
                f"COMMENT ON COLUMN operations.canonical_request IS '{_quoted(COMMENT)}'",
            ],
        )


def downgrade() -> None:
    """Run only once no server of this revision runs: they write the column."""
    with op.get_context().autocommit_block():
        briefly(
            op.get_bind(),
            ["operations"],
            ["ALTER TABLE operations DROP COLUMN canonical_request"],
        )


def _quoted(text: str) -> str:
    return text.replace("'", "''")
