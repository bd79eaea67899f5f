"""What route handlers receive by dependency injection: the process's composition root."""

from __future__ import annotations

from typing import TypeAlias

from litestar.di import NamedDependency

from service.app.root import Settlement

__all__ = ["Services"]

# ``settlement: Services`` in a handler's signature: the Settlement the lifespan opened.
Services: TypeAlias = NamedDependency[Settlement]
