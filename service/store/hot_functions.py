"""The one statement of a new operation (:func:`service.store.hot_sql.claim_settle_with`) as
a SQL function taking the tenant first, for ``SETTLEMENT_DB_CLAIM_SETTLE=function``.

On Citus a statement whose CTEs insert is never routed to one node: the claim-and-settle
would be planned on the coordinator and run as several round trips. A function
distributed by its first argument (``create_distributed_function``, colocated with
``operations``) is sent whole to the tenant's node: one round trip again. On one
PostgreSQL the function runs the same statement (docs/scaling.md has both figures).

Each effect's function is named after the effect and a digest of its body, so that a
server of another version, whose statement differs, finds its own beside ours; servers in
this mode create what is missing when they open (:func:`install`), one at a time.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from service.store.hot_sql import claim_settle_with
from service.store.outcomes import EffectSql
from service.store.prepared import Prepared

__all__ = ["HotFunction", "hot_function", "install"]

PREFIX = "settlement_claim_settle_"
# the lock servers take, each in turn, to create what is missing (pg_advisory_xact_lock)
_INSTALL_LOCK = "settlement hot functions"


@dataclass(frozen=True, slots=True)
class HotFunction:
    """An effect's claim-and-settle as a function: ``name``, ``call`` (a Prepared taking the
    statement's mapping, the tenant first) and ``body`` (the statement, renumbered)."""

    name: str
    call: Prepared
    body: str
    statement: Prepared


@functools.cache
def hot_function(effect: EffectSql) -> HotFunction:
    statement = claim_settle_with(effect)
    digest = hashlib.sha256("\n".join((statement.sql, *statement.names)).encode()).hexdigest()[:12]
    name = PREFIX + effect.name.replace("-", "_") + "_" + digest
    call, body = Prepared.call(name, statement, first="tenant")
    return HotFunction(name=name, call=call, body=body, statement=statement)


async def install(conn: Any, effects: Iterable[EffectSql]) -> list[str]:
    """Create the function of each of ``effects`` that the database does not have yet, in
    one transaction under an advisory lock (servers starting together create each once);
    on Citus, distribute it by its first argument, colocated with ``operations``. Returns
    the names created."""
    wanted = {fn.name: fn for fn in map(hot_function, effects)}
    made: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", _INSTALL_LOCK)
        have = {
            row["proname"]
            for row in await conn.fetch(
                "SELECT proname FROM pg_proc WHERE proname = ANY($1::text[])", list(wanted)
            )
        }
        citus = await conn.fetchval("SELECT count(*) > 0 FROM pg_extension WHERE extname = 'citus'")
        for name, fn in wanted.items():
            if name in have:
                continue
            await conn.execute(await _create_sql(conn, fn))
            if citus:  # not run here: no Citus can be installed on the machines we test on
                await conn.execute(
                    "SELECT create_distributed_function($1, 'p_tenant', "
                    "colocate_with := 'operations')",
                    await conn.fetchval(
                        "SELECT oid::regprocedure::text FROM pg_proc WHERE proname = $1", name
                    ),
                )
            made.append(name)
    return made


async def _create_sql(conn: Any, fn: HotFunction) -> str:
    """``CREATE FUNCTION``: the parameter and column types are those PostgreSQL infers for
    the statement itself (asyncpg's ``prepare``), so the function takes and answers exactly
    what the statement does."""
    prepared = await conn.prepare(fn.statement.sql)
    types = dict(
        await conn.fetch(
            "SELECT oid, format_type(oid, NULL) FROM unnest($1::oid[]) AS oid",
            [t.oid for t in prepared.get_parameters()]
            + [a.type.oid for a in prepared.get_attributes()],
        )
    )
    by_name = {
        name: t.oid for name, t in zip(fn.statement.names, prepared.get_parameters(), strict=True)
    }
    arguments = ", ".join(f"p_{name} {types[by_name[name]]}" for name in fn.call.names)
    columns = ", ".join(f"{a.name} {types[a.type.oid]}" for a in prepared.get_attributes())
    if "$fn$" in fn.body:
        raise ValueError(f"{fn.name}: the body holds the quote $fn$")
    return (
        f"CREATE FUNCTION {fn.name}({arguments}) RETURNS TABLE ({columns}) "
        f"LANGUAGE sql VOLATILE AS $fn${fn.body}$fn$"
    )
