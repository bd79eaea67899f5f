"""Telemetry: metrics (Prometheus text at GET /metrics), reached through small hook methods.

The rest of the service calls :class:`Metrics` hooks; only this package knows how they are
exported. Counters are per process (with several workers, sum across them).
"""

from service.telemetry.metrics import Metrics

__all__ = ["Metrics"]
