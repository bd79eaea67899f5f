"""The scenarios of ``make bench``, in the order they run (``ALL``): the production server's,
then the baseline app's, then the peers' (``bench.peer_scenarios``), then pgbench's. Each adds
its rows to the runner.
"""

from __future__ import annotations

import asyncio
import functools

import asyncpg

from bench import fixtures, pgbench_sql
from bench.client import ContentionRound
from bench.client import contention as run_contention
from bench.fixtures import ROUTE, TRANSFERS, Fixture
from bench.loadgen import SQL, LoadResult, raw_request, run_pgbench, write_requests
from bench.peer_scenarios import peers
from bench.runner import Row, Runner, Scenario
from bench.session import say, seed
from bench.stack import ServerProcess, Stack


def production(runner: Runner, stack: Stack, fixture: Fixture) -> None:
    """``replay``, ``new``, ``status`` and ``contention`` on ``settlement serve``, after
    seeding the replay keys."""
    cfg = runner.config
    with stack.production_server(cfg.workers) as server:
        say(f"production server up: {server.base_url}, {cfg.workers} worker(s)")
        seed(fixture, server, cfg.seed)
        replay(runner, stack, server, fixture)
        new(runner, stack, server, fixture)
        status(runner, stack, server, fixture)
        contention(runner, stack, server, fixture)
        runner.session.server_errors(server, "production server")


def replay(
    runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture, name: str = "replay"
) -> None:
    """Retries of the seeded keys, cycled by wrk: row ``name``."""
    cfg = runner.config
    say(f"{name}: retries of completed transfers (hot keys)")
    requests = write_requests(runner.session.log_dir / f"{name}.requests", fixture.seed_requests)
    result, usage = runner.wrk(stack, server, "cycle.lua", [str(requests)])
    runner.add(
        Row(
            name,
            f"{ROUTE}, {cfg.seed} completed keys",
            result,
            usage,
            [f"wrk cycles through the {cfg.seed} seeded keys; every answer a replay"],
        )
    )


def new(
    runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture, name: str = "new"
) -> None:
    """A new transfer per request, unique keys made in Lua: row ``name``."""
    say(f"{name}: fresh transfers with unique keys")
    args = fixture.fresh_args(TRANSFERS, name)
    result, usage = runner.wrk(stack, server, "fresh.lua", args)
    per_request = _per_request(runner.last_log_bytes, result)
    runner.add(
        Row(
            name,
            f"{ROUTE}, unique keys",
            result,
            usage,
            [
                "identify -> lease -> claim, effect and settle in one statement -> release; "
                "unique keys from Lua",
                f"the server logged {per_request:g} bytes per request (INFO, json)",
            ],
            {"server_log_bytes_per_request": per_request},
        )
    )


def status(
    runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture, name: str = "status"
) -> None:
    """``GET /v1/operations/{id}`` of the seeded operations, cycled by wrk: row ``name``."""
    say(f"{name}: GET /v1/operations/{{id}}")
    auth = {"Authorization": f"Bearer {fixture.api_key}"}
    reads = [
        raw_request("GET", f"/v1/operations/{op}", server.port, auth)
        for op in fixture.operation_ids
    ]
    requests = write_requests(runner.session.log_dir / f"{name}.requests", reads)
    result, usage = runner.wrk(stack, server, "cycle.lua", [str(requests)])
    runner.add(Row(name, "GET /v1/operations/{id}", result, usage))


def uvicorn(runner: Runner, stack: Stack, fixture: Fixture) -> None:
    """``uvicorn-replay`` and ``uvicorn-new``: the production app under uvicorn (httptools,
    uvloop), the server ``settlement serve`` ran before granian and its limits; the same
    requests as ``replay`` and ``new`` (the seeded keys are in the database already)."""
    cfg = runner.config
    logs = runner.session.log_dir
    with stack.uvicorn_server(cfg.workers) as server:
        say(f"uvicorn server up: {server.base_url}, {cfg.workers} worker(s)")
        say("uvicorn-replay: the replay requests, under uvicorn")
        requests = write_requests(logs / "uvicorn-replay.requests", fixture.seed_requests)
        result, usage = runner.wrk(stack, server, "cycle.lua", [str(requests)])
        runner.add(Row("uvicorn-replay", f"{ROUTE}, the app under uvicorn", result, usage))
        say("uvicorn-new: fresh transfers, under uvicorn")
        args = fixture.fresh_args(TRANSFERS, "uvicorn-new")
        result, usage = runner.wrk(stack, server, "fresh.lua", args)
        runner.add(Row("uvicorn-new", f"{ROUTE}, unique keys, under uvicorn", result, usage))
        runner.session.server_errors(server, "uvicorn server")


