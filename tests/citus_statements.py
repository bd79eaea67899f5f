"""Every statement the store can send, for the routing rules (:mod:`tests.citus_rules`).

* :func:`hot_statements` (a): the hot path's prepared statements (``service.store.hot_sql``)
  and the one statement and the finishing statement of every local effect, compiled for
  asyncpg as the store compiles them; the one statement as a function's call and body
  (``service.store.hot_functions``).
* :func:`cold_statements` (b): what can be collected without running anything: every
  statement assigned at a module's top level in ``service/store``, ``service/domain`` and
  ``service/app`` (SQLAlchemy Core statements and ``text()``, compiled for asyncpg; SQL
  strings sent to asyncpg). A string that is part of another statement's text is a piece,
  not a statement. Statements built inside functions are seen only when a run executes them.
* :class:`Recorder` (c): the SQL a run actually executed, through public hooks:
  SQLAlchemy's ``before_cursor_execute`` on every engine, and asyncpg's query logger
  (``Connection.add_query_logger``) on every pooled connection as it is checked out (the hot
  path's raw connections).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from pglast import parse_sql
from pglast.parser import ParseError
from sqlalchemy import CompoundSelect, Delete, Engine, Insert, Select, TextClause, Update, event
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.pool import Pool

from service.store.hot_functions import hot_function
from service.store.hot_sql import NO_EFFECT, Prepared, claim_settle_with, finish_with
from service.store.outcomes import EffectSql
from tests.citus_rules import tables_in

__all__ = ["PACKAGES", "Recorder", "cold_statements", "effects", "hot_statements", "named"]

PACKAGES = ("service.store", "service.domain", "service.app")
_DIALECT = asyncpg_dialect.dialect()  # type: ignore[no-untyped-call]
_CORE = (Select, CompoundSelect, Insert, Update, Delete, TextClause)
_SQL = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)


def _modules() -> Iterator[ModuleType]:
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        yield package
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            yield importlib.import_module(f"{package_name}.{info.name}")


def _own_globals(module: ModuleType) -> Iterator[tuple[str, Any]]:
    """The names assigned at ``module``'s top level in its own source (not imported)."""
    try:
        source = inspect.getsource(module)
    except OSError:  # an empty module
        return
    for name, value in sorted(vars(module).items()):
        if re.search(rf"^{re.escape(name)}\s*(:[^=\n]*)?=", source, re.MULTILINE):
            yield name, value


def effects() -> dict[str, EffectSql]:
    """Every local effect's SQL declared in ``service.domain``, and the store's no-effect."""
    found = {NO_EFFECT.name: NO_EFFECT}
    for module in _modules():
        for _, value in _own_globals(module):
            if isinstance(value, EffectSql):
                found[value.name] = value
    return found


def hot_statements() -> dict[str, str]:
    """(a): name -> SQL of every hot statement."""
    found: dict[str, str] = {}
    from service.store import hot_sql

    for name, value in _own_globals(hot_sql):
        if isinstance(value, Prepared):
            found[f"hot_sql.{name}"] = value.sql
    for name, effect in sorted(effects().items()):
        found[f"claim_settle_with({name})"] = claim_settle_with(effect).sql
        found[f"finish_with({name})"] = finish_with(effect).sql
        found[f"hot_function({name})"] = hot_function(effect).call.sql
        found[f"hot_function({name}).body"] = hot_function(effect).body
    return found


def _compiled(statement: Any) -> str:
    return str(statement.compile(dialect=_DIALECT, compile_kwargs={"render_postcompile": True}))


def cold_statements() -> dict[str, str]:
    """(b): name (``module.NAME``) -> SQL of every statement found at a module's top level."""
    found: dict[str, str] = {}
    for module in _modules():
        short = module.__name__.removeprefix("service.")
        for name, value in _own_globals(module):
            if isinstance(value, _CORE):
                found[f"{short}.{name}"] = _compiled(value)
            elif isinstance(value, str) and _SQL.match(value) and _parses(value):
                found[f"{short}.{name}"] = value
    texts = list(found.values())
    return {
        name: sql
        for name, sql in found.items()
        if not any(sql != other and sql in other for other in texts)
    }


def _parses(sql: str) -> bool:
    try:
        parse_sql(sql)
    except ParseError:
        return False
    return True


def named(sql: str, known: dict[str, str], tables: Iterable[str]) -> str:
    """The name of an executed statement: a known statement's of the same text, else
    ``executed <VERB> <table>+<table>...`` (its kind and the ``tables`` it names, sorted):
    a statement built inside a function is named by its shape, so that editing its columns
    leaves its name (and its debt entry) as it was."""
    for name, text in known.items():
        if text == sql:
            return name
    verb = type(parse_sql(sql)[0].stmt).__name__.removesuffix("Stmt").upper()
    return f"executed {verb} {'+'.join(sorted(tables_in(sql) & set(tables)))}"


class Recorder:
    """``with Recorder() as seen:`` the text of every statement any engine or pooled asyncpg
    connection executed meanwhile, in :attr:`executed` (SQLAlchemy's) and :attr:`hot`
    (asyncpg's own: what the hot path sends on its raw connections). Call
    :meth:`settle` before reading: asyncpg calls its loggers soon after the statement."""

    def __init__(self) -> None:
        self.executed: set[str] = set()
        self.hot: set[str] = set()
        self._drivers: list[Any] = []

    def _cursor(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        self.executed.add(statement)

    def _logged(self, record: Any) -> None:
        self.hot.add(record.query)

    def _checkout(self, dbapi_connection: Any, *rest: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and hasattr(driver, "add_query_logger"):
            driver.add_query_logger(self._logged)
            self._drivers.append(driver)

    def __enter__(self) -> Recorder:
        event.listen(Engine, "before_cursor_execute", self._cursor)
        event.listen(Pool, "checkout", self._checkout)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(Engine, "before_cursor_execute", self._cursor)
        event.remove(Pool, "checkout", self._checkout)
        for driver in self._drivers:
            driver.remove_query_logger(self._logged)

    async def settle(self) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
