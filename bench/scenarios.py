"""The scenarios of ``make bench`` (``ALL``): ``interleaved`` starts every server once (the
production server, the same in SETTLEMENT_DB_CLAIM_SETTLE=function, the same app under
uvicorn, the baseline app, the peers of
``bench.peer_scenarios``), runs every row a ratio needs in ``BENCH_ROUNDS`` rounds, the order
turned each round (``bench.rounds.rotated``), pgbench's rows among them, then ``status`` and
``contention`` once; then, with BENCH_LOG_COST=1, ``log_cost``. Each adds its rows to the
runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import Callable
from pathlib import Path

import asyncpg

from bench import fixtures, pgbench_sql
from bench.client import ContentionRound
from bench.client import contention as run_contention
from bench.fixtures import ROUTE, TRANSFERS, Fixture
from bench.loadgen import SQL, LoadResult, raw_request, run_pgbench, write_requests
from bench.peer_scenarios import peer_systems
from bench.rounds import rotated
from bench.runner import Row, Runner, Scenario, System
from bench.session import say, seed
from bench.stack import ServerProcess, Stack


def interleaved(runner: Runner, stack: Stack, fixture: Fixture) -> None:
    """Every server up at once and seeded (the production server, uvicorn's, the baseline
    app, each peer), then ``BENCH_ROUNDS`` rounds of every row the ratios need: ours and the
    peers' systems in turn, each round in another order (``bench.rounds.rotated``: the
    systems, and the rows within each); then ``status`` and ``contention`` once. A server stays
    up across the rounds, so that each row, in every round, pays the same warm-up
    (``BENCH_WARMUP`` of wrk's load) and none pays a start."""
    cfg = runner.config
    with contextlib.ExitStack() as servers:

        def up(server: ServerProcess, what: str) -> ServerProcess:
            servers.enter_context(server)
            servers.callback(runner.session.server_errors, server, what)
            say(f"{what} up: {server.base_url}, {cfg.workers} worker(s)")
            return server

        production = up(stack.production_server(cfg.workers), "production server")
        seed(fixture, production, cfg.seed)
        as_function = up(
            stack.production_server(cfg.workers, claim_settle="function"),
            "production server, claim-and-settle as a function",
        )
        under_uvicorn = up(stack.uvicorn_server(cfg.workers), "uvicorn server")
        baseline = up(stack.baseline_server(cfg.workers), "baseline server")
        ours = [
            System(
                "settlement serve",
                [
                    functools.partial(replay, runner, stack, production, fixture),
                    functools.partial(new, runner, stack, production, fixture),
                ],
            ),
            System(
                "settlement serve, function",
                [functools.partial(new, runner, stack, as_function, fixture, "new-function")],
            ),
            System("bench.bare_app", _baseline_units(runner, stack, baseline, fixture)),
            System("uvicorn", _uvicorn_units(runner, stack, under_uvicorn, fixture)),
            System("pgbench", _pgbench_units(runner, stack, fixture)),
        ]
        theirs = peer_systems(runner, stack, fixture, servers)
        systems = [
            system
            for pair in itertools.zip_longest(ours, theirs)
            for system in pair
            if system is not None
        ]
        for turn in range(cfg.rounds):
            runner.round = turn + 1
            order = rotated(systems, turn, cfg.rounds)
            runner.round_order.append([system.name for system in order])
            say(f"round {turn + 1}/{cfg.rounds}: " + ", ".join(s.name for s in order))
            for system in order:
                for unit in rotated(system.units, turn):
                    unit()
        runner.round = None
        status(runner, stack, production, fixture)
        contention(runner, stack, production, fixture)


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
                "identify -> claim, effect and settle in one statement, no lease (one "
                "statement needs none); unique keys from Lua",
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


def _uvicorn_units(
    runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture
) -> list[Callable[[], None]]:
    """``uvicorn-replay`` and ``uvicorn-new``: the production app under uvicorn (httptools,
    uvloop), the server ``settlement serve`` ran before granian and its limits; the same
    requests as ``replay`` and ``new`` (the seeded keys are in the database already)."""

    def replayed() -> None:
        say("uvicorn-replay: the replay requests, under uvicorn")
        logs = runner.session.log_dir
        requests = write_requests(logs / "uvicorn-replay.requests", fixture.seed_requests)
        result, usage = runner.wrk(stack, server, "cycle.lua", [str(requests)])
        runner.add(Row("uvicorn-replay", f"{ROUTE}, the app under uvicorn", result, usage))

    def fresh() -> None:
        say("uvicorn-new: fresh transfers, under uvicorn")
        args = fixture.fresh_args(TRANSFERS, "uvicorn-new")
        result, usage = runner.wrk(stack, server, "fresh.lua", args)
        runner.add(Row("uvicorn-new", f"{ROUTE}, unique keys, under uvicorn", result, usage))

    return [replayed, fresh]


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


def _baseline_units(
    runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture
) -> list[Callable[[], None]]:
    """``bare`` and ``plain-transfer`` on ``bench.bare_app``."""

    def bare() -> None:
        say("bare: GET /bench/bare, no I/O")
        requests = write_requests(
            runner.session.log_dir / "bare.requests",
            [raw_request("GET", "/bench/bare", server.port)],
        )
        result, usage = runner.wrk(stack, server, "cycle.lua", [str(requests)])
        runner.add(Row("bare", "GET /bench/bare (same app, no I/O)", result, usage))

    def plain() -> None:
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

    return [bare, plain]


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


def _pgbench_units(runner: Runner, stack: Stack, fixture: Fixture) -> list[Callable[[], None]]:
    """The server's own SQL of one new transfer and of one replay, and the least SQL of a
    transfer, driven by pgbench: one unit each."""
    variables = {
        "key_hash": fixture.key_hash,
        "tenant": fixtures.TENANT,
        "principal": fixture.principal_id,
        "pairs": str(fixtures.PAIRS),
        "seeded": str(runner.config.seed),
    }
    # the server's own statements, written from today's code (bench.pgbench_sql)
    scripts = {**pgbench_sql.write_scripts(runner.session.log_dir), "min.sql": SQL / "min.sql"}
    return [
        functools.partial(_pgbench, runner, stack, variables, name, scripts[script], what)
        for name, script, what in (
            (
                "pgbench-new",
                pgbench_sql.NEW,
                "the SQL of one new transfer (2 statements: identify, then one that locks and "
                "checks both accounts, inserts the operation row already settled, and writes "
                "the transfer, the attempt and the observation)",
            ),
            ("pgbench-read", pgbench_sql.READ, "the SQL of one replay (1 statement)"),
            (
                "pgbench-min",
                "min.sql",
                "the least SQL of a transfer (7 statements: BEGIN, the operation row the "
                "transfers foreign key needs, lock both accounts, two updates, the transfer "
                "row, COMMIT)",
            ),
        )
    ]


def _pgbench(
    runner: Runner,
    stack: Stack,
    variables: dict[str, str],
    name: str,
    script: Path,
    what: str,
) -> None:
    """One pgbench row: ``script`` for BENCH_DURATION on BENCH_CONNECTIONS clients."""
    cfg = runner.config
    work = runner.session.log_dir
    say(f"{name}: {what}")
    result, usage = runner.measure(
        stack,
        None,
        functools.partial(
            run_pgbench,
            str(script),
            database_url=stack.database_url,
            variables=variables,
            duration=cfg.duration,
            clients=cfg.connections,
            work_dir=work,
            log_path=work / "pgbench.log",
        ),
    )
    runner.add(
        Row(
            name,
            "bench/sql/min.sql"
            if script.name == "min.sql"
            else f"bench/pgbench_sql.py: {script.name}",
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


ALL: tuple[Scenario, ...] = (interleaved, log_cost)
