"""``make bench``: throughput, latency and memory of the settlement server, with baselines.

Starts embedded PostgreSQL and Redis (not durable) in a temporary directory, then

* the production server (``python -m service.cli serve --workers N``) for the scenarios
  ``replay``, ``new``, ``status`` and ``contention``;
* the same app with two baseline routes (``python -m bench.bare_app``, same uvicorn options)
  for ``bare`` and ``plain-transfer`` (and, with BENCH_LOG_COST=1, ``new`` at log levels INFO
  and WARNING in turn, twice: what the per-request log lines cost);
* pgbench with the server's own SQL for ``pgbench-new`` and ``pgbench-read``.

One scenario at a time, nothing else of the bench running meanwhile. Prints one table and
the ratios and writes them to ``bench/results/<date>.json``; logs go to
``bench/results/<date>-logs/``.

Environment: BENCH_WORKERS (2), BENCH_DURATION (10 s per scenario), BENCH_CONNECTIONS (32),
BENCH_WARMUP (2 s before each wrk scenario), BENCH_CONTENTION_CLIENTS (200), BENCH_SEED
(1000 completed transfers for replay and status), BENCH_LOG_COST (0; 1 adds the log-level
diagnostic, about a minute).
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench import fixtures, session
from bench.fixtures import ROUTE, TRANSFERS, Fixture
from bench.loadgen import (
    ContentionRound,
    LoadResult,
    contention,
    raw_request,
    run_pgbench,
    run_wrk,
    write_requests,
)
from bench.session import NOISE_CORES, RESULTS, Session, env_number, machine, save, say, seed
from bench.stack import ServerProcess, Stack
from bench.usage import Usage, process_cpu_seconds, sample

# uvicorn's workers share one listening socket, and whichever worker wakes first may accept
# every connection wrk opens at once. A run whose busiest worker held more than MAX_SKEW
# times an even share of the connections is measured again, at most BALANCE_RETRIES times.
MAX_SKEW = 1.5
BALANCE_RETRIES = 2


@dataclass(frozen=True)
class Config:
    workers: int
    duration: float
    connections: int
    warmup: float
    contention_clients: int
    seed: int
    log_cost: bool

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            workers=int(env_number("BENCH_WORKERS", 2, 1)),
            duration=env_number("BENCH_DURATION", 10, 1),
            connections=int(env_number("BENCH_CONNECTIONS", 32, 1)),
            warmup=env_number("BENCH_WARMUP", 2, 0),
            contention_clients=int(env_number("BENCH_CONTENTION_CLIENTS", 200, 2)),
            seed=int(env_number("BENCH_SEED", 1000, 1)),
            log_cost=os.environ.get("BENCH_LOG_COST", "0").strip() in ("1", "true", "yes"),
        )


@dataclass
class Row:
    """One line of the table."""

    name: str
    target: str
    result: LoadResult
    usage: Usage | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, **self.result.as_dict()}
        if self.usage is not None:
            out["peak_rss_mib_per_worker"] = self.usage.rss_values
            out["cpu_cores"] = {
                group: round(self.usage.cores(group), 2) for group in self.usage.cpu_seconds
            }
            out["cpu_cores"]["other"] = round(self.usage.other_cores, 2)
            if self.result.requests:
                out["cpu_ms_per_request"] = {
                    group: round(1000 * seconds / self.result.requests, 3)
                    for group, seconds in self.usage.cpu_seconds.items()
                }
            if self.usage.worker_cpu_seconds:
                out["cpu_cores_per_worker"] = self.usage.worker_cores
                out["client_connections_per_worker"] = [
                    self.usage.worker_connections.get(pid, 0)
                    for pid in sorted(self.usage.peak_rss_mib)
                ]
        out["notes"] = self.notes
        out.update(self.extra)
        return out


class Bench:
    def __init__(self, config: Config, stamp: str) -> None:
        self.config = config
        self.stamp = stamp
        self.log_dir = RESULTS / f"{stamp}-logs"
        self.session = Session(self.log_dir)
        self.rows: list[Row] = []
        self.last_log_bytes = 0
        self._attempts: list[tuple[float, str]] = []
        self._rounds: list[ContentionRound] = []

    # -- helpers ---------------------------------------------------------------------------

    def measure(
        self,
        stack: Stack,
        server: ServerProcess | None,
        run: Callable[[], LoadResult],
    ) -> tuple[LoadResult, Usage]:
        workers = server.worker_processes() if server is not None else []
        with sample(
            workers,
            server.client_connections if server is not None else None,
            postgres=stack.postgres_processes,
            redis=stack.redis_processes,
        ) as usage:
            before = process_cpu_seconds()
            result = run()
            after = process_cpu_seconds()
        # the load generator's CPU: wrk / pgbench (reaped children of this process), and this
        # process (the contention client, the sampler)
        usage.cpu_seconds["loadgen"] = after - before
        return result, usage

    def wrk(
        self,
        stack: Stack,
        server: ServerProcess,
        script: str,
        args: list[str],
    ) -> tuple[LoadResult, Usage]:
        cfg = self.config
        url = server.base_url + "/"
        log = self.log_dir / "wrk.log"
        if cfg.warmup > 0:
            run_wrk(url, script, args, duration=cfg.warmup, connections=cfg.connections)
        attempts: list[tuple[LoadResult, Usage, int]] = []
        for attempt in range(1 + BALANCE_RETRIES):
            log_before = server.log_path.stat().st_size
            result, usage = self.measure(
                stack,
                server,
                lambda: run_wrk(
                    url,
                    script,
                    args,
                    duration=cfg.duration,
                    connections=cfg.connections,
                    log_path=log,
                ),
            )
            attempts.append((result, usage, server.log_path.stat().st_size - log_before))
            if _skew(usage) <= MAX_SKEW:
                break
            if attempt < BALANCE_RETRIES:
                say(
                    f"  connections landed unevenly on the workers ({_split(usage)}, "
                    f"{result.rps:.0f} req/s): measuring again"
                )
        result, usage, self.last_log_bytes = min(attempts, key=lambda a: _skew(a[1]))
        self._attempts = [(r.rps, _split(u)) for r, u, _ in attempts]
        return result, usage

    def add(self, row: Row) -> None:
        attempts, self._attempts = self._attempts, []
        if len(attempts) > 1:
            row.notes.append(
                "measured "
                + str(len(attempts))
                + " times as wrk's connections landed unevenly on the workers; kept the most "
                "even: "
                + ", ".join(f"{rps:.0f} req/s with connections {split}" for rps, split in attempts)
            )
            row.extra["attempts"] = [
                {"rps": round(rps, 1), "connections": split} for rps, split in attempts
            ]
        self.rows.append(row)
        r = row.result
        line = (
            f"  {row.name}: {r.rps:.0f} req/s, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, "
            f"non-2xx {r.non_2xx}"
        )
        usage = row.usage
        if usage is not None and usage.worker_cpu_seconds:
            pids = sorted(usage.peak_rss_mib)
            rss = "/".join(f"{v:.0f}" for v in usage.rss_values)
            cores = "/".join(f"{c:.2f}" for c in usage.worker_cores)
            conns = "/".join(str(usage.worker_connections.get(pid, 0)) for pid in pids)
            line += f"; per worker: peak RSS {rss} MiB, cores {cores}, connections {conns}"
        say(line)

    # -- scenarios -------------------------------------------------------------------------

    def production_scenarios(self, stack: Stack, fixture: Fixture) -> None:
        cfg = self.config
        with stack.production_server(cfg.workers) as server:
            say(f"production server up: {server.base_url}, {cfg.workers} worker(s)")
            seed(fixture, server, cfg.seed)

            say("replay: retries of completed transfers (hot keys)")
            requests = write_requests(self.log_dir / "replay.requests", fixture.seed_requests)
            result, usage = self.wrk(stack, server, "cycle.lua", [str(requests)])
            self.add(
                Row(
                    "replay",
                    f"{ROUTE}, {cfg.seed} completed keys",
                    result,
                    usage,
                    [f"wrk cycles through the {cfg.seed} seeded keys; every answer a replay"],
                )
            )

            say("new: fresh transfers with unique keys")
            args = fixture.fresh_args(TRANSFERS, "new")
            result, usage = self.wrk(stack, server, "fresh.lua", args)
            per_request = self._per_request(self.last_log_bytes, result)
            self.add(
                Row(
                    "new",
                    f"{ROUTE}, unique keys",
                    result,
                    usage,
                    [
                        "claim -> lease -> effect -> settle; unique keys from Lua",
                        f"the server logged {per_request:g} bytes per request (INFO, json)",
                    ],
                    {"server_log_bytes_per_request": per_request},
                )
            )

            say("status: GET /v1/operations/{id}")
            auth = {"Authorization": f"Bearer {fixture.api_key}"}
            reads = [
                raw_request("GET", f"/v1/operations/{op}", server.port, auth)
                for op in fixture.operation_ids
            ]
            requests = write_requests(self.log_dir / "status.requests", reads)
            result, usage = self.wrk(stack, server, "cycle.lua", [str(requests)])
            self.add(Row("status", "GET /v1/operations/{id}", result, usage))

            self.contention(stack, server, fixture)
            self.session.server_errors(server, "production server")

    def contention(self, stack: Stack, server: ServerProcess, fixture: Fixture) -> None:
        cfg = self.config
        clients = cfg.contention_clients
        say(f"contention: {clients} clients retry one key until it is terminal")

        async def run() -> tuple[list[ContentionRound], LoadResult]:
            conn = await asyncpg.connect(stack.database_url)

            async def count_effects(key: str) -> tuple[int, int]:
                row = await conn.fetchrow(
                    "SELECT (SELECT count(*) FROM transfers t WHERE t.operation_id = o.id) AS tr,"
                    " (SELECT count(*) FROM attempts a WHERE a.operation_id = o.id) AS att"
                    " FROM operations o WHERE o.tenant = $1 AND o.principal_id = $2::uuid"
                    " AND o.route = $3 AND o.idempotency_key = $4",
                    fixtures.TENANT,
                    fixture.principal_id,
                    ROUTE,
                    key,
                )
                return (0, 0) if row is None else (int(row["tr"]), int(row["att"]))

            try:
                pair = iter(range(10**9))
                return await contention(
                    server.port,
                    lambda key: fixture.transfer_request(
                        server.port, key, next(pair) % fixtures.PAIRS + 1
                    ),
                    clients=clients,
                    duration=cfg.duration,
                    count_effects=count_effects,
                )
            finally:
                await conn.close()

        result, usage = self.measure(stack, server, lambda: self._contention(run))
        rounds = self._rounds
        executions = sorted({r.executions for r in rounds})
        attempts = sorted({r.attempts for r in rounds})
        finals: dict[str, int] = {}
        for r in rounds:
            for status, n in r.finals.items():
                finals[str(status)] = finals.get(str(status), 0) + n
        exactly_once = executions == [1] and attempts == [1]
        identical = all(r.distinct_final_bodies == 1 for r in rounds)
        in_progress = sum(r.in_progress for r in rounds)
        notes = [
            "method: asyncio HTTP/1.1 keep-alive client in this process (not wrk), "
            f"{clients} connections; each round a new key sent by all at once, each client "
            "retries at once on every 409 until another answer; latency client-side",
            "p50/p99 are of the 409 answers only; req/s counts every answer",
            f"{len(rounds)} rounds, {in_progress} x 409, final answers {finals}",
            f"transfers per key {executions}, attempts per key {attempts}: "
            + ("exactly one execution per key" if exactly_once else "NOT exactly one execution"),
            "final bodies identical within each round"
            if identical
            else "final bodies DIFFER within a round",
        ]
        self.add(
            Row(
                "contention",
                f"{ROUTE}, {clients} clients on one key",
                result,
                usage,
                notes,
                {
                    "rounds": len(rounds),
                    "answers_409": in_progress,
                    "final_answers": finals,
                    "transfers_per_key": executions,
                    "attempts_per_key": attempts,
                    "exactly_one_execution": exactly_once,
                    "final_bodies_identical": identical,
                },
            )
        )

    def _contention(
        self, run: Callable[[], Coroutine[Any, Any, tuple[list[ContentionRound], LoadResult]]]
    ) -> LoadResult:
        self._rounds, result = asyncio.run(run())
        return result

    def baseline_scenarios(self, stack: Stack, fixture: Fixture) -> None:
        cfg = self.config
        with stack.baseline_server(cfg.workers) as server:
            say(f"baseline server up: {server.base_url}")
            say("bare: GET /bench/bare, no I/O")
            requests = write_requests(
                self.log_dir / "bare.requests", [raw_request("GET", "/bench/bare", server.port)]
            )
            result, usage = self.wrk(stack, server, "cycle.lua", [str(requests)])
            self.add(Row("bare", "GET /bench/bare (same app, no I/O)", result, usage))

            say("plain-transfer: the ledger transaction without idempotency")
            args = fixture.fresh_args("/bench/plain-transfer", "plain")
            result, usage = self.wrk(stack, server, "fresh.lua", args)
            self.add(
                Row(
                    "plain-transfer",
                    "POST /bench/plain-transfer",
                    result,
                    usage,
                    [
                        "authenticate + one transaction: minimal operation row (FK parent) + "
                        "ledger.transfer; no key, scope read, lease, claim, attempt, observation"
                    ],
                )
            )
            self.session.server_errors(server, "baseline server")

        if cfg.log_cost:
            self.log_cost(stack, fixture)

    def log_cost(self, stack: Stack, fixture: Fixture) -> None:
        """``new`` on the bench app at log level INFO, then WARNING, twice in turn: one run
        each is within run-to-run noise, alternating runs are not."""
        cfg = self.config
        for turn in (1, 2):
            for level in ("INFO", "WARNING"):
                with stack.baseline_server(cfg.workers, log_level=level) as server:
                    say(f"new, log level {level} ({turn}/2; diagnostic: the log lines' cost)")
                    args = fixture.fresh_args(TRANSFERS, f"log{turn}{level.lower()}")
                    result, usage = self.wrk(stack, server, "fresh.lua", args)
                    self.add(
                        Row(
                            f"new@{level}-{turn}",
                            f"{ROUTE}, unique keys, bench app, root log level {level}",
                            result,
                            usage,
                            [f"diagnostic: bench.bare_app with BENCH_LOG_LEVEL={level}"],
                        )
                    )
                    self.session.server_errors(server, f"baseline server ({level} {turn})")

    def pgbench_scenarios(self, stack: Stack, fixture: Fixture) -> None:
        cfg = self.config
        variables = {
            "key_hash": fixture.key_hash,
            "tenant": fixtures.TENANT,
            "principal": fixture.principal_id,
            "pairs": str(fixtures.PAIRS),
            "seeded": str(cfg.seed),
        }
        work = self.log_dir
        log = self.log_dir / "pgbench.log"
        for name, script, what in (
            ("pgbench-new", "new.sql", "the SQL of one new transfer (23 statements)"),
            ("pgbench-read", "read.sql", "the SQL of one replay (6 statements)"),
        ):
            say(f"{name}: {what}")
            result, usage = self.measure(
                stack,
                None,
                functools.partial(
                    run_pgbench,
                    script,
                    port=stack.pg_port,
                    variables=variables,
                    duration=cfg.duration,
                    clients=cfg.connections,
                    work_dir=work,
                    log_path=log,
                ),
            )
            self.add(
                Row(
                    name,
                    f"bench/sql/{script}",
                    result,
                    usage,
                    [
                        f"pgbench -M prepared -c {cfg.connections}: {what}; "
                        "latency per transaction from its -l log"
                    ],
                )
            )

    @staticmethod
    def _per_request(log_bytes: int, result: LoadResult) -> float:
        return round(log_bytes / result.requests, 1) if result.requests else 0.0

    # -- the whole run ---------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        with self.session.start() as (stack, fixture):
            self.production_scenarios(stack, fixture)
            self.baseline_scenarios(stack, fixture)
            self.pgbench_scenarios(stack, fixture)
        return self.report(self.session.seconds)

    # -- output ----------------------------------------------------------------------------

    def report(self, seconds: float) -> dict[str, Any]:
        by_name = {row.name: row for row in self.rows}

        def ratio(a: str, b: str) -> float | None:
            if a not in by_name or b not in by_name or not by_name[b].result.rps:
                return None
            return round(by_name[a].result.rps / by_name[b].result.rps, 3)

        ratios = {
            "replay / bare": ratio("replay", "bare"),
            "new / plain-transfer": ratio("new", "plain-transfer"),
            "new / pgbench-new": ratio("new", "pgbench-new"),
            "replay / pgbench-read": ratio("replay", "pgbench-read"),
        }
        info = [by_name[f"new@INFO-{t}"].result.rps for t in (1, 2) if f"new@INFO-{t}" in by_name]
        warning = [
            by_name[f"new@WARNING-{t}"].result.rps for t in (1, 2) if f"new@WARNING-{t}" in by_name
        ]
        if info and warning and sum(warning):
            ratios["new@INFO / new@WARNING"] = round(sum(info) / sum(warning), 3)
        print()
        print(self.table())
        print()
        print("throughput ratios:")
        for name, value in ratios.items():
            print(f"  {name:<24} {'-' if value is None else f'{value:.3f}'}")
        print()
        print("notes:")
        for row in self.rows:
            for note in row.notes:
                print(f"  {row.name}: {note}")
        noisy = [
            f"{row.name} {row.usage.other_cores:.2f}"
            for row in self.rows
            if row.usage is not None and row.usage.other_cores > NOISE_CORES
        ]
        if noisy:
            print(
                "  WARNING: other work on the machine took CPU during "
                + ", ".join(noisy)
                + " (cores): those numbers are low and noisy; run again on a quiet machine"
            )
        for what, counts in self.session.server_log_counts.items():
            print(
                f"  {what} log: {counts['error_lines']} error lines, "
                f"{counts['client_disconnects']} 'client disconnected prematurely' (requests "
                f"in flight when wrk stopped), {counts['warning_lines']} warning lines"
            )
        cfg = self.config
        print(
            f"  {os.cpu_count()} CPUs shared by server, PostgreSQL, Redis and the load "
            f"generator; wrk -t2 -c{cfg.connections}, {cfg.duration:g}s per scenario after "
            f"{cfg.warmup:g}s warm-up; cpu = cores used (app workers / PostgreSQL / loadgen)"
        )
        document = {
            "date": self.stamp,
            "config": cfg.__dict__,
            "machine": machine(),
            "scenarios": {row.name: row.as_dict() for row in self.rows},
            "ratios": ratios,
            "server_logs": self.session.server_log_counts,
            "machine_busy_cores_before_run": round(self.session.busy_before, 2),
            "total_seconds": round(seconds, 1),
        }
        save(document, f"{self.stamp}.json", seconds)
        return document

    def table(self) -> str:
        header = (
            f"{'scenario':<15} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
            f"{'5xx':>5} {'peak RSS/worker MiB':>20} {'conns/worker':>12} "
            f"{'cores app/pg/load/other':>24} {'CPU ms/req app/pg':>18}  target"
        )
        lines = [header, "-" * len(header)]
        for row in self.rows:
            r = row.result
            rss = "/".join(f"{v:.0f}" for v in row.usage.rss_values) if row.usage else "-"
            rss = rss or "-"
            cpu = "-"
            if row.usage is not None:
                groups = ("workers", "postgres", "loadgen")
                cpu = "/".join(f"{row.usage.cores(g):.2f}" for g in groups)
                cpu += f"/{row.usage.other_cores:.2f}"
            errors = str(r.failures)
            if row.name == "contention":
                errors = f"{r.failures - r.statuses.get('409', 0)}*"
            conns = _split(row.usage) if row.usage and row.usage.worker_connections else "-"
            per_request = "-"
            if row.usage is not None and r.requests:
                app, pg = (row.usage.cpu_seconds.get(g, 0.0) for g in ("workers", "postgres"))
                per_request = f"{1000 * app / r.requests:.2f}/{1000 * pg / r.requests:.2f}"
            lines.append(
                f"{row.name:<15} {r.rps:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
                f"{errors:>7} {r.server_errors:>5} {rss:>20} {conns:>12} {cpu:>24} "
                f"{per_request:>18}  {row.target}"
            )
        lines.append(
            "errors: non-2xx answers + transport errors (wrk) or failed transactions (pgbench); "
            "* contention: without its 409s, which are the expected answers (p50/p99 are theirs)"
        )
        lines.append(
            "conns/worker: most client connections each worker held at once; cores: CPU used "
            "by the app workers / PostgreSQL / the load generator / anything else on the "
            "machine, averaged over the scenario; CPU ms/req: CPU time of the app workers / "
            "of PostgreSQL per request (less noisy than req/s on a shared machine)"
        )
        return "\n".join(lines)


def _skew(usage: Usage) -> float:
    """How unevenly the client connections sat on the workers: the busiest worker's share
    over an even share (1.0 is even; 2.0 with two workers is all on one)."""
    counts = list(usage.worker_connections.values())
    if len(counts) < 2 or not sum(counts):
        return 1.0
    return max(counts) * len(counts) / sum(counts)


def _split(usage: Usage) -> str:
    return "/".join(str(usage.worker_connections[pid]) for pid in sorted(usage.worker_connections))


def main() -> int:
    config = Config.from_env()
    return session.main(lambda stamp: Bench(config, stamp).run())


if __name__ == "__main__":
    sys.exit(main())
