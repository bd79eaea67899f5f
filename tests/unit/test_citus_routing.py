"""The routing test on what the server has (issue 38 item 3; docs/scaling.md): every table
names its Citus kind, and the keys and the statements (hot (a), cold collected statically
(b)) break exactly the rules recorded in tests/unit/citus_debt.py. The SQL a run executed
(c) is checked by tests/integration/test_citus_routing_run.py."""

from __future__ import annotations

from service.app.routes import ROUTES, SCHEMA
from tests.citus_rules import (
    Finding,
    Schema,
    key_findings,
    spans_tenants,
    statement_findings,
    summary,
    unkinded_tables,
)
from tests.citus_statements import cold_statements, effects, hot_statements
from tests.unit import citus_debt


def _differences(found: set[tuple[str, str, str]], debt: frozenset[tuple[str, str, str]]) -> str:
    new = "\n".join(f"  new: {entry}" for entry in sorted(found - debt))
    fixed = "\n".join(
        f"  fixed (remove it from the debt): {entry}" for entry in sorted(debt - found)
    )
    return f"\n{new}\n{fixed}"


def test_every_table_declares_its_citus_kind() -> None:
    assert unkinded_tables(SCHEMA) == []


def test_the_keys_break_exactly_the_recorded_debt() -> None:
    found = {finding.as_tuple() for finding in key_findings(SCHEMA)}
    assert found == citus_debt.KEYS, _differences(found, citus_debt.KEYS)


def test_the_hot_and_cold_statements_break_exactly_the_recorded_debt() -> None:
    schema = Schema.of(SCHEMA)
    checked = {"hot (a)": hot_statements(), "cold (b)": cold_statements()}
    findings: list[Finding] = []
    spanning: dict[str, str] = {}
    for statements in checked.values():
        for name, sql in statements.items():
            findings += statement_findings(name, sql, schema)  # a parse error fails here
            why = spans_tenants(sql)
            if why is not None:
                spanning[name] = why
    print(summary(SCHEMA, checked, [*key_findings(SCHEMA), *findings], spanning))
    found = {finding.as_tuple() for finding in findings}
    assert found == citus_debt.STATEMENTS, _differences(found, citus_debt.STATEMENTS)


def test_every_routes_local_effect_is_among_the_hot_statements() -> None:
    """Each local effect's SQL is declared at its module's top level (an ``EffectSql``),
    where :func:`tests.citus_statements.effects` finds it: one per route with a statement,
    and the store's no-effect."""
    local = [route for route in ROUTES if route.statement is not None]
    assert len(effects()) == len(local) + 1
    names = set(hot_statements())
    for effect in effects():
        assert {f"claim_settle_with({effect})", f"finish_with({effect})"} <= names
