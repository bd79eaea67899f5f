"""The composition root: everything one server process holds, built once from ``Settings``.

``Settlement.open`` makes the engine (the worker's one database pool) and the Redis client,
checks the schema is at head and wires every use case with the same injected clock; the HTTP
layer receives the result through Litestar's dependency injection and only calls its use
cases. ``close`` undoes ``open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.accounts import AccountQueries
from service.app.admin import Admin
from service.app.attempts import Attempts
from service.app.console import Console
from service.app.effects import IdempotentRoute
from service.app.evidence import EvidenceIntake
from service.app.feed_events import FeedEvents
from service.app.feed_figures import FeedFigureKeeper
from service.app.feeds import FeedAdmin
from service.app.health import HealthChecks
from service.app.late import LateAnswers
from service.app.observer import FeedObserver
from service.app.purger import Purger, retention_of
from service.app.requests import IdempotentRequests
from service.app.routes import ROUTES
from service.app.status import StatusQueries
from service.app.sweeper import Sweeper
from service.config import ConfigError, FeedSpec, Settings
from service.domain.feeds import FeedClient
from service.domain.payouts import ProviderClient
from service.failpoints import Failpoints
from service.leases import (
    AnyRedis,
    LeaseManager,
    LeaseRedis,
    Wakeups,
    make_lease_redis,
    make_redis,
)
from service.store.db import DatabaseUnavailable, make_engine, reader
from service.store.feeds import FeedStore
from service.store.migrate import ensure_current
from service.store.pool import HotPool
from service.store.pool_watch import watch_pool
from service.store.principals import PrincipalStore
from service.store.retention import RetentionStore
from service.store.settlement import SettlementStore
from service.telemetry import Metrics
from service.telemetry.feed_figures import FigureShelf

__all__ = ["Settlement", "require_endpoints"]

log = logging.getLogger("settlement.leases")
start_log = logging.getLogger("settlement.start")
# The first pause between tries of an unreachable database at start; each doubles, to this.
START_PAUSE = (0.1, 2.0)

# The application_name of the connection that reads the feeds' figures for /metrics (one per
# server: the worker that holds the figures' lock opens it).
FIGURES_CONNECTION = "settlement-feed-figures"


class Settlement:
    """One server process's services and use cases."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        redis: AnyRedis,
        *,
        lease_redis: LeaseRedis,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.engine = engine
        # the engine's pool, borrowed as asyncpg connections: the hot path's statements, the
        # local effects and the read views
        self.pool = pool = HotPool(engine)
        self.reader = reader(engine)  # single-statement reads without BEGIN/ROLLBACK
        self.redis = redis  # pub/sub waits, health checks
        self.lease_redis = lease_redis  # the lease commands' own pool
        self.metrics = metrics or Metrics()
        watch_pool(engine, self.metrics.on_pool)  # the pool gauges of /metrics
        self.wakeups = Wakeups(redis)
        self.health = HealthChecks(self.reader, redis, timeout=settings.health_timeout)
        self.provider: ProviderClient | None = None
        if settings.provider_url and settings.provider_secret:
            # the client's own bound is the late window; each attempt waits provider_timeout
            self.provider = ProviderClient(
                settings.provider_url,
                settings.provider_secret,
                timeout=settings.provider_timeout + settings.late_response_window,
            )
        # the idempotent routes (service.app.routes), by scope name
        self.routes: dict[str, IdempotentRoute] = {spec.route: spec for spec in ROUTES}
        self.retention = retention_of(
            settings,
            {r: s.retention for r, s in self.routes.items() if s.retention is not None},
        )
        self.store = SettlementStore(
            engine,
            hooks=_StoreHooks(self.metrics, self.wakeups),
            policy=settings.terminal_policy,
            retention=self.retention,
            max_retries=settings.settle_max_retries,
            clock=clock,
            pool=pool,
            key_tenants=settings.key_tenants,
            functions=settings.db_claim_settle == "function",
        )
        self.principals = PrincipalStore(engine, pool=pool)
        self.leases = LeaseManager(
            lease_redis,
            ttl=settings.lease_ttl,
            timeout=settings.redis_timeout,
            clock=clock,
            events=self.metrics.on_lease,
        )
        self.failpoints = Failpoints.from_settings(settings)
        self.late = LateAnswers(self.store, self.metrics)
        self.tombstones = RetentionStore(engine, self.retention)
        self.requests = IdempotentRequests(
            store=self.store,
            tombstones=self.tombstones,
            leases=self.leases,
            wakeups=self.wakeups,
            attempts=Attempts(
                store=self.store,
                leases=self.leases,
                late=self.late,
                metrics=self.metrics,
                failpoints=self.failpoints,
                provider_timeout=settings.provider_timeout,
                late_response_window=settings.late_response_window,
                provider=self.provider,
            ),
            failpoints=self.failpoints,
            clock=clock,
            per_principal=settings.max_running_per_principal,
            slot_wait=settings.db_connect_timeout,
        )
        self.evidence = EvidenceIntake(
            self.store,
            secret=settings.provider_secret,
            external_routes=frozenset(r for r, s in self.routes.items() if s.external),
            quarantine_limit=settings.evidence_quarantine_limit,
            quarantine_window=settings.evidence_quarantine_window,
            clock=clock,
        )
        self.status = StatusQueries(
            pool,
            self.leases,
            self.tombstones,
            clock=clock,
            external_routes=frozenset(r for r, s in self.routes.items() if s.external),
        )
        self.account_queries = AccountQueries(pool)
        self.admin = Admin(
            principals=self.principals,
            store=self.store,
            reader=self.reader,
            views=pool,
            leases=self.leases,
            routes=self.routes,
            max_principals=settings.max_principals_per_tenant,
        )
        self.console = Console(
            engine,
            self.principals,
            session_lifetime=settings.console_session_lifetime,
            sign_in_attempts=settings.console_sign_in_attempts,
            sign_in_window=settings.console_sign_in_window,
        )
        self.sweeper = Sweeper(
            self.store, self.leases, self.metrics, interval=settings.sweep_interval
        )
        self.feeds = FeedStore(engine, self.store.runner, settle=self.store.settle_phase_of)
        self.feed_admin = FeedAdmin(
            self.feeds,
            settings.feed_specs(),
            clock=clock,
            external_routes=frozenset(r for r, s in self.routes.items() if s.external),
            stall_after=settings.feed_stall_after,
            events=FeedEvents(
                self.feeds,
                self.store,
                self.tombstones,
                secret=settings.provider_secret,
                external_routes=frozenset(r for r, s in self.routes.items() if s.external),
                failpoints=self.failpoints,
                clock=clock,
                unknown_grace=settings.feed_unknown_grace,
            ),
        )
        # the feeds' figures of /metrics: read in the background (see open), never by a scrape
        self.feed_figures = FeedFigureKeeper(
            FigureShelf(settings.metrics_dir),
            external_routes=frozenset(r for r, s in self.routes.items() if s.external),
            interval=settings.feed_figures_interval,
            clock=clock,
            stall_after=settings.feed_stall_after,
        )
        self.purger = Purger(
            self.tombstones, self.metrics, interval=settings.sweep_interval, clock=clock
        )
        self._sweeping: asyncio.Task[None] | None = None
        self._purging: asyncio.Task[None] | None = None
        self._figuring: asyncio.Task[None] | None = None
        self._figures_engine: AsyncEngine | None = None

    def observer(self, spec: FeedSpec) -> FeedObserver:
        """A feed observer of ``spec`` (its own HTTP client; close it when done)."""
        settings = self.settings
        return FeedObserver(
            spec,
            FeedClient(spec, timeout=settings.feed_timeout),
            self.feeds,
            self.store,
            self.tombstones,
            secret=settings.provider_secret,
            external_routes=frozenset(r for r, s in self.routes.items() if s.external),
            failpoints=self.failpoints,
            clock=self._clock,
            page_size=settings.feed_page_size,
            unknown_grace=settings.feed_unknown_grace,
            poll_interval=settings.feed_poll_interval,
            max_backoff=settings.feed_max_backoff,
            audit_window=settings.feed_audit_window,
        )

    @classmethod
    async def open(
        cls, settings: Settings, *, background: bool = True, metrics: Metrics | None = None
    ) -> Settlement:
        """Connect, check the schema, guarantee the bootstrap admin, start the sweeper and the
        retention purge. ``metrics``: the process's (a new one by default)."""
        require_endpoints(settings)
        assert settings.database_url is not None and settings.redis_url is not None
        engine = make_engine(settings, settings.database_url)
        redis = make_redis(settings, settings.redis_url)
        lease_redis = make_lease_redis(settings, settings.redis_url)
        try:
            await _when_reachable(engine, settings.db_start_wait)
            if not await lease_redis.warm(settings.redis_timeout):
                log.warning(
                    "the Redis Cluster's slots could not be read at start; the first lease "
                    "command reads them",
                    extra={"within_s": settings.redis_timeout},
                )
            settlement = cls(settings, engine, redis, lease_redis=lease_redis, metrics=metrics)
            if background:  # a server's (an observer process claims nothing: it needs none)
                created = await settlement.store.install_functions(
                    spec.effect_sql
                    for spec in settlement.routes.values()
                    if spec.effect_sql is not None
                )
                if created:
                    start_log.info(
                        "created the claim-and-settle functions", extra={"names": created}
                    )
            if settings.bootstrap_admin_key:
                await settlement.principals.ensure_bootstrap_admin(settings.bootstrap_admin_key)
        except BaseException:
            await lease_redis.aclose()
            await redis.aclose()
            await engine.dispose()
            raise
        if background:  # a server process; an observer process runs only its observer
            settlement._sweeping = asyncio.create_task(
                settlement.sweeper.run(), name="lease-sweeper"
            )
            settlement._purging = asyncio.create_task(
                settlement.purger.run(), name="retention-purge"
            )
            # a connection of its own: the feeds' whole-table counts never take one of the
            # request pool's (nor does a scrape, which renders the last figures read)
            figures = settlement._figures_engine = make_engine(
                settings, settings.database_url, pool_size=1, name=FIGURES_CONNECTION
            )
            settlement._figuring = asyncio.create_task(
                settlement.feed_figures.run(
                    FeedStore(
                        figures, settlement.store.runner, settle=settlement.store.settle_phase_of
                    ),
                    figures,  # the open operations' counts too
                ),
                name="feed-figures",
            )
        return settlement

    async def close(self) -> None:
        for task in (self._sweeping, self._purging, self._figuring):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.feed_figures.close()
        try:
            await self.late.close()
            await self.wakeups.close()
            if self.provider is not None:
                await self.provider.close()
        finally:
            await self.lease_redis.aclose()
            await self.redis.aclose()
            await self.engine.dispose()
            if self._figures_engine is not None:
                await self._figures_engine.dispose()


