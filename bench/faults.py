"""``make bench-faults``: what a retry does after a fault, for the settlement server and the two
peers of ``make bench``, counted in the database.

Starts embedded PostgreSQL and Redis (``bench.stack``), then for each fault and each system
(the server as ``settlement serve`` runs it; ``bench.peer_app`` with ``BENCH_PEER_LAYER``
``powertools`` and ``asgi-idem``, under the same server options and workers) one run on a
fresh state: a database of its own copied from the migrated one, with the bench client and
its funded accounts (``bench.fixtures``), and Redis emptied. A run sends ``BENCH_FAULT_KEYS``
new transfers (amount 1, the account pairs in turn), one key each, over
``BENCH_CONNECTIONS`` keep-alive connections; the fault strikes once half of them have an
answer, with the other connections' requests in flight; after the pass every key sent is sent
once more, the same bytes (a plain resend: same key, same body; no backoff, no status query),
and ``BENCH_FAULT_LATE`` seconds later, once more, each key whose retry got no definitive
answer (``bench.faults_count``): what is lost for good is told from what was only "not yet".

The faults:

* ``flushall``: Redis ``FLUSHALL``; the pass then goes on;
* ``sigkill``: a database stall, then a crash: the bench locks every account of the run
  (``SELECT ... FOR UPDATE`` in a transaction of its own) for ``STALL_SECONDS`` while the load
  goes on, so that each connection's request reaches the server and waits there for its
  transfer; then no new request is sent, the lock is released, and ``KILL_AFTER_RELEASE``
  later the server's whole process group (the supervisor and its workers) gets ``SIGKILL``,
  with the released requests in every stage from waiting to committed and answered; then the
  same server is started again on the same port, database and Redis;
* ``cut-answers``: the pass goes through a TCP relay (``bench.faults_relay``) that forwards
  every request and, for ``BENCH_FAULT_CUT`` of them (0.1: every tenth), closes the client's
  connection when the answer arrives instead of forwarding it; the retries go to the server.

Then the run's database is asked what each key did (``bench.faults_count``: transfers per key,
the accounts' sums) and the answers are tallied. Prints one table; writes every figure to
``bench/results/<date>-faults.json`` (``bench.faults_report``). Logs go to
``bench/results/<date>-faults-logs/``.

Environment: BENCH_WORKERS (2), BENCH_CONNECTIONS (32), BENCH_FAULT_KEYS (1000),
BENCH_FAULT_CUT (0.1), BENCH_FAULT_LATE (the server's default lease TTL + 2 s: 12),
BENCH_FAULTS (all three: ``flushall,sigkill,cut-answers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg
import redis

from bench import faults_report, fixtures, session
from bench.faults_count import Ledger, definitive, ledger, tally, transfers_by_key
from bench.faults_load import Pass, send_pass
from bench.faults_relay import CuttingRelay
from bench.peer_app import LAYERS, route
from bench.session import Session, env_number, say
from bench.stack import ServerProcess, Stack

__all__ = ["FAULTS", "SYSTEMS", "Config", "Run", "copy_database", "main", "run_one"]

# The systems, in the order each fault runs them: the server, then each peer's layer.
SERVER = "settlement"
SYSTEMS = (SERVER, *LAYERS)
FAULTS = ("flushall", "sigkill", "cut-answers")
# The share of a run's answers that have come back when its fault strikes.
STRIKE_SHARE = 0.5
# How long a killed process group may take to be gone before the bench gives up.
KILL_TIMEOUT = 10.0
# sigkill's stall: long enough for each connection's next request to reach the server and
# wait on the accounts' locks, shorter than the server's lock timeout (SETTLEMENT_DB_LOCK_TIMEOUT,
# 1 s), after which its waiting requests would answer 503 instead of waiting.
STALL_SECONDS = 0.4
# From the stall's end to the kill: the released requests are then committing, answering and
# (the peers) storing their answers in Redis, each as far as it got.
KILL_AFTER_RELEASE = 0.005
# The late retry waits this much longer than the server's default lease TTL: by then a lease
# that a killed worker held has run out.
LATE_MARGIN = 2.0


def _default_late() -> float:
    from service.config import Settings

    return Settings.from_env({}).lease_ttl + LATE_MARGIN


@dataclass(frozen=True)
class Config:
    workers: int
    connections: int
    keys: int
    cut_share: float
    late: float
    faults: tuple[str, ...]

    @classmethod
    def from_env(cls) -> Config:
        cut = env_number("BENCH_FAULT_CUT", 0.1, 0.0)
        if cut > 1:
            raise SystemExit(f"BENCH_FAULT_CUT must be <= 1, got {cut:g}")
        named = os.environ.get("BENCH_FAULTS", "").strip()
        faults = tuple(one.strip() for one in named.split(",")) if named else FAULTS
        unknown = [one for one in faults if one not in FAULTS]
        if unknown:
            raise SystemExit(f"BENCH_FAULTS: unknown {unknown}; choose from {', '.join(FAULTS)}")
        return cls(
            workers=int(env_number("BENCH_WORKERS", 2, 1)),
            connections=int(env_number("BENCH_CONNECTIONS", 32, 1)),
            keys=int(env_number("BENCH_FAULT_KEYS", 1000, 2)),
            cut_share=cut,
            late=env_number("BENCH_FAULT_LATE", _default_late(), 0.0),
            faults=faults,
        )


@dataclass
class Run:
    """One system under one fault: its passes, what the fault did, and the counts."""

    system: str
    fault: str
    first: Pass
    retry: Pass
    late: Pass
    fault_detail: dict[str, Any]
    transfers: dict[str, int]
    ledger: Ledger
    seconds: float

    def figures(self) -> dict[str, Any]:
        keys = list(self.first.statuses)
        return tally(
            keys, self.first.statuses, self.retry.statuses, self.transfers, self.late.statuses
        ).as_dict()

    def as_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "fault": self.fault,
            **self.figures(),
            "ledger": {**asdict(self.ledger), "agrees": self.ledger.agrees},
            "fault_detail": self.fault_detail,
            "answered_at_strike": self.first.answered_at_strike,
            "in_flight_at_strike": self.first.in_flight_at_strike,
            "first_pass_seconds": round(self.first.seconds, 2),
            "retry_pass_seconds": round(self.retry.seconds, 2),
            "late_retries": len(self.late.statuses),
            "seconds": round(self.seconds, 1),
        }


def _database_url(url: str, name: str) -> str:
    return urllib.parse.urlsplit(url)._replace(path=f"/{name}").geturl()


async def copy_database(template_url: str, name: str) -> str:
    """A database ``name`` copied from the migrated one (no rows in it yet); its URL."""
    template = urllib.parse.urlsplit(template_url).path.lstrip("/")
    conn = await asyncpg.connect(_database_url(template_url, "postgres"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await conn.close()
    return _database_url(template_url, name)


@contextlib.contextmanager
def _on_database(stack: Stack, url: str) -> Iterator[None]:
    """The servers the stack makes meanwhile use database ``url``."""
    before, stack.database_url = stack.database_url, url
    try:
        yield
    finally:
        stack.database_url = before


def _server(stack: Stack, system: str, workers: int, principal_id: str) -> ServerProcess:
    if system == SERVER:
        return stack.production_server(workers)
    return stack.peer_server(workers, principal_id, system)


def _flushall(redis_url: str) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    try:
        keys = int(client.dbsize())
        client.flushall()
    finally:
        client.close()
    return {"redis_keys_flushed": keys}


def _restart(server: ServerProcess, began: float) -> None:
    """After SIGKILL to the server's process group (its own session: the group is its id):
    wait for the group to be gone, then start the same server again."""
    group = server.pid
    server.stop()  # reaps the killed supervisor
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        if time.monotonic() - began > KILL_TIMEOUT:
            raise RuntimeError(f"process group {group} still alive {KILL_TIMEOUT:g}s after SIGKILL")
        time.sleep(0.05)
    server.start()


async def _stall_then_kill(
    database_url: str, server: ServerProcess, hold: Callable[[], None]
) -> dict[str, Any]:
    """``sigkill``: the accounts locked for ``STALL_SECONDS``, the load held, the lock
    released, the process group killed ``KILL_AFTER_RELEASE`` later, the server restarted."""
    processes = 1 + len(server.worker_processes())
    conn = await asyncpg.connect(database_url)
    try:
        stall = conn.transaction()
        await stall.start()
        locked = await conn.fetch(
            "SELECT id FROM accounts WHERE tenant = $1 ORDER BY id FOR UPDATE", fixtures.TENANT
        )
        await asyncio.sleep(STALL_SECONDS)
        hold()
        await stall.rollback()
        await asyncio.sleep(KILL_AFTER_RELEASE)
        os.killpg(server.pid, signal.SIGKILL)
    finally:
        await conn.close()
    began = time.monotonic()
    # in this thread, which blocks the loop meanwhile (no request is sent then): a server
    # started from a worker thread would get SIGTERM when that thread ends
    # (``devstack.die_with_parent``)
    _restart(server, began)
    return {
        "accounts_locked": len(locked),
        "stall_seconds": STALL_SECONDS,
        "kill_after_release_seconds": KILL_AFTER_RELEASE,
        "processes_killed": processes,
        "restart_seconds": round(time.monotonic() - began, 2),
    }


async def _drive(
    stack: Stack,
    server: ServerProcess,
    fault: str,
    requests: list[tuple[str, bytes]],
    cfg: Config,
    database_url: str,
) -> tuple[Pass, Pass, Pass, dict[str, Any]]:
    """The run's passes: the first with its fault, the retries, the late retries."""
    detail: dict[str, Any] = {}
    if fault == "cut-answers":
        async with CuttingRelay(server.port, cfg.cut_share) as relay:
            first = await send_pass(relay.port, requests, connections=cfg.connections)
        detail = {"relayed": relay.relayed, "answers_cut": relay.cut}
    else:

        async def strike(hold: Callable[[], None]) -> None:
            if fault == "flushall":  # at once, in this turn of the loop
                hold()
                detail.update(_flushall(stack.redis_url))
            else:
                detail.update(await _stall_then_kill(database_url, server, hold))

        first = await send_pass(
            server.port,
            requests,
            connections=cfg.connections,
            strike_at=max(1, int(len(requests) * STRIKE_SHARE)),
            strike=strike,
        )
    sent = [(key, raw) for key, raw in requests if key in first.statuses]
    retry = await send_pass(server.port, sent, connections=cfg.connections)
    undecided = [(key, raw) for key, raw in sent if not definitive(retry.statuses[key])]
    late = Pass()
    if undecided:
        await asyncio.sleep(cfg.late)
        late = await send_pass(server.port, undecided, connections=cfg.connections)
    return first, retry, late, detail


