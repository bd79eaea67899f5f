"""the tenant in every tenant-owned table and key (issue 38 item 1), online

``attempts``, ``operation_epochs`` and ``observations`` get a ``tenant`` column; the primary
keys of ``operations``, ``attempts``, ``operation_epochs``, ``observations``, ``accounts`` and
``transfers`` become ``(tenant, id)``; their unique keys and the foreign keys among them
start with the tenant (docs/scaling.md, "Keys": what Citus, distributed by tenant, can
enforce per shard).

Servers on the previous revision (0017's code, which inserts attempts, observations and
epochs without a tenant and looks rows up by id alone) keep running while this runs and
after it:

1. The three columns are added nullable (no rewrite), and a ``BEFORE INSERT`` trigger
   (``fill_tenant``, ``WHEN (NEW.tenant IS NULL)``: an insert that sets its tenant never
   calls it) fills a NULL tenant from the operation's row (an observation about no
   operation here: from its observer, ``detail ->> 'principal_id'``; neither: ``''``). The
   current code sets the tenant itself and never relies on it; it stays for the previous
   revision's inserts, and a later migration drops it once no server of that revision runs.
   Short transaction: the columns and the trigger appear together, so no insert of the
   previous revision escapes both.
2. The rows already there are back-filled in batches of :data:`BATCH` rows, each batch one
   statement in its own transaction (autocommit): no lock is held longer than a batch's.
3. ``NOT NULL`` without a long lock: a ``CHECK (tenant IS NOT NULL) NOT VALID`` (a moment's
   lock), ``VALIDATE`` (scans without blocking writes), ``SET NOT NULL`` (proved by the valid
   CHECK, no scan), then the CHECK goes.
4. Every new unique index, and a plain index on ``id`` (``operation_id``) where the previous
   revision looks a row up by it alone (so its statements stay index scans: the keys rule is
   about unique keys only), is built ``CONCURRENTLY``.
5. The keys swap, each table in a short transaction of its own: the foreign keys among
   these tables are dropped first; a table's primary key becomes
   ``ADD CONSTRAINT ... PRIMARY KEY USING INDEX`` (no scan: the index is built and the
   columns NOT NULL), its unique constraints likewise; the foreign keys come back ``NOT
   VALID`` (a moment's lock), then are validated one by one (no write blocked). Between the
   drop and the re-add (a few short transactions) the foreign keys are not checked; the
   validation afterwards proves no row slipped through.

Downgrade restores 0017's schema (not online: the keys are rebuilt in one transaction).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 07:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.store.online_ddl import briefly

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# rows back-filled per statement (one transaction each): a batch's row locks last a few
# milliseconds, short enough that a server's writes to those rows barely wait
BATCH = 5_000

# Every DDL transaction waits briefly for its tables' locks and gives way, then tries
# again: service.store.online_ddl.briefly.

# the tables that gain the column, and the type of their id (the back-fill's keyset)
FILLED = ("attempts", "operation_epochs", "observations")

# The tenant of a row of ``FILLED`` inserted without one (the previous revision's inserts)
# or back-filled: its operation's, else its observer's, else '' (an observation about an
# operation that is not here, whose observer is not known).
TENANT_OF = """
CREATE FUNCTION tenant_of_operation(operation uuid, detail jsonb) RETURNS varchar
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT tenant FROM operations WHERE id = operation),
        (SELECT tenant FROM principals WHERE id = (detail ->> 'principal_id')::uuid),
        ''
    )
$$
"""
FILL_TENANT = """
CREATE FUNCTION fill_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant IS NULL THEN
        NEW.tenant := tenant_of_operation(NEW.operation_id, to_jsonb(NEW) -> 'detail');
    END IF;
    RETURN NEW;
