"""whether a tombstone still stands is one SQL function, used by the claim's trigger and by
the read of a request's scope

A tombstone stands (its key answers 410 and nothing may be claimed under it) until its
``forget_at``. The rule was written twice: in the trigger of 0006 and in Python, where a
request that found no row but a tombstone answered 410 before it took a lease. Both now ask
``tombstone_stands(forget_at, at)``: the trigger at the new row's ``created_at``, the read of
the scope (``service.store.hot_sql.IDENTIFY``) at the request's clock. The function is
IMMUTABLE SQL, so PostgreSQL inlines it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 18:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGER = """
CREATE OR REPLACE FUNCTION operations_not_tombstoned() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    expired uuid;
BEGIN
    SELECT t.operation_id INTO expired FROM tombstones t
     WHERE t.tenant = NEW.tenant AND t.principal_id = NEW.principal_id
       AND t.route = NEW.route AND t.idempotency_key = NEW.idempotency_key
       AND {stands};
    IF FOUND THEN
        RAISE EXCEPTION 'operation % expired; its key cannot be used again yet', expired
              USING ERRCODE = 'SK410', DETAIL = expired::text;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(
        """
CREATE FUNCTION tombstone_stands(forget_at timestamptz, at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT forget_at > at $$
"""
    )
    op.execute(_TRIGGER.format(stands="tombstone_stands(t.forget_at, NEW.created_at)"))


def downgrade() -> None:
    op.execute(_TRIGGER.format(stands="t.forget_at > NEW.created_at"))
    op.execute("DROP FUNCTION tombstone_stands(timestamptz, timestamptz)")
