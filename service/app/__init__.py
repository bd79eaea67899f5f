"""The application layer: use cases between HTTP and the store (docs/architecture.md).

No Litestar and no SQL of its own: each use case calls the store, the lease manager and the
domain, and returns an answer as data (:mod:`service.app.answers`) for HTTP to render.
"""

from service.app.root import Settlement, require_endpoints

__all__ = ["Settlement", "require_endpoints"]
