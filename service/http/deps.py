"""What route handlers receive by dependency injection: the process's composition root."""

from __future__ import annotations

from typing import Any, TypeAlias

from litestar.connection import ASGIConnection
from litestar.di import NamedDependency

from service.app.root import Settlement

__all__ = ["Services", "settlement_of"]

# ``settlement: Services`` in a handler's signature: the Settlement the lifespan opened.
Services: TypeAlias = NamedDependency[Settlement]


def settlement_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Settlement:
    """The process's Settlement, which the lifespan put in the app's state, for what gets no
    dependencies (guards)."""
    settlement: Settlement = connection.app.state.settlement
    return settlement
