"""Which errors say the database went away (a restart, a dropped connection): found by the
20-minute reliability run, where SQLAlchemy wrapped asyncpg's "connection was closed in the
middle of operation" in a bare DBAPIError and the answer was a 500."""

from __future__ import annotations

import asyncpg
import sqlalchemy.exc

from service.store.db import database_gone


def wrapped(inner: BaseException, *, invalidated: bool = False) -> sqlalchemy.exc.DBAPIError:
    """As SQLAlchemy's asyncpg dialect raises it: the driver's error as the cause."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise sqlalchemy.exc.DBAPIError(
                "SELECT 1", None, exc, connection_invalidated=invalidated
            ) from exc
    except sqlalchemy.exc.DBAPIError as outer:
        return outer


def test_a_closed_connection_wrapped_in_a_bare_dbapi_error_is_the_database_gone() -> None:
    closed = asyncpg.exceptions.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    )
    assert database_gone(wrapped(closed))
    assert database_gone(wrapped(ConnectionResetError(104, "reset")))
    assert database_gone(wrapped(ValueError("x"), invalidated=True))
    assert database_gone(closed)
    assert database_gone(ConnectionError("unexpected connection_lost() call"))


def test_other_errors_are_not() -> None:
    assert not database_gone(None)
    assert not database_gone(ValueError("a bug"))
    assert not database_gone(wrapped(asyncpg.exceptions.UniqueViolationError("dup")))
    assert not database_gone(wrapped(ValueError("a bug")))