def contention(runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture) -> None:
    """Many clients on one new key at a time; checks one transfer and one attempt per key."""
    cfg = runner.config
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
            return await run_contention(
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

    rounds: list[ContentionRound] = []

    def drive() -> LoadResult:
        found, result = asyncio.run(run())
        rounds.extend(found)
        return result

    result, usage = runner.measure(stack, server, drive)
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
    runner.add(
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


def baselines(runner: Runner, stack: Stack, fixture: Fixture) -> None:
    """``bare`` and ``plain-transfer`` on ``bench.bare_app``."""
    cfg = runner.config
    with stack.baseline_server(cfg.workers) as server:
        say(f"baseline server up: {server.base_url}")
        say("bare: GET /bench/bare, no I/O")
        requests = write_requests(
            runner.session.log_dir / "bare.requests",
            [raw_request("GET", "/bench/bare", server.port)],
        )
        result, usage = runner.wrk(stack, server, "cycle.lua", [str(requests)])
        runner.add(Row("bare", "GET /bench/bare (same app, no I/O)", result, usage))

        say("plain-transfer: the ledger's SQL without idempotency")
        args = fixture.fresh_args("/bench/plain-transfer", "plain")
        result, usage = runner.wrk(stack, server, "fresh.lua", args)
        runner.add(
            Row(
                "plain-transfer",
                "POST /bench/plain-transfer",
                result,
                usage,
                [
                    "authenticate + one statement: the transfer's guard, a minimal operation "
                    "row (FK parent) and its writes; no key, scope read, lease, claim, "
                    "attempt, observation"
                ],
            )
        )
        runner.session.server_errors(server, "baseline server")


def log_cost(runner: Runner, stack: Stack, fixture: Fixture) -> None:
    """With BENCH_LOG_COST=1 only: ``new`` on the bench app at log level INFO, then WARNING,
    twice in turn: one run each is within run-to-run noise, alternating runs are not."""
    cfg = runner.config
    if not cfg.log_cost:
        return
    for turn in (1, 2):
        for level in ("INFO", "WARNING"):
            with stack.baseline_server(cfg.workers, log_level=level) as server:
                say(f"new, log level {level} ({turn}/2; diagnostic: the log lines' cost)")
                args = fixture.fresh_args(TRANSFERS, f"log{turn}{level.lower()}")
                result, usage = runner.wrk(stack, server, "fresh.lua", args)
                runner.add(
                    Row(
                        f"new@{level}-{turn}",
                        f"{ROUTE}, unique keys, bench app, root log level {level}",
                        result,
                        usage,
                        [f"diagnostic: bench.bare_app with BENCH_LOG_LEVEL={level}"],
                    )
                )
                runner.session.server_errors(server, f"baseline server ({level} {turn})")


def pgbench(runner: Runner, stack: Stack, fixture: Fixture) -> None:
    """The server's own SQL of one new transfer and of one replay, and the least SQL of a
    transfer, driven by pgbench."""
    cfg = runner.config
    variables = {
        "key_hash": fixture.key_hash,
        "tenant": fixtures.TENANT,
        "principal": fixture.principal_id,
        "pairs": str(fixtures.PAIRS),
        "seeded": str(cfg.seed),
    }
    work = runner.session.log_dir
    log = work / "pgbench.log"
    # the server's own statements, written from today's code (bench.pgbench_sql)
    scripts = {**pgbench_sql.write_scripts(work), "min.sql": SQL / "min.sql"}
    for name, script, what in (
        (
            "pgbench-new",
            pgbench_sql.NEW,
            "the SQL of one new transfer (2 statements: identify, then one that locks and "
            "checks both accounts, inserts the operation row already settled, and writes the "
            "transfer, the attempt and the observation)",
        ),
        ("pgbench-read", pgbench_sql.READ, "the SQL of one replay (1 statement)"),
        (
            "pgbench-min",
            "min.sql",
            "the least SQL of a transfer (7 statements: BEGIN, the operation row the "
            "transfers foreign key needs, lock both accounts, two updates, the transfer row, "
            "COMMIT)",
        ),
    ):
        say(f"{name}: {what}")
        result, usage = runner.measure(
            stack,
            None,
            functools.partial(
                run_pgbench,
                str(scripts[script]),
                database_url=stack.database_url,
                variables=variables,
                duration=cfg.duration,
                clients=cfg.connections,
                work_dir=work,
                log_path=log,
            ),
        )
        runner.add(
            Row(
                name,
                "bench/sql/min.sql" if script == "min.sql" else f"bench/pgbench_sql.py: {script}",
                result,
                usage,
                [
                    f"pgbench -M prepared -c {cfg.connections}: {what}; "
                    "latency per transaction from its -l log"
                ],
            )
        )


def _per_request(log_bytes: int, result: LoadResult) -> float:
    return round(log_bytes / result.requests, 1) if result.requests else 0.0


ALL: tuple[Scenario, ...] = (production, uvicorn, baselines, peers, log_cost, pgbench)
