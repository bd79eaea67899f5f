"""The one statement of a new operation (:func:`service.store.hot_sql.claim_settle_with`) as
a SQL function taking the tenant first, for ``SETTLEMENT_DB_CLAIM_SETTLE=function``.

On Citus a statement whose CTEs insert is never routed to one node: the claim-and-settle
would be planned on the coordinator and run as several round trips. A function
distributed by its first argument (``create_distributed_function``, colocated with
``operations``) is sent whole to the tenant's node: one round trip again (Citus 11.0 or
later delegates a call in FROM; a prepared call needs ``plan_cache_mode`` auto, as the
parameter's value picks the node). On one PostgreSQL the function runs the same statement;
docs/scaling.md has the figures of both ways.

Each effect's function is named after a digest of its body and the effect, so that a
server of another version, whose statement differs, finds its own beside ours; servers in
this mode create what is missing when they open (:func:`install`), one at a time. Functions
of versions gone are left in place.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

from service.store.hot_sql import claim_settle_with
from service.store.outcomes import EffectSql
from service.store.prepared import Prepared

__all__ = [
    "INSTALL_LOCK",
    "PREFIX",
    "TAKE_INSTALL_LOCK",
    "FunctionsNotInstalled",
    "HotFunction",
    "hot_function",
    "install",
]

PREFIX = "settlement_claim_settle_"
# Bumped when the way a function is made from its statement changes (its name, signature,
# result), so that the digest, and the name, change with it.
_FORMAT = "1"
# What an effect's name may be, to be part of a function's name unquoted; and the length
# PostgreSQL keeps of a name (NAMEDATALEN - 1 bytes; a longer one is cut without an error).
_EFFECT_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_NAME_BYTES = 63
# The lock servers take, each in turn, to create what is missing (pg_advisory_xact_lock),
# and how long one waits for it: on Citus an install distributes each function to every
# node, longer than a statement's lock timeout.
INSTALL_LOCK = "settlement hot functions"
TAKE_INSTALL_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
INSTALL_LOCK_WAIT = "60s"


class FunctionsNotInstalled(RuntimeError):
    """The functions of ``SETTLEMENT_DB_CLAIM_SETTLE=function`` could not be created."""


@dataclass(frozen=True, slots=True)
class HotFunction:
    """An effect's claim-and-settle as a function: ``name``; ``call``, a Prepared taking the
    statement's mapping, the tenant first; ``body``, the statement renumbered; and
    ``statement``, the one statement it wraps."""

    name: str
    call: Prepared
    body: str
    statement: Prepared


@functools.cache
def hot_function(effect: EffectSql) -> HotFunction:
    """``effect``'s function. ValueError for an effect name that cannot be part of one."""
    if not _EFFECT_NAME.fullmatch(effect.name):
        raise ValueError(f"effect name {effect.name!r}: lower-case letters, digits, - and _")
    statement = claim_settle_with(effect)
    # the effect's own tenant (e_tenant) is the operation's: the one the call is routed by
    draft, body = Prepared.call("f", statement, first="tenant", same=("e_tenant",))
    digest = hashlib.sha256("\n".join((_FORMAT, body, *draft.names)).encode()).hexdigest()
    name = f"{PREFIX}{digest[:12]}_{effect.name.replace('-', '_')}"
    if len(name.encode()) > _NAME_BYTES:
        raise ValueError(f"effect name {effect.name!r}: {name} is over {_NAME_BYTES} bytes")
    call, body = Prepared.call(name, statement, first="tenant", same=("e_tenant",))
    return HotFunction(name=name, call=call, body=body, statement=statement)


async def install(conn: Any, effects: Iterable[EffectSql]) -> list[str]:
    """Create the function of each of ``effects`` that the database's current schema does
    not have yet, in one transaction under an advisory lock (servers starting together
    create each once); on Citus, distribute each that is not, by its first argument,
    colocated with ``operations``. Returns the names created. FunctionsNotInstalled when the
    role may not create them, or Citus is not ready for them."""
    wanted = {fn.name: fn for fn in map(hot_function, effects)}
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{INSTALL_LOCK_WAIT}'")
            await conn.execute(TAKE_INSTALL_LOCK, INSTALL_LOCK)
            have = {
                row["proname"]
                for row in await conn.fetch(
                    "SELECT proname FROM pg_proc WHERE proname = ANY($1::text[])"
                    " AND pronamespace = current_schema()::regnamespace",
                    list(wanted),
                )
            }
            made = [name for name in wanted if name not in have]
            for name in made:
                await conn.execute(await _create_sql(conn, wanted[name]))
            if await conn.fetchval("SELECT count(*) > 0 FROM pg_extension WHERE extname = 'citus'"):
                await _distribute(conn, list(wanted))  # not run here: no Citus on our machines
    except asyncpg.InsufficientPrivilegeError as exc:
        raise FunctionsNotInstalled(
            f"SETTLEMENT_DB_CLAIM_SETTLE=function: this role may not create the functions "
            f"({exc}); start a server once with a role that may, or use statement"
        ) from exc
    return made


async def _distribute(conn: Any, names: list[str]) -> None:
    """On Citus: each of ``names`` not distributed yet is, by ``p_tenant`` with
    ``operations``; refused while ``operations`` is not distributed, or while connections
    plan generically (a generic plan has no tenant to route the call by)."""
    if not await conn.fetchval(
        "SELECT count(*) > 0 FROM pg_dist_partition WHERE logicalrelid = 'operations'::regclass"
    ):
        raise FunctionsNotInstalled(
            "SETTLEMENT_DB_CLAIM_SETTLE=function on Citus: distribute operations first "
            "(docs/scaling.md, Running on Citus)"
        )
    if await conn.fetchval("SHOW plan_cache_mode") == "force_generic_plan":
        raise FunctionsNotInstalled(
            "SETTLEMENT_DB_CLAIM_SETTLE=function on Citus needs SETTLEMENT_DB_PLAN_CACHE_MODE="
            "auto: Citus routes a call by its tenant's value, which a generic plan lacks"
        )
    for name in names:
        await conn.execute(
            "SELECT create_distributed_function(p.oid::regprocedure::text, 'p_tenant',"
            " colocate_with := 'operations') FROM pg_proc p"
            " WHERE p.proname = $1 AND p.pronamespace = current_schema()::regnamespace"
            " AND NOT EXISTS (SELECT FROM pg_dist_object d"
            " WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid)",
            name,
        )


async def _create_sql(conn: Any, fn: HotFunction) -> str:
    """``CREATE FUNCTION``: the parameter and column types are those PostgreSQL infers for
    the statement itself (asyncpg's ``prepare``), so the function takes and answers exactly
    what the statement does."""
    prepared = await conn.prepare(fn.statement.sql)
    parameters, attributes = prepared.get_parameters(), prepared.get_attributes()
    types = dict(
        await conn.fetch(
            "SELECT oid, format_type(oid, NULL) FROM unnest($1::oid[]) AS oid",
            [t.oid for t in parameters] + [a.type.oid for a in attributes],
        )
    )
    by_name = {name: t.oid for name, t in zip(fn.statement.names, parameters, strict=True)}
    arguments = ", ".join(f"p_{name} {types[by_name[name]]}" for name in fn.call.names)
    columns = ", ".join(f"{a.name} {types[a.type.oid]}" for a in attributes)
    if "$fn$" in fn.body:
        raise ValueError(f"{fn.name}: the body holds the quote $fn$")
    return (
        f"CREATE FUNCTION {fn.name}({arguments}) RETURNS TABLE ({columns}) "
        f"LANGUAGE sql VOLATILE AS $fn${fn.body}$fn$"
    )
