"""the tenant of an observation about no operation here, in one function both sides call

Migration 0018's ``tenant_of_operation(operation, detail)`` (called by its ``fill_tenant``
trigger) holds two rules: an observation's tenant is its operation's, else (an operation
that is not here) its observer's (``detail ->> 'principal_id'``), else ``''``. The server
now sets every observation's tenant itself: the operation's where it has it, and for an
operation that is not here the second rule, which it asks the database for
(``tenant_of_observer(detail)``, service.store.unit_of_work.observer_tenant) rather than keep
a copy of it. This migration makes that rule a function of its own, and
``tenant_of_operation`` calls it: the rule is written once, here, whether the server or the
trigger (a server of revision 0017, during a rolling deploy) applies it.

Nothing else changes: no table is touched, ``CREATE OR REPLACE`` swaps the function in
place (a trigger firing meanwhile runs one version or the other, which give the same
answer). A later migration may drop ``fill_tenant`` and ``tenant_of_operation`` once no
server of revision 0017 runs; ``tenant_of_observer`` stays.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 08:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The tenant of an observation about an operation that is not here: its observer's, else ''
# (reads principals, a reference table on Citus: no distributed table is read).
TENANT_OF_OBSERVER = """
CREATE FUNCTION tenant_of_observer(detail jsonb) RETURNS varchar
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT tenant FROM principals WHERE id = (detail ->> 'principal_id')::uuid),
        ''
    )
$$
"""

TENANT_OF_OPERATION = """
CREATE OR REPLACE FUNCTION tenant_of_operation(operation uuid, detail jsonb) RETURNS varchar
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT tenant FROM operations WHERE id = operation),
        tenant_of_observer(detail)
    )
$$
"""

# 0018's own definition, for the downgrade
TENANT_OF_OPERATION_0018 = """
CREATE OR REPLACE FUNCTION tenant_of_operation(operation uuid, detail jsonb) RETURNS varchar
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT tenant FROM operations WHERE id = operation),
        (SELECT tenant FROM principals WHERE id = (detail ->> 'principal_id')::uuid),
        ''
    )
$$
"""


def upgrade() -> None:
    op.execute(TENANT_OF_OBSERVER)
    op.execute(TENANT_OF_OPERATION)


def downgrade() -> None:
    op.execute(TENANT_OF_OPERATION_0018)
    op.execute("DROP FUNCTION tenant_of_observer(jsonb)")
