"""Health: GET /health (each dependency, now), /livez (the process) and /readyz (can it serve).

/readyz is ready when the database answers: it is the only authority, and replays need
nothing else. Redis down is reported as degraded with 200, since replays of finished
operations still work (new work gets 503 lease-unavailable until Redis is back).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request, Response, get

from service.app.health import DependencyState
from service.domain.principals import Role
from service.http.auth import AuthError, authenticate, require_role
from service.http.deps import Services
from service.http.problems import problem_response

__all__ = ["Health", "Liveness", "Readiness", "health", "livez", "metrics", "readyz"]


class Health(msgspec.Struct):
    status: Literal["ok", "degraded"]
    database: DependencyState
    redis: DependencyState


class Liveness(msgspec.Struct):
    status: Literal["ok"]


class Readiness(msgspec.Struct):
    """``ready``: the database answers (``redis`` may be ``degraded``); else ``unavailable``."""

    status: Literal["ready", "unavailable"]
    database: DependencyState
    redis: Literal["ok", "degraded"]


@get("/health", operation_id="health", summary="Both dependencies, checked now")
async def health(settlement: Services) -> Response[Health]:
    checked = await settlement.health.check()
    database, redis = checked.database, checked.redis
    healthy = database == "ok" and redis == "ok"
    return Response(
        Health(status="ok" if healthy else "degraded", database=database, redis=redis),
        status_code=200 if healthy else 503,
    )


@get("/livez", operation_id="livez", summary="The process is up (no dependency is asked)")
async def livez() -> Response[Liveness]:
    return Response(Liveness(status="ok"))


@get("/readyz", operation_id="readyz", summary="Ready to serve: the database answers")
async def readyz(settlement: Services) -> Response[Readiness]:
    checked = await settlement.health.check()
    database, redis = checked.database, checked.redis
    ready = database == "ok"
    return Response(
        Readiness(
            status="ready" if ready else "unavailable",
            database=database,
            redis="ok" if redis == "ok" else "degraded",
        ),
        status_code=200 if ready else 503,
    )


@get(
    "/metrics",
    media_type="text/plain; version=0.0.4",
    operation_id="metrics",
    summary="Prometheus text exposition",
)
async def metrics(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    """Prometheus text exposition of the server's metrics (every worker's) and the feeds'
    figures last read in the background (no table is read here): only for an API key of
    SETTLEMENT_METRICS_ROLE's role (default admin) or an admin, or anyone with ``none``."""
    wanted = settlement.settings.metrics_role
    if wanted != "none":
        try:
            principal = await authenticate(request, settlement.principals)
            require_role(principal, Role(wanted), Role.ADMIN)
        except AuthError as exc:
            return problem_response(exc.slug, exc.detail)
    text = settlement.metrics.render() + settlement.feed_figures.exposition()
    return Response(text.encode(), media_type="text/plain; version=0.0.4")
