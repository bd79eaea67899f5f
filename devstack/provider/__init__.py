"""A downstream payment provider simulator that honours ``Idempotency-Key`` as a sink key.

A separate Litestar app with its own SQLite store, so its payments survive its restart. It
signs evidence of every outcome with the shared provider secret (see ``service.evidence``)
and has a fault control (``/_sim/faults``) for tests and demos.
"""

from devstack.provider.app import create_provider_app
from devstack.provider.run import serve

__all__ = ["create_provider_app", "serve"]