def run_one(stack: Stack, system: str, fault: str, cfg: Config) -> Run:
    began = time.monotonic()
    name = f"faults_{system}_{fault}".replace("-", "_")
    url = asyncio.run(copy_database(stack.database_url, name))
    _flushall(stack.redis_url)
    fixture = asyncio.run(fixtures.create(url))
    with _on_database(stack, url):
        server = _server(stack, system, cfg.workers, fixture.principal_id)
    path = fixtures.TRANSFERS if system == SERVER else LAYERS[system]
    requests = [
        (key, fixture.transfer_request(server.port, key, (i - 1) % fixtures.PAIRS + 1, path))
        for i in range(1, cfg.keys + 1)
        for key in [f"faults-{system}-{fault}-{fixture.run_token}-{i}"]
    ]
    with server:
        first, retry, late, detail = asyncio.run(_drive(stack, server, fault, requests, cfg, url))
    operations_route = fixtures.ROUTE if system == SERVER else route(system)
    made = asyncio.run(transfers_by_key(url, operations_route))
    money = asyncio.run(ledger(url))
    run = Run(system, fault, first, retry, late, detail, made, money, time.monotonic() - began)
    figures = run.figures()
    say(
        f"{fault} / {system}: {figures['keys_sent']} keys, {figures['transfers_made']} "
        f"transfers, {figures['keys_moved_twice']} moved twice, {figures['answers_lost']} "
        f"answers lost ({figures['lost_at_retry']} at the retry), "
        f"5xx {figures['first_5xx']}+{figures['retry_5xx']} ({run.seconds:.1f}s)"
    )
    return run


def main() -> int:
    cfg = Config.from_env()

    def run(stamp: str) -> None:
        current = Session(stamp, "faults")
        current.log_dir.mkdir(parents=True, exist_ok=True)
        say(f"logs: {current.log_dir}")
        with Stack(current.log_dir) as stack:
            say(f"PostgreSQL and Redis up in {current.seconds:.1f}s")
            runs = [
                run_one(stack, system, fault, cfg) for fault in cfg.faults for system in SYSTEMS
            ]
        faults_report.write(current, cfg.__dict__, [one.as_dict() for one in runs])

    return session.main(run)


if __name__ == "__main__":
    sys.exit(main())
