"""Which errors say the database went away (a restart, a dropped connection): found by the
20-minute reliability run, where SQLAlchemy wrapped asyncpg's "connection was closed in the
middle of operation" in a bare DBAPIError and the answer was a 500."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import asyncpg
import pytest
import sqlalchemy.exc

from service.errors import SettlementError
from service.store.db import (
    DatabaseUnavailable,
    PoolTimeout,
    _statement_failed,
    database_gone,
    unavailable,
)


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


def test_the_store_raises_its_own_error_in_place_of_the_drivers() -> None:
    gone = unavailable(wrapped(ConnectionResetError(104, "reset")))
    assert isinstance(gone, DatabaseUnavailable) and isinstance(gone, SettlementError)
    assert gone.problem == "service-unavailable"
    busy = unavailable(sqlalchemy.exc.TimeoutError("QueuePool limit reached"))
    assert isinstance(busy, PoolTimeout) and isinstance(busy, DatabaseUnavailable)
    already = DatabaseUnavailable("lost")
    assert unavailable(already) is already


def test_an_error_that_is_not_the_database_gone_goes_on_as_it_is() -> None:
    assert unavailable(ValueError("a bug")) is None
    assert unavailable(wrapped(asyncpg.exceptions.UniqueViolationError("dup"))) is None


def test_a_cancelled_statement_stays_a_cancellation() -> None:
    """SQLAlchemy counts a cancellation as a disconnect; turned into DatabaseUnavailable it
    would no longer cancel its task (a worker's loop would catch it and go on for ever)."""
    cancelled = SimpleNamespace(original_exception=asyncio.CancelledError(), is_disconnect=True)
    assert _statement_failed(cancelled) is None  # type: ignore[arg-type]
    lost = SimpleNamespace(original_exception=ConnectionResetError("reset"), is_disconnect=True)
    with pytest.raises(DatabaseUnavailable):
        _statement_failed(lost)  # type: ignore[arg-type]
