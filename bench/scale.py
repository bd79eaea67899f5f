"""``make bench-scale``: what the server costs on a database that holds a day of operations,
against the same server on an empty one, in one run.

Starts the stack of ``make bench`` (embedded PostgreSQL and Redis, not durable, in a temporary
directory; the production server ``python -m service.cli serve --workers N``; wrk), then:

1. **fill**: BENCH_ROWS settled transfers written with set-based SQL into the stack's
   database (``bench.scale_fill``: operations, attempts, observations, transfers; spread over
   tenants, principals, keys, outcomes and a day of ``created_at``), then ``VACUUM
   (ANALYZE)`` of the filled tables, as autovacuum leaves a table at rest; the size of every
   table and index. A second database on the same PostgreSQL stays empty;
2. **empty and at size in turn**: one production server on each database, BENCH_SEED
   completed transfers seeded through each, then the scenarios ``replay``, ``new`` and
   ``status`` of ``make bench`` (``bench.scenarios``), each on the empty database and then at
   size (``replay@size``, ...), BENCH_SCALE_ROUNDS times (``#2``, ... after the first; the
   at-size side first in even rounds): on a shared machine the load of other programs drifts,
   and taking turns spreads the drift, and what one side's load leaves behind (autovacuum,
   a checkpoint), over both sides. After each run, 11 s for PostgreSQL to flush its
   counters, then the blocks its database's backends found in shared buffers and read from
   outside them (``pg_stat_database``) per request;
3. **plans**: the server's statements at size run once each under ``EXPLAIN (ANALYZE,
   BUFFERS)`` and rolled back (``bench.scale_plans``);
4. **purge**: ``new+purge``, ``new`` at size at full speed while this process drives the
   retention purge (``service.app.purger.Purger.run_once``, the production batch size, on a
   connection of its own) with its clock BENCH_SCALE_EXPIRED x the retention ahead: the
   filled rows that expire within that time (that share of them) are its backlog, as after
   a purge outage of that length. Its rows per second over ``new``'s requests per second.

Nothing filled has expired by the real clock, so the purge loop of each server worker (real
clock) finds nothing to do and the scenarios at size measure the requests alone.

Prints the table of ``make bench`` for these rows, then the ratios at size over empty side
by side (over all rounds), the purge's rate, the sizes per million operations and the
workers' peak RSS; writes them to ``bench/results/<date>-scale.json`` (logs:
``...-scale-logs/``).

Environment: BENCH_ROWS (5,000,000 operations filled), BENCH_SCALE_EXPIRED (0.2: the share of
them the purge finds expired), BENCH_SCALE_ROUNDS (2: turns of empty and at size), and
BENCH_WORKERS, BENCH_DURATION, BENCH_CONNECTIONS, BENCH_WARMUP and BENCH_SEED as ``make bench``.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench import fixtures, scale_report, scenarios, session
from bench.fixtures import Fixture
from bench.runner import Config, Runner
from bench.scale_fill import FILLED_TABLES, Filled, Owner, fill
from bench.scale_plans import explain_all
from bench.session import Session, env_number, say, seed
from bench.stack import ServerProcess, Stack

# The tables whose sizes are reported: the filled ones, and what the purge writes.
SIZED_TABLES = (*FILLED_TABLES, "tombstones", "operation_epochs", "accounts", "principals")
# Batches of the purge per run_once call: one, so its progress is counted batch by batch
# and it stops within one batch of the end of the load.
PURGE_BATCHES_PER_CALL = 1
# Bound of the purge thread's end after it is told to stop (one call in flight).
PURGE_STOP_TIMEOUT = 60.0
# Bound of the fill's connect and of each of its statements (a chunk, a VACUUM).
CONNECT_TIMEOUT = 10.0
STATEMENT_TIMEOUT = 1800.0
# PostgreSQL flushes a backend's counters at most once a second while it works and 10 s after
# it goes idle: the wait after a scenario before its database's counters are read.
STATS_FLUSH_WAIT = 11.0
# The database of the empty side, beside the stack's (which is filled).
EMPTY_DATABASE = "settlement_empty"


@dataclass(frozen=True)
class ScaleConfig:
    rows: int
    expired_share: float
    rounds: int
    retention: float

    @classmethod
    def from_env(cls) -> ScaleConfig:
        from service.config import Settings

        expired = env_number("BENCH_SCALE_EXPIRED", 0.2, 0.0)
        if expired >= 1.0:
            raise SystemExit(f"BENCH_SCALE_EXPIRED must be below 1, got {expired:g}")
        return cls(
            rows=int(env_number("BENCH_ROWS", 5_000_000, 1000)),
            expired_share=expired,
            rounds=int(env_number("BENCH_SCALE_ROUNDS", 2, 1)),
            # the server's own default: filled rows expire as its rows do
            retention=Settings().retention,
        )


@dataclass
class PurgeRun:
    """The purge driven beside the load: rows purged, seconds, and whether the backlog ran
    out before the load ended (then the rate is a lower bound)."""

    ahead: float
    operations: int = 0
    seconds: float = 0.0
    calls: int = 0
    drained: bool = False
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, database_url: str) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run(database_url)), name="purge", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PURGE_STOP_TIMEOUT)
            if self._thread.is_alive():
                self.error = f"the purge did not stop within {PURGE_STOP_TIMEOUT:g}s"

    async def _run(self, database_url: str) -> None:
        from service.app.purger import PURGE_BATCH, Purger
        from service.config import Settings
        from service.store.db import make_engine
        from service.store.retention import Retention, RetentionStore
        from service.telemetry import Metrics

        settings = Settings()
        engine = make_engine(settings, database_url, pool_size=1)
        retention = Retention(default=settings.retention, tombstone=settings.tombstone_retention)
        purger = Purger(
            RetentionStore(engine, retention),
            Metrics(),
            interval=settings.sweep_interval,
            clock=lambda: time.time() + self.ahead,
            batch=PURGE_BATCH,
        )
        began = time.monotonic()
        try:
            while not self._stop.is_set():
                done = await purger.run_once(max_batches=PURGE_BATCHES_PER_CALL)
                # counted after each call: a purge still in a call when the load ends is
                # reported as far as it got
                self.operations += done.operations
                self.calls += 1
                self.seconds = time.monotonic() - began
                if done.operations < PURGE_BATCHES_PER_CALL * PURGE_BATCH:
                    self.drained = True
                    break
        except Exception as exc:  # reported with the results, not raised in a thread
            self.error = repr(exc)
        finally:
            await engine.dispose()

    def as_dict(self) -> dict[str, Any]:
        rate = self.operations / self.seconds if self.seconds else 0.0
        return {
            "clock_ahead_seconds": round(self.ahead, 1),
            "operations_purged": self.operations,
            "seconds": round(self.seconds, 2),
            "operations_per_second": round(rate, 1),
            "run_once_calls": self.calls,
            "backlog_ran_out": self.drained,
            "error": self.error,
        }


class Scale:
    """One ``make bench-scale`` run."""

    def __init__(self, config: Config, scale: ScaleConfig, stamp: str) -> None:
        self.config = config
        self.scale = scale
        self.runner = Runner(config, stamp)
        self.runner.session = Session(stamp, "scale")
        self.filled: Filled | None = None
        self.vacuum_seconds = 0.0
        self.sizes: dict[str, Any] = {}
        self.sizes_after_purge: dict[str, Any] = {}
        self.purge = PurgeRun(ahead=scale.expired_share * scale.retention)
        self.backlog = 0
        self.plans: dict[str, Any] = {}

    def run(self) -> Scale:
        cfg = self.config
        runner = self.runner
        with runner.session.start() as (stack, fixture):
            empty_url, empty_fixture = _empty_database(stack)
            asyncio.run(self._fill(stack, fixture))
            with (
                stack.production_server(cfg.workers) as sized,
                stack.production_server(cfg.workers, database_url=empty_url) as empty,
            ):
                say(f"servers up ({cfg.workers} worker(s) each): at size, and empty")
                seed(empty_fixture, empty, cfg.seed)
                seed(fixture, sized, cfg.seed)
                sides = (
                    ("", empty, empty_fixture, empty_url),
                    ("@size", sized, fixture, stack.database_url),
                )
                for turn in range(1, self.scale.rounds + 1):
                    suffix = "" if turn == 1 else f"#{turn}"
                    # which side goes first alternates: what one side's load leaves behind
                    # (autovacuum, a checkpoint) falls on the other side's next run
                    order = sides if turn % 2 else sides[::-1]
                    for scenario in (scenarios.replay, scenarios.new, scenarios.status):
                        for at, server, used, url in order:
                            name = f"{scenario.__name__}{at}{suffix}"
                            run = functools.partial(scenario, runner, stack, server, used, name)
                            self._counted(url, run)
                runner.session.server_errors(empty, "production server (empty)")
                self.plans = asyncio.run(self._plans(stack, fixture))
                self._purge_beside_new(stack, sized, fixture)
                runner.session.server_errors(sized, "production server (at size)")
            self.sizes_after_purge = asyncio.run(_sizes(stack.database_url))
        return self

    def _counted(self, database_url: str, scenario: Callable[[], None]) -> None:
        """Run ``scenario``, then add to its row the blocks its database's backends found in
        shared buffers and read from outside them, and the requests sent (warm-up too)."""
        before = _blocks(database_url)
        scenario()
        time.sleep(STATS_FLUSH_WAIT)
        after = _blocks(database_url)
        self.runner.rows[-1].extra["shared_blocks"] = {
            "hit": after[0] - before[0],
            "read": after[1] - before[1],
            "requests": sum(r.requests for r in self.runner.last_runs),
        }

    def _purge_beside_new(self, stack: Stack, server: ServerProcess, fixture: Fixture) -> None:
        say(
            f"purge: {self.backlog} expired operations (clock {self.purge.ahead / 3600:.1f} h "
            "ahead) purged while new runs"
        )
        self.purge.start(stack.database_url)
        try:
            scenarios.new(self.runner, stack, server, fixture, "new+purge")
        finally:
            self.purge.stop()
        say(
            f"  purge: {self.purge.operations} operations in {self.purge.seconds:.1f}s"
            + (" (the backlog ran out)" if self.purge.drained else "")
            + (f"; ERROR {self.purge.error}" if self.purge.error else "")
        )

    async def _plans(self, stack: Stack, fixture: Fixture) -> dict[str, Any]:
        """The plans of the server's statements at size, the purge's at its clock."""
        say("plans at size: EXPLAIN (ANALYZE, BUFFERS), rolled back")
        conn = await asyncpg.connect(
            stack.database_url, timeout=CONNECT_TIMEOUT, command_timeout=STATEMENT_TIMEOUT
        )
        try:
            return await explain_all(
                conn,
                key_hash=bytes.fromhex(fixture.key_hash),
                owner=uuid.UUID(fixture.principal_id),
                tenant=fixtures.TENANT,
                purge_now=datetime.now(UTC) + timedelta(seconds=self.purge.ahead),
            )
        finally:
            await conn.close()

    async def _fill(self, stack: Stack, fixture: Fixture) -> None:
        scale = self.scale
        conn = await asyncpg.connect(
            stack.database_url, timeout=CONNECT_TIMEOUT, command_timeout=STATEMENT_TIMEOUT
        )
        try:
            owner = Owner(
                fixtures.TENANT,
                uuid.UUID(fixture.principal_id),
                [fixtures.pair(p) for p in range(1, fixtures.PAIRS + 1)],
            )
            say(f"fill: {scale.rows:,} settled transfers (set-based SQL, in chunks)")

            def progress(done: int, total: int, seconds: float) -> None:
                say(f"  {done:,} / {total:,} operations, {seconds:.0f}s, {done / seconds:,.0f}/s")

            self.filled = await fill(
                conn,
                scale.rows,
                owners=[owner],
                now=datetime.now(UTC),
                retention=scale.retention,
                progress=progress,
            )
            say(f"  filled in {self.filled.seconds:.0f}s; VACUUM (ANALYZE)")
            began = time.monotonic()
            for table in (*FILLED_TABLES, "principals", "accounts"):
                await conn.execute(f"VACUUM (ANALYZE) {table}")
            self.vacuum_seconds = time.monotonic() - began
            say(f"  vacuumed in {self.vacuum_seconds:.0f}s")
            self.backlog = await conn.fetchval(
                "SELECT count(*) FROM operations WHERE state IN ('completed', 'failed')"
                " AND expires_at <= now() + make_interval(secs => $1)",
                self.purge.ahead,
            )
        finally:
            await conn.close()
        self.sizes = await _sizes(stack.database_url)


def _empty_database(stack: Stack) -> tuple[str, Fixture]:
    """A second database on the same PostgreSQL, migrated, with a bench client and accounts
    of its own: the empty side of the comparison."""
    from service.store.migrate import upgrade

    async def create() -> None:
        conn = await asyncpg.connect(stack.database_url, timeout=CONNECT_TIMEOUT)
        try:
            await conn.execute(f'CREATE DATABASE "{EMPTY_DATABASE}"')
        finally:
            await conn.close()

    asyncio.run(create())
    url = urlunsplit(urlsplit(stack.database_url)._replace(path=f"/{EMPTY_DATABASE}"))
    upgrade(url)
    return url, asyncio.run(fixtures.create(url))


def _blocks(database_url: str) -> tuple[int, int]:
    """Shared buffers hit and blocks read (from the OS: not in shared buffers) by every
    backend of the database so far (``pg_stat_database``)."""

    async def read() -> tuple[int, int]:
        conn = await asyncpg.connect(database_url, timeout=CONNECT_TIMEOUT, command_timeout=30)
        try:
            row = await conn.fetchrow(
                "SELECT blks_hit, blks_read FROM pg_stat_database"
                " WHERE datname = current_database()"
            )
        finally:
            await conn.close()
        assert row is not None
        return int(row["blks_hit"]), int(row["blks_read"])

    return asyncio.run(read())


async def _sizes(database_url: str) -> dict[str, Any]:
    """Rows, heap, index and total bytes of each of SIZED_TABLES, and each index's bytes."""
    conn = await asyncpg.connect(
        database_url, timeout=CONNECT_TIMEOUT, command_timeout=STATEMENT_TIMEOUT
    )
    try:
        out: dict[str, Any] = {}
        for table in SIZED_TABLES:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM " + table + ") AS rows,"
                " pg_relation_size($1::regclass) AS heap,"
                " pg_indexes_size($1::regclass) AS indexes,"
                " pg_total_relation_size($1::regclass) AS total",
                table,
            )
            assert row is not None
            indexes = await conn.fetch(
                "SELECT i.indexrelid::regclass::text AS name,"
                " pg_relation_size(i.indexrelid) AS bytes"
                " FROM pg_index i WHERE i.indrelid = $1::regclass ORDER BY 2 DESC",
                table,
            )
            out[table] = {
                "rows": int(row["rows"]),
                "heap_bytes": int(row["heap"]),
                "index_bytes": int(row["indexes"]),
                "total_bytes": int(row["total"]),
                "indexes": {r["name"]: int(r["bytes"]) for r in indexes},
            }
        return out
    finally:
        await conn.close()


def main() -> int:
    config = Config.from_env()
    scale = ScaleConfig.from_env()
    return session.main(lambda stamp: scale_report.write(Scale(config, scale, stamp).run()))


if __name__ == "__main__":
    sys.exit(main())
