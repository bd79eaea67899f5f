"""The claim-and-settle functions' names and bodies (service/store/hot_functions.py,
Prepared.call), made without a database: every route's effect makes a name PostgreSQL keeps
whole, an effect name that could not be one is refused, and the renumbering keeps the
statement's text."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam, literal_column, select

from service.app.routes import ROUTES
from service.store.hot_functions import PREFIX, hot_function
from service.store.hot_sql import NO_EFFECT
from service.store.outcomes import EffectSql, never_refused
from service.store.prepared import PLACEHOLDER, Prepared


def _nothing(written: object, effect_ok: object) -> tuple[()]:
    return ()


@pytest.mark.parametrize(
    "effect", [spec.effect_sql for spec in ROUTES if spec.effect_sql] + [NO_EFFECT]
)
def test_every_effects_function_has_a_whole_name_and_takes_the_tenant_first(
    effect: EffectSql,
) -> None:
    fn = hot_function(effect)
    assert fn.name.startswith(PREFIX) and len(fn.name.encode()) <= 63
    assert fn.name.endswith("_" + effect.name.replace("-", "_"))
    assert fn.call.names[0] == "tenant" and "e_tenant" not in fn.call.names
    # every parameter of the statement is one of the function's, e_tenant the tenant's
    numbers = {int(n) for n in PLACEHOLDER.findall(fn.body)}
    assert numbers == set(range(1, len(fn.call.names) + 1))
    assert PLACEHOLDER.sub("$", fn.body) == PLACEHOLDER.sub("$", fn.statement.sql)


@pytest.mark.parametrize("name", ["Transfer", "a.b", "x'y", "a" * 30])
def test_an_effect_name_that_cannot_name_a_function_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="effect name"):
        hot_function(EffectSql(name, guard=never_refused, apply=_nothing))


def test_a_statement_with_a_placeholder_in_a_literal_is_not_renumbered() -> None:
    statement = Prepared(
        select(
            bindparam("a", type_=None).label("a"),
            literal_column("'over the $1 limit'").label("why"),
            bindparam("tenant", type_=None).label("tenant"),
        )
    )
    with pytest.raises(ValueError, match="quoted literal"):
        Prepared.call("f", statement, first="tenant")


def test_the_call_takes_the_first_parameter_first_and_the_same_from_it() -> None:
    statement = Prepared(
        select(
            bindparam("a", type_=None).label("a"),
            bindparam("tenant", type_=None).label("t"),
            bindparam("e_tenant", type_=None).label("e"),
        )
    )
    call, body = Prepared.call("f", statement, first="tenant", same=("e_tenant",))
    assert (call.sql, call.names) == ("SELECT * FROM f($1, $2)", ("tenant", "a"))
    assert PLACEHOLDER.findall(body) == ["2", "1", "1"]
    assert call.args({"tenant": "t1", "a": 7}) == ["t1", 7]
