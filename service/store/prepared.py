"""A statement of the hot path compiled once for asyncpg (:mod:`service.store.hot_sql`):
its SQL with ``$n`` placeholders, and its named parameters in their order."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.sql import sqltypes

from service.store.db import json_text

__all__ = ["PLACEHOLDER", "Prepared"]

_DIALECT = asyncpg_dialect.dialect()  # type: ignore[no-untyped-call]
# a parameter in a compiled statement's SQL (asyncpg's numbered style), its number the group
PLACEHOLDER = re.compile(r"\$([1-9][0-9]*)")
# a quoted literal or identifier of a compiled statement
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")


class Prepared:
    """A statement compiled once for asyncpg: ``sql`` with ``$n`` placeholders, and
    :meth:`args`, the values of a mapping of parameter names in their order.

    A parameter of a JSON type (the row's ``conflict``) is given as its value, the shape
    :func:`service.store.rows.record_values` makes for both write paths, and sent as JSON
    text (:func:`service.store.db.json_text`), as SQLAlchemy's own JSON types send it: the
    connections' json/jsonb codecs are SQLAlchemy's (text in, the decoded value out)."""

    __slots__ = ("_json", "names", "sql")

    def __init__(self, statement: Any) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        self.sql: str = compiled.string
        self.names: tuple[str, ...] = tuple(compiled.positiontup or ())
        literals = [name for name in self.names if not compiled.binds[name].required]
        if literals:  # a value in the SQL's text would be sent anew with every call
            raise ValueError(f"parameters without a name: {literals}; write constants inline")
        self._json = tuple(
            at
            for at, name in enumerate(self.names)
            if isinstance(compiled.binds[name].type, sqltypes.JSON)
        )

    @classmethod
    def call(
        cls, function: str, statement: Prepared, first: str, same: tuple[str, ...] = ()
    ) -> tuple[Prepared, str]:
        """``statement`` as the body of a SQL function ``function`` whose parameters are
        ``statement``'s with ``first`` moved to the front, and each of ``same`` (a parameter
        always given ``first``'s value) taken from ``first``: the call (``SELECT * FROM
        function($1, ...)``, a Prepared taking the statement's mapping) and the body (the
        statement's SQL, its ``$n`` numbered in the function's order). ValueError when
        ``first`` is not a parameter, or a ``$n`` stands in a quoted literal (renumbered,
        it would change the text)."""
        if first not in statement.names:
            raise ValueError(f"{first!r} is not a parameter of the statement")
        if any(PLACEHOLDER.search(quoted) for quoted in _QUOTED.findall(statement.sql)):
            raise ValueError("a quoted literal of the statement holds a $n")
        names = (first, *(n for n in statement.names if n != first and n not in same))
        number = {
            str(at + 1): str(names.index(first if name in same else name) + 1)
            for at, name in enumerate(statement.names)
        }
        body = PLACEHOLDER.sub(lambda found: "$" + number[found.group(1)], statement.sql)
        placeholders = ", ".join(f"${at + 1}" for at in range(len(names)))
        called = cls.__new__(cls)
        called.sql = f"SELECT * FROM {function}({placeholders})"
        called.names = names
        called._json = tuple(
            names.index(statement.names[at])
            for at in statement._json
            if statement.names[at] in names
        )
        return called, body

    def args(self, values: Mapping[str, object]) -> list[object]:
        """The positional arguments for ``values``; KeyError names a missing parameter."""
        args = [values[name] for name in self.names]
        for at in self._json:
            if args[at] is not None:
                args[at] = json_text(args[at])
        return args