END
$$
"""

# one batch: the next BATCH ids after :after, filled where still NULL; answers the last id
# (none: the table is done)
BACKFILL = """
WITH batch AS (
    SELECT id FROM {table} WHERE id > :after ORDER BY id LIMIT {batch}
), filled AS (
    UPDATE {table} AS t
       SET tenant = tenant_of_operation(t.operation_id, to_jsonb(t) -> 'detail')
      FROM batch
     WHERE t.id = batch.id AND t.tenant IS NULL
)
SELECT id FROM batch ORDER BY id DESC LIMIT 1
"""
START = {"attempts": "00000000-0000-0000-0000-000000000000"}  # ids: uuid; others bigint

# the unique indexes built before the swap: (table, name it is built under, columns, is
# the primary key)
PRIMARY = ("operations", "attempts", "operation_epochs", "observations", "accounts", "transfers")
UNIQUE = {
    "attempts": ("tenant", "operation_id", "fencing_token"),
    "operation_epochs": ("tenant", "operation_id", "binding_generation"),
    "accounts": ("tenant", "operation_id", "binding_generation"),
    "transfers": ("tenant", "operation_id", "binding_generation"),
}
# 0017's unique keys, replaced
OLD_UNIQUE = {
    "attempts": ("operation_id", "fencing_token"),
    "operation_epochs": ("operation_id", "binding_generation"),
    "accounts": ("operation_id", "binding_generation"),
    "transfers": ("operation_id", "binding_generation"),
}
# plain indexes on what the previous revision (and the statements not yet pinned by tenant)
# look rows up by alone
PLAIN_INDEXES = (
    ("ix_operations_id", "operations", "id"),
    ("ix_attempts_id", "attempts", "id"),
    ("ix_attempts_operation_id", "attempts", "operation_id"),
    ("ix_operation_epochs_operation_id", "operation_epochs", "operation_id"),
    ("ix_accounts_id", "accounts", "id"),
)
# (name, table, columns, referred table, referred columns, on delete): 0018's foreign keys
FOREIGN = (
    ("fk_attempts_tenant_operations", "attempts", ("tenant", "operation_id"), "operations",
     ("tenant", "id"), "CASCADE"),
    ("fk_operation_epochs_tenant_operations", "operation_epochs", ("tenant", "operation_id"),
     "operations", ("tenant", "id"), "CASCADE"),
    ("fk_transfers_source_id_accounts", "transfers", ("tenant", "source_id"), "accounts",
     ("tenant", "id"), None),
    ("fk_transfers_destination_id_accounts", "transfers", ("tenant", "destination_id"),
     "accounts", ("tenant", "id"), None),
)  # fmt: skip
# 0017's
OLD_FOREIGN = (
    ("fk_attempts_operation_id_operations", "attempts", ("operation_id",), "operations",
     ("id",), "CASCADE"),
    ("fk_operation_epochs_operation_id_operations", "operation_epochs", ("operation_id",),
     "operations", ("id",), "CASCADE"),
    ("fk_transfers_source_id_accounts", "transfers", ("source_id",), "accounts", ("id",), None),
    ("fk_transfers_destination_id_accounts", "transfers", ("destination_id",), "accounts",
     ("id",), None),
)  # fmt: skip


def _unique_name(table: str, columns: Sequence[str]) -> str:
    return f"uq_{table}_{'_'.join(columns)}"


def _foreign_sql(
    name: str,
    table: str,
    columns: Sequence[str],
    referred: str,
    referred_columns: Sequence[str],
    on_delete: str | None,
    *,
    not_valid: bool,
) -> str:
    return (
        f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({', '.join(columns)}) "
        f"REFERENCES {referred} ({', '.join(referred_columns)})"
        + (f" ON DELETE {on_delete}" if on_delete else "")
        + (" NOT VALID" if not_valid else "")
    )


def upgrade() -> None:
    with op.get_context().autocommit_block():
        bind = op.get_bind()
        # 1. the columns and the trigger that fills them, together
        op.execute(TENANT_OF)
        op.execute(FILL_TENANT)
        for table in FILLED:
            briefly(
                op.get_bind(),
                ["operations", table],
                [
                    f"ALTER TABLE {table} ADD COLUMN tenant varchar(128)",
                    f"CREATE TRIGGER fill_tenant BEFORE INSERT ON {table} FOR EACH ROW "
                    "WHEN (NEW.tenant IS NULL) EXECUTE FUNCTION fill_tenant()",
                ],
            )
        # 2. the back-fill, a batch per transaction
        for table in FILLED:
            after: object = START.get(table, 0)
            statement = sa.text(BACKFILL.format(table=table, batch=BATCH))
            while (last := bind.execute(statement, {"after": after}).scalar()) is not None:
                after = last
        # 3. NOT NULL without a long lock
        for table in FILLED:
            check = f"ck_{table}_tenant_not_null"
            briefly(
                op.get_bind(),
                [table],
                [
                    f"ALTER TABLE {table} ADD CONSTRAINT {check} CHECK (tenant IS NOT NULL) NOT VALID"
                ],
            )
            op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {check}")
            briefly(
                op.get_bind(),
                [table],
                [
                    f"ALTER TABLE {table} ALTER COLUMN tenant SET NOT NULL",
                    f"ALTER TABLE {table} DROP CONSTRAINT {check}",
                ],
            )
        # 4. the new indexes, concurrently
        for table in PRIMARY:
            op.execute(
                f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {table}_tenant_id "
                f"ON {table} (tenant, id)"
            )
        for table, columns in UNIQUE.items():
            op.execute(
                f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {_unique_name(table, columns)} "
                f"ON {table} ({', '.join(columns)})"
            )
        for name, table, column in PLAIN_INDEXES:
            op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({column})")
        # 5. the swap: foreign keys out, keys swapped table by table, foreign keys back NOT
        # VALID, then validated (no write blocked)
        for name, table, _, referred, *_ in OLD_FOREIGN:
            briefly(
                op.get_bind(), [referred, table], [f"ALTER TABLE {table} DROP CONSTRAINT {name}"]
            )
        for table in PRIMARY:
            swap = [
                f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}",
                f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} "
                f"PRIMARY KEY USING INDEX {table}_tenant_id",
            ]
            if table in UNIQUE:
                name = _unique_name(table, UNIQUE[table])
                swap += [
                    f"ALTER TABLE {table} DROP CONSTRAINT {_unique_name(table, OLD_UNIQUE[table])}",
                    f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE USING INDEX {name}",
                ]
            briefly(op.get_bind(), [table], swap)
        for foreign in FOREIGN:
            briefly(
                op.get_bind(), [foreign[3], foreign[1]], [_foreign_sql(*foreign, not_valid=True)]
            )
        for name, table, *_ in FOREIGN:
            op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def downgrade() -> None:
    for name, table, *_ in FOREIGN:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for table in PRIMARY:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY (id)")
        if table in UNIQUE:
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {_unique_name(table, UNIQUE[table])}")
            old = OLD_UNIQUE[table]
            op.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {_unique_name(table, old)} "
                f"UNIQUE ({', '.join(old)})"
            )
    for name, table, _ in PLAIN_INDEXES:
        op.drop_index(name, table_name=table)
    for foreign in OLD_FOREIGN:
        op.execute(_foreign_sql(*foreign, not_valid=False))
    for table in FILLED:
        op.execute(f"DROP TRIGGER fill_tenant ON {table}")
        op.drop_column(table, "tenant")
    op.execute("DROP FUNCTION fill_tenant()")
    op.execute("DROP FUNCTION tenant_of_operation(uuid, jsonb)")
