"""The hot path's statements are built from the tables and take named parameters: an effect's
names cannot meet the store's, a constant cannot become a parameter, and a missing value is
named, never sent as a shifted position."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam, exists, insert, literal, select
from sqlalchemy.sql.selectable import CTE

from service.domain import ledger
from service.store.hot_sql import (
    BY_SCOPE,
    CLAIM_NEW,
    IDENTIFY,
    LOCK,
    NO_EFFECT,
    Prepared,
    claim_settle_with,
    finish_with,
)
from service.store.outcomes import EffectSql, never_refused
from service.store.tables import accounts


def _writes_account(name: str) -> EffectSql:
    def apply(written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
        opened = (
            insert(accounts)
            .from_select(
                ["id"],
                select(bindparam(name, type_=accounts.c.id.type)).where(
                    exists(select(written.c.id))
                ),
            )
            .cte("opened")
        )
        return (opened,)

    return EffectSql(f"writes {name}", guard=never_refused, apply=apply)


@pytest.mark.parametrize("effect", [NO_EFFECT, ledger.TRANSFER, ledger.OPEN_ACCOUNT])
def test_every_settling_statement_compiles_to_one_placeholder_per_name(effect: EffectSql) -> None:
    for prepared in (finish_with(effect), claim_settle_with(effect)):
        assert len(set(prepared.names)) == len(prepared.names)
        assert f"${len(prepared.names)}::" in prepared.sql
        assert f"${len(prepared.names) + 1}" not in prepared.sql
        values = {name: index for index, name in enumerate(prepared.names)}
        # the row's conflict (jsonb) goes as JSON text, everything else as it is given
        expected = [
            str(index) if name == "conflict" else index for index, name in enumerate(prepared.names)
        ]
        assert prepared.args(values) == expected
        shape = {"digests": ["d1"], "kinds": ["failed"]}
        sent = prepared.args({**values, "conflict": shape})
        assert sent[prepared.names.index("conflict")] == '{"digests":["d1"],"kinds":["failed"]}'
        assert prepared.args({**values, "conflict": None})[prepared.names.index("conflict")] is None


def test_the_reads_and_the_claim_take_their_names() -> None:
    assert set(IDENTIFY.names) == {"key_hash", "route", "idempotency_key", "now", "tenant"}
    assert "tombstone_stands(tombstones.forget_at" in IDENTIFY.sql  # the schema's one rule
    assert set(LOCK.names) == {"id", "tenant"} and "FOR UPDATE" in LOCK.sql
    assert set(BY_SCOPE.names) == {"tenant", "principal_id", "route", "idempotency_key"}
    assert {"attempt_id", "lease_token", "now", "id"} <= set(CLAIM_NEW.names)


def test_an_effect_parameter_named_like_the_stores_is_refused_when_compiled() -> None:
    with pytest.raises(ValueError, match=r"\['revision'\] must be named e_"):
        finish_with(_writes_account("revision"))
    with pytest.raises(ValueError, match=r"\['id'\] must be named e_"):
        claim_settle_with(_writes_account("id"))
    assert "e_id" in finish_with(_writes_account("e_id")).names


def test_a_constant_sent_as_a_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="write constants inline"):
        Prepared(select(literal("EUR")))


def test_a_missing_value_is_named() -> None:
    with pytest.raises(KeyError, match="key_hash"):
        IDENTIFY.args(
            {"route": "POST /v1/transfers", "idempotency_key": "k", "now": None, "tenant": "t"}
        )
