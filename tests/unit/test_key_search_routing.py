"""The work list's search by key (service.store.worklist.by_key) keeps the routing rules of
tests/citus_rules.py: pinned to the tenant whenever one is known; an all-tenant admin's
search over every tenant is the one form that spans tenants, and its SQL says so."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.dialects.postgresql import asyncpg

from service.app.routes import SCHEMA
from service.store import keyset
from service.store.worklist import by_key
from tests.citus_rules import Schema, spans_tenants, statement_findings


def _sql(statement: Any) -> str:
    dialect = asyncpg.dialect()  # type: ignore[no-untyped-call]
    return str(statement.compile(dialect=dialect, compile_kwargs={"render_postcompile": True}))


def test_a_search_of_one_tenant_is_pinned_to_it() -> None:
    schema = Schema.of(SCHEMA)
    cursor = keyset.encode(datetime(2026, 1, 1, tzinfo=UTC), str(uuid.uuid4()))
    for after in (None, cursor):
        sql = _sql(by_key("order-1", "acme", after))
        assert spans_tenants(sql) is None
        assert statement_findings("by_key", sql, schema) == []


def test_a_search_of_every_tenant_says_it_spans_tenants() -> None:
    sql = _sql(by_key("order-1", None, None))
    assert spans_tenants(sql) == "an all-tenant admin's search by key"
