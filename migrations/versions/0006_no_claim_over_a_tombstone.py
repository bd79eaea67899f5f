"""a new operation is never inserted under a key whose tombstone stands

Every claim checks the scope's tombstone before it inserts, but in its statement's snapshot.
A claim whose insert found the scope's row being purged waited for the purge, then inserted
into the scope the purge had just freed: the tombstone, committed with the delete, was not in
its snapshot. This trigger checks again after the insert, in a snapshot of its own (a
VOLATILE function's query takes one), so it sees every tombstone committed by then and fails
the statement with SQLSTATE SK410; the store answers that as the key's expiry (410).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 16:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
CREATE FUNCTION operations_not_tombstoned() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    expired uuid;
BEGIN
    SELECT t.operation_id INTO expired FROM tombstones t
     WHERE t.tenant = NEW.tenant AND t.principal_id = NEW.principal_id
       AND t.route = NEW.route AND t.idempotency_key = NEW.idempotency_key
       AND t.forget_at > NEW.created_at;
    IF FOUND THEN
        RAISE EXCEPTION 'operation % expired; its key cannot be used again yet', expired
              USING ERRCODE = 'SK410', DETAIL = expired::text;
    END IF;
    RETURN NULL;
END
$$
"""
    )
    op.execute(
        """
CREATE TRIGGER operations_not_tombstoned AFTER INSERT ON operations
   FOR EACH ROW EXECUTE FUNCTION operations_not_tombstoned()
"""
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER operations_not_tombstoned ON operations")
    op.execute("DROP FUNCTION operations_not_tombstoned()")
