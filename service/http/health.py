"""GET /health: does each dependency answer right now, within its timeout?"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Request, Response, get

from service.http.auth import AuthError, authenticate, require_role
from service.http.deps import Services
from service.http.problems import problem_response
from service.leases import ping as redis_ping
from service.store.db import ping as database_ping
from service.store.principals import Role

__all__ = ["health", "metrics"]

log = logging.getLogger("settlement.health")


class Health(msgspec.Struct):
    status: str
    database: str
    redis: str


async def _check(name: str, probe: Callable[[], Awaitable[None]], limit: float) -> str:
    try:
        async with asyncio.timeout(limit):
            await probe()
    except TimeoutError:
        log.warning("health check timed out", extra={"dependency": name, "timeout": limit})
        return "timeout"
    except Exception as exc:  # any failure means "down"; the reason goes to the log
        log.warning("health check failed", extra={"dependency": name, "error": repr(exc)})
        return "unavailable"
    return "ok"


@get("/health")
async def health(settlement: Services) -> Response[Health]:
    timeout = settlement.settings.health_timeout
    database, redis = await asyncio.gather(
        _check("database", lambda: database_ping(settlement.reader), timeout),
        _check("redis", lambda: redis_ping(settlement.redis), timeout),
    )
    healthy = database == "ok" and redis == "ok"
    return Response(
        Health(status="ok" if healthy else "degraded", database=database, redis=redis),
        status_code=200 if healthy else 503,
    )


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    """Prometheus text exposition of the server's metrics (every worker's); with
    SETTLEMENT_METRICS_ROLE set, only for an API key of that role (or an admin)."""
    wanted = settlement.settings.metrics_role
    if wanted != "none":
        try:
            principal = await authenticate(request, settlement.principals)
            require_role(principal, Role(wanted), Role.ADMIN)
        except AuthError as exc:
            return problem_response(exc.slug, exc.detail)
    text = await settlement.metrics.scrape() + await settlement.feed_admin.metrics()
    return Response(text.encode(), media_type="text/plain; version=0.0.4")