class _StoreHooks:
    """What the store reports: counted by the metrics; a committed settlement that made an
    operation terminal, or ended its attempt without an outcome, wakes the requests waiting
    for it."""

    def __init__(self, metrics: Metrics, wakeups: Wakeups) -> None:
        self._metrics = metrics
        self._wakeups = wakeups

    def on_settled(
        self, source: str, stage: str, disposition: str, seconds: float | None = None
    ) -> None:
        self._metrics.on_settled(source, stage, disposition, seconds)

    def on_claimed(self, kind: str) -> None:
        self._metrics.on_claimed(kind)

    def on_stale_epoch_outcome(self) -> None:
        self._metrics.on_stale_epoch_outcome()

    def on_progress_ended(self, operation_id: str, terminal: bool) -> None:
        self._metrics.on_progress_ended(operation_id, terminal)
        self._wakeups.announce(operation_id)


def require_endpoints(settings: Settings) -> None:
    """A server needs both URLs (``--embedded`` fills in the missing ones)."""
    if settings.database_url is None or settings.redis_url is None:
        raise ConfigError(
            "SETTLEMENT_DATABASE_URL and SETTLEMENT_REDIS_URL must be set "
            "(or start with `settlement serve --embedded`)"
        )


async def _when_reachable(engine: AsyncEngine, within: float) -> None:
    """The schema check, tried again while PostgreSQL cannot be reached, for ``within``
    seconds: a process restarted during a database restart waits for it instead of exiting
    (an observer that exited left its feed unread until something restarted it). A schema
    that is not current is refused at once: waiting cannot fix it."""
    deadline = time.monotonic() + within
    pause, longest = START_PAUSE
    while True:
        try:
            await ensure_current(engine)
            return
        except DatabaseUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            start_log.warning(
                "PostgreSQL is unreachable at start; trying again",
                extra={"error": str(exc), "left_s": round(left, 1)},
            )
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, longest)
