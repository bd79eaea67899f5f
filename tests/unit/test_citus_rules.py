"""The routing checker catches what it claims (tests/citus_rules.py), on small statements
over a small schema: a distributed ``orders`` and ``items`` (by ``tenant``), a reference
``users``, a local ``notes``."""

from __future__ import annotations

import pytest
from sqlalchemy import (
    Column,
    ForeignKey,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
)

from service.store.tables import citus
from tests.citus_rules import Schema, key_findings, statement_findings, unkinded_tables

metadata = MetaData()
Table(
    "orders",
    metadata,
    Column("tenant", String, nullable=False),
    Column("id", Integer, nullable=False),
    Column("user_id", Integer, ForeignKey("users.id")),
    PrimaryKeyConstraint("tenant", "id"),
    info=citus("distributed"),
)
Table(
    "items",
    metadata,
    Column("tenant", String, nullable=False),
    Column("id", Integer, primary_key=True),
    Column("order_id", Integer, nullable=False),
    Column("sku", String),
    UniqueConstraint("order_id", "sku"),
    info=citus("distributed"),
)
Table("users", metadata, Column("id", Integer, primary_key=True), info=citus("reference"))
Table("notes", metadata, Column("id", Integer, primary_key=True), info=citus("local"))
SCHEMA = Schema.of(metadata)


def rules(sql: str) -> set[tuple[str, str]]:
    return {(f.rule, f.subject) for f in statement_findings("s", sql, SCHEMA)}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM orders WHERE tenant = $1 AND id = $2",
        "SELECT * FROM orders o WHERE o.tenant = $1::VARCHAR",
        "SELECT * FROM orders WHERE tenant = 'acme'",
        "SELECT * FROM orders o JOIN items i ON i.tenant = o.tenant AND i.order_id = o.id"
        " WHERE o.tenant = $1",
        "SELECT * FROM orders o WHERE o.tenant = $1 AND EXISTS"
        " (SELECT 1 FROM items i WHERE i.tenant = o.tenant AND i.order_id = o.id)",
        "WITH mine AS (SELECT id FROM orders WHERE tenant = $1) SELECT * FROM mine",
        "UPDATE orders SET user_id = 1 WHERE tenant = $1 AND id = $2",
        "DELETE FROM items WHERE tenant = $1 AND order_id = $2",
        "INSERT INTO orders (tenant, id) VALUES ($1, $2)",
        "SELECT * FROM orders WHERE tenant = $1 AND id = $2 FOR UPDATE",
        "SELECT * FROM users JOIN notes ON notes.id = users.id FOR UPDATE",
    ],
)
def test_a_statement_pinned_everywhere_breaks_nothing(sql: str) -> None:
    assert rules(sql) == set()


def test_a_reference_by_id_alone_is_unpinned() -> None:
    assert rules("SELECT * FROM orders WHERE id = $1") == {("unpinned", "orders")}


def test_an_unpinned_reference_in_a_cte_is_found() -> None:
    sql = (
        "WITH its AS (SELECT order_id FROM items WHERE id = $2)"
        " SELECT * FROM orders WHERE tenant = $1 AND id IN (SELECT order_id FROM its)"
    )
    assert rules(sql) == {("unpinned", "items")}


def test_an_unpinned_subquery_and_update_target_are_found() -> None:
    assert rules(
        "SELECT * FROM orders o WHERE o.tenant = $1 AND EXISTS"
        " (SELECT 1 FROM items i WHERE i.order_id = o.id)"
    ) == {("unpinned", "items")}
    assert rules("UPDATE items SET sku = $1 WHERE id = $2") == {("unpinned", "items")}


def test_a_join_pins_only_on_tenant() -> None:
    on_id = "SELECT * FROM orders o JOIN items i ON i.order_id = o.id WHERE o.tenant = $1"
    assert rules(on_id) == {("unpinned", "items")}
    via_reference = (
        "SELECT * FROM users u JOIN orders o ON o.user_id = u.id AND o.tenant = u.name"
        " WHERE u.id = $1"
    )
    assert rules(via_reference) == {("unpinned", "orders")}


def test_a_tenant_under_or_pins_nothing() -> None:
    assert rules("SELECT * FROM orders WHERE tenant = $1 OR id = $2") == {("unpinned", "orders")}


def test_an_insert_without_tenant_is_found() -> None:
    assert rules("INSERT INTO items (id, order_id) VALUES ($1, $2)") == {
        ("insert-without-tenant", "items")
    }
    assert rules("INSERT INTO notes (id) VALUES ($1)") == set()


def test_for_update_on_an_unpinned_reference_is_found() -> None:
    assert rules("SELECT * FROM orders WHERE id = $1 FOR UPDATE SKIP LOCKED") == {
        ("unpinned", "orders"),
        ("for-update-unpinned", "orders"),
    }


def test_a_statement_marked_as_spanning_tenants_is_accepted() -> None:
    sql = "/* spans tenants: the sweeper reads every tenant */ SELECT * FROM orders FOR UPDATE"
    assert rules(sql) == set()
    assert rules(sql.replace("spans tenants", "spans")) != set()


def test_the_keys_rule_from_the_metadata() -> None:
    found = {f.as_tuple() for f in key_findings(metadata)}
    assert found == {
        ("items", "primary-key-without-tenant", "(id)"),
        ("items", "unique-without-tenant", "(order_id, sku)"),
    }
    bad = MetaData()
    Table("a", bad, Column("id", Integer, primary_key=True), info=citus("distributed"))
    Table(
        "r",
        bad,
        Column("id", Integer, primary_key=True),
        Column("a_id", Integer, ForeignKey("a.id")),
        info=citus("reference"),
    )
    Table("x", bad, Column("id", Integer, primary_key=True))
    assert {f.as_tuple() for f in key_findings(bad)} == {
        ("a", "no-tenant-column", "tenant"),
        ("a", "primary-key-without-tenant", "(id)"),
        ("r", "foreign-key-from-reference-to-distributed", "(a_id) -> a"),
    }
    assert unkinded_tables(bad) == ["x"]
