"""How ``make bench`` runs a scenario: the configuration, the usage sampled around each load
run, wrk's warm-up and the re-measure of a run whose connections landed unevenly on the
workers, and the rows of the table as they are measured.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.fixtures import Fixture
from bench.loadgen import LoadResult, run_wrk
from bench.session import Session, env_number, say
from bench.stack import ServerProcess, Stack
from bench.usage import Usage, process_cpu_seconds, sample

# A server's workers (granian's, uvicorn's) share one listening socket, and whichever
# worker wakes first may accept every connection wrk opens at once. A run whose busiest
# worker held more than MAX_SKEW times an even share of the connections is measured again,
# at most BALANCE_RETRIES times.
MAX_SKEW = 1.5
BALANCE_RETRIES = 2
# The servers a peer can run under (bench.stack.Stack.peer_server).
PEER_SERVERS = ("granian", "uvicorn")
# The process groups that serve a request, whose CPU per request is summed as SERVED.
SERVED_GROUPS = ("workers", "postgres", "redis")
SERVED = "workers+postgres+redis"


@dataclass(frozen=True)
class Config:
    workers: int
    duration: float
    connections: int
    warmup: float
    contention_clients: int
    seed: int
    log_cost: bool
    # rounds of the rows that make the ratios, each round in another order (bench.scenarios)
    rounds: int = 3
    # the peers' server: "" for each peer's own (bench.peer_scenarios.PEER_SERVER), else one
    # of PEER_SERVERS for both
    peer_server: str = ""
    # also measure each peer's replay and new under the other server, as <row>@<server>
    peer_trial: bool = False

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            workers=int(env_number("BENCH_WORKERS", 2, 1)),
            duration=env_number("BENCH_DURATION", 10, 1),
            connections=int(env_number("BENCH_CONNECTIONS", 32, 1)),
            warmup=env_number("BENCH_WARMUP", 2, 0),
            contention_clients=int(env_number("BENCH_CONTENTION_CLIENTS", 200, 2)),
            seed=int(env_number("BENCH_SEED", 1000, 1)),
            log_cost=_flag("BENCH_LOG_COST"),
            rounds=int(env_number("BENCH_ROUNDS", 3, 1)),
            peer_server=_peer_server(),
            peer_trial=_flag("BENCH_PEER_TRIAL"),
        )


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes")


def _peer_server() -> str:
    raw = os.environ.get("BENCH_PEER_SERVER", "").strip().lower()
    if raw and raw not in PEER_SERVERS:
        raise SystemExit(f"BENCH_PEER_SERVER must be one of {', '.join(PEER_SERVERS)}, got {raw!r}")
    return raw


@dataclass
class Row:
    """One measurement of a scenario: a line of the table, or one round of one (``round``,
    from 1; None for a row measured outside the rounds)."""

    name: str
    target: str
    result: LoadResult
    usage: Usage | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    round: int | None = None

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
                out["cpu_ms_per_request"][SERVED] = round(self.cpu_ms_per_request(), 3)
                out["cpu_ms_per_request_within"] = {
                    part: round(1000 * seconds / self.result.requests, 3)
                    for part, seconds in self.usage.within.items()
                }
                out["redis_commands_per_request"] = round(
                    self.usage.redis_commands / self.result.requests, 2
                )
            if self.usage.worker_cpu_seconds:
                out["cpu_cores_per_worker"] = self.usage.worker_cores
                out["client_connections_per_worker"] = [
                    self.usage.worker_connections.get(pid, 0)
                    for pid in sorted(self.usage.peak_rss_mib)
                ]
        out["notes"] = self.notes
        out.update(self.extra)
        return out

    def cpu_ms_per_request(self) -> float:
        """CPU milliseconds per request of what serves it: the app workers, PostgreSQL and
        Redis (not the load generator); 0.0 without usage or requests."""
        if self.usage is None or not self.result.requests:
            return 0.0
        seconds = sum(self.usage.cpu_seconds.get(group, 0.0) for group in SERVED_GROUPS)
        return 1000 * seconds / self.result.requests

    def cpu_ms(self, group: str) -> float | None:
        """CPU milliseconds per request of one process group (``SERVED``: their sum); None
        without usage or requests."""
        if self.usage is None or not self.result.requests:
            return None
        if group == SERVED:
            return self.cpu_ms_per_request()
        return 1000 * self.usage.cpu_seconds.get(group, 0.0) / self.result.requests


Scenario = Callable[["Runner", Stack, Fixture], None]


@dataclass
class System:
    """What runs in every round, kept up across them: one server (or pgbench) and its units,
    each measuring one row of the round (``Runner.round``)."""

    name: str
    units: list[Callable[[], None]]


class Runner:
    """One ``make bench`` run: its session and the rows measured so far."""

    def __init__(self, config: Config, stamp: str) -> None:
        self.config = config
        self.session = Session(stamp)
        self.rows: list[Row] = []
        # the round being measured (from 1), None outside the rounds; Runner.add stamps it
        self.round: int | None = None
        # the systems in the order each round ran them
        self.round_order: list[list[str]] = []
        # bytes the server logged during the last wrk run kept
        self.last_log_bytes = 0
        # every wrk run of the last wrk scenario: its warm-up, then each measured attempt
        self.last_runs: list[LoadResult] = []
        self._attempts: list[tuple[float, str]] = []

    def run(self, scenarios: Sequence[Scenario]) -> Runner:
        """Start the stack, run the scenarios in turn, stop the stack; this runner, measured."""
        with self.session.start() as (stack, fixture):
            for scenario in scenarios:
                scenario(self, stack, fixture)
        return self

    def measure(
        self,
        stack: Stack,
        server: ServerProcess | None,
        run: Callable[[], LoadResult],
    ) -> tuple[LoadResult, Usage]:
        workers = server.worker_processes() if server is not None else []
        commands = stack.redis_commands()
        with sample(
            workers,
            server.client_connections if server is not None else None,
            postgres=stack.postgres_processes,
            redis=stack.redis_processes,
            postgres_background=stack.postgres_background,
        ) as usage:
            before = process_cpu_seconds()
            result = run()
            after = process_cpu_seconds()
        # a part of "postgres", kept apart so no CPU is counted twice
        usage.within["postgres_background"] = usage.cpu_seconds.pop("postgres_background", 0.0)
        # the load generator's CPU: wrk / pgbench (reaped children of this process), and this
        # process (the contention client, the sampler)
        usage.cpu_seconds["loadgen"] = after - before
        usage.redis_commands = stack.redis_commands() - commands
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
        log = self.session.log_dir / "wrk.log"
        self.last_runs = []
        if cfg.warmup > 0:
            self.last_runs.append(
                run_wrk(url, script, args, duration=cfg.warmup, connections=cfg.connections)
            )
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
            self.last_runs.append(result)
            if _skew(usage) <= MAX_SKEW:
                break
            if attempt < BALANCE_RETRIES:
                say(
                    f"  connections landed unevenly on the workers ({usage.connection_split}, "
                    f"{result.rps:.0f} req/s): measuring again"
                )
        result, usage, self.last_log_bytes = min(attempts, key=lambda a: _skew(a[1]))
        self._attempts = [(r.rps, u.connection_split) for r, u, _ in attempts]
        return result, usage

    def add(self, row: Row) -> None:
        if row.round is None:
            row.round = self.round
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
        usage = row.usage
        background = 0.0 if usage is None else usage.within.get("postgres_background", 0.0)
        if usage is not None and row.result.requests:
            per_request = 1000 / row.result.requests
            row.notes.append(
                f"PostgreSQL's own processes (autovacuum, checkpointer, writers): "
                f"{background * per_request:.3f} of its "
                f"{usage.cpu_seconds.get('postgres', 0.0) * per_request:.3f} ms CPU per request"
            )
        self.rows.append(row)
        r = row.result
        line = (
            f"  {row.name}{'' if row.round is None else f' (round {row.round})'}: "
            f"{r.rps:.0f} req/s, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, "
            f"non-2xx {r.non_2xx}"
        )
        if usage is not None and usage.worker_cpu_seconds:
            pids = sorted(usage.peak_rss_mib)
            rss = "/".join(f"{v:.0f}" for v in usage.rss_values)
            cores = "/".join(f"{c:.2f}" for c in usage.worker_cores)
            conns = "/".join(str(usage.worker_connections.get(pid, 0)) for pid in pids)
            line += f"; per worker: peak RSS {rss} MiB, cores {cores}, connections {conns}"
        say(line)


def _skew(usage: Usage) -> float:
    """How unevenly the client connections sat on the workers: the busiest worker's share
    over an even share (1.0 is even; 2.0 with two workers is all on one)."""
    counts = list(usage.worker_connections.values())
    if len(counts) < 2 or not sum(counts):
        return 1.0
    return max(counts) * len(counts) / sum(counts)
