"""A statement of the hot path compiled once for asyncpg (:mod:`service.store.hot_sql`):
its SQL with ``$n`` placeholders, and its named parameters in their order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.sql import sqltypes

from service.store.db import json_text

__all__ = ["Prepared"]

_DIALECT = asyncpg_dialect.dialect()  # type: ignore[no-untyped-call]


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

    def args(self, values: Mapping[str, object]) -> list[object]:
        """The positional arguments for ``values``; KeyError names a missing parameter."""
        args = [values[name] for name in self.names]
        for at in self._json:
            if args[at] is not None:
                args[at] = json_text(args[at])
        return args
