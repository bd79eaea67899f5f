"""The reliability harness: a cluster, concurrent clients, a nemesis, a history and a checker.

* **Cluster**: PostgreSQL and Redis of its own (restartable), each behind a :class:`Relay`
  so their address never changes; two server processes; the provider simulator; two feed
  observer processes, one on the simulator's cursor feed and one on its timestamp feed, each
  declaring only the promises its source keeps under the nemesis' feed faults.
* **Clients** (threads): each performs intended actions (a transfer between two of the
  run's accounts, or a payout; a share of the transfers drain or fund accounts opened with
  low balances, so transfers race for the last of a balance all through the run), each
  with its own Idempotency-Key, through settlement-client (``clients/python``): its retry
  policy and budget retry connection errors, 409 in progress, 429, 5xx and 504 with the same
  key; when a call gives up (deadline, budget), the thread calls again with the same key
  until a terminal answer; a third of the actions ask ``Prefer: wait`` from their first
  request. Half the payouts come from a patient caller: told the outcome is unknown (504),
  it comes back after a few seconds instead of resending at once. Each request goes to one
  of the live servers, drawn at random.
* **Nemesis** (the main thread, which may restart PostgreSQL): a schedule drawn from the
  seed of: SIGKILL of a server then a restart; a server restarted with a crash failpoint at a
  commit boundary, then restarted clean; a Redis outage (connections cut, every key lost,
  then back); a Redis ``FLUSHALL`` (every lease lost); a PostgreSQL fast restart; provider
  faults (dropped answers, 5xx, delays past the timeout); feed faults (backfill, overlap,
  stuck token, page cap, lying watermark); SIGKILL of one of the observers, then a restart
  that resumes its checkpoint; an admin supersede of an ``unknown`` operation; an incident
  that drops provider answers, then an operator who resolves an ``unknown`` payout from the
  provider's record (only where the provider made or declined the payment under its sink
  key) while its client retries.
* **Checker** over the history and the final database: one effect per intended action
  (at most one transfer per operation and epoch; money conserved; every balance equal to
  its opening plus its transfers; exactly one provider payment per sink key of a completed
  payout), the same terminal answer on every replay, no operation left ``in_progress``,
  every 5xx one of the documented ones, no effect refused by a database constraint, and
  every 402 ``insufficient-funds`` judged on a balance its source account really had while
  the client waited for the answer (PostgreSQL's commit timestamps order the transfers).
  The feeds (:mod:`tests.reliability.feed_rules`, sampled during the run too): every provider
  payment has exactly one final receipt per feed, no receipt stays held past its limit, no
  checkpoint passes an event without a final receipt.

``run(seed, duration, ...)`` returns a :class:`Summary`; ``violations`` must be empty. The
seed fixes the actions' kinds, amounts and the fault schedule; thread timing is the OS's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import sqlite3
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis
from settlement_client import (
    AdminClient,
    Answer,
    AttemptEvent,
    Client,
    Payout,
    Problem,
    RetryPolicy,
    Transfer,
    TransportFailed,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from devstack import EmbeddedPostgres, EmbeddedRedis
from service.store.db import async_url
from service.store.migrate import upgrade
from service.store.principals import new_key
from tests.e2e.client import scalar
from tests.e2e.observer import Observer
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess
from tests.reliability import feed_rules, feeds
from tests.reliability.relay import Relay

__all__ = ["Summary", "run"]

ADMIN_KEY = new_key()  # the bootstrap key must be an API key of 128 random bits
LEASE_TTL = 2.0
ACCOUNTS = 6
OPENING = 1_000_000
# Accounts opened low, which a share of the transfers drain (and some fund): insufficient
# funds and credits racing debits for the last of a balance happen throughout the run.
LOW_ACCOUNTS = 3
LOW_OPENING = 30_000
LOW_SHARE = 0.4
# A transfer commits a moment before its commit timestamp is visible: the balances an
# answer may have been judged on start this long before its first request was sent.
COMMIT_SLACK = 0.05
# The detail of a 402 insufficient-funds (the guard of service.domain.ledger.TRANSFER).
INSUFFICIENT = re.compile(r"source balance (-?\d+) is below the amount (\d+)")
# How long one client keeps retrying one action before it leaves it to the settling phase.
ACTION_PATIENCE = 45.0
# After the load: how long unfinished actions are retried against the healed cluster.
SETTLE_PATIENCE = 90.0
# After that: how long the checker waits for the sweeper to demote what a killed worker left
# in progress (its lease runs out, then a sweep): a bound, not a pause.
DEMOTION_PATIENCE = 5 * LEASE_TTL
IN_PROGRESS = "SELECT count(*) FROM operations WHERE state = 'in_progress'"
REQUEST_TIMEOUT = 10.0
# A client call that gave up (its deadline or the retry budget) is called again after a
# pause drawn from this range: the application's own backoff, above the client's.
GAVE_UP_PAUSE = (0.2, 1.0)
# Prefer: wait asked from the first request by a third of the actions.
ACTION_WAIT = 2
# The share of payouts sent by a patient caller: a batch job that, told the outcome is
# unknown (504), does not resend at once but comes back after a pause drawn from
# PATIENT_PAUSE, so an unknown payout waits long enough for the operator to resolve it while
# its client still retries.
PATIENT_SHARE = 0.5
PATIENT_PAUSE = (3.0, 8.0)
OUTCOME_UNKNOWN = "operation-outcome-unknown"
# The 5xx answers the contract documents (docs/design.md §6); anything else is a violation.
DOCUMENTED_5XX = {
    (503, "service-unavailable"),
    (503, "lease-unavailable"),
    (504, "operation-outcome-unknown"),
}
# The faults the schedule draws from, with their weights: a feed fault arms only 1-3 pages'
# worth of misbehaviour, so it is drawn twice as often as the others to reach both feeds in a
# short run too.
FAULTS = {
    "kill-server": 1,
    "failpoint-crash": 1,
    "redis-outage": 1,
    "redis-flushall": 1,
    "postgres-restart": 1,
    "provider-fault": 1,
    "feed-fault": 2,
    "kill-observer": 1,
    "supersede-unknown": 1,
    "resolve-unknown": 1,
}
# The simulator's feed faults the nemesis arms (docs/feeds.md, "Feed faults"), 1-3 units at a time.
FEED_FAULTS = [
    "backfill",
    "overlap",
    "stuck_token",
    "page_cap",
    "lying_watermark",
    "empty_advance",
    "skip_advance",
]
FEED_FAULT_UNITS = (1, 3)
# How long the operator looks for an unknown payout to resolve before giving up this turn.
RESOLVE_LOOK = 8.0
# Provider answers the operator's incident drops first (the provider pays, the answer is
# lost): the payouts they hit end unknown, and a patient caller's stays so for seconds.
RESOLVE_DROPS = 2
# The observed feeds: name -> kind. Each has one observer process.
FEEDS = {"payments": "cursor", "payments-ts": "timestamp"}
# What each feed's source is declared to promise (SETTLEMENT_FEED_PROMISES), honestly for a
# simulator the nemesis arms with faults that break promises: page_cap breaks short-page-end,
# lying_watermark breaks watermark, and a timestamp backfill even later-timestamp (only the
# late-event audit finds those: a late-event alarm). The cursor feed promises neither
# no-backfill (its reconciliation pass reads it again from its start) nor empty-advance
# (empty_advance and skip_advance tokens are not adopted).
PROMISES = {"payments": "", "payments-ts": "later-timestamp"}
# SETTLEMENT_FEED_UNKNOWN_GRACE of the observers: short, so that backfills (about operations
# the server never had) are really held, decided again and quarantined within the run.
UNKNOWN_GRACE = 3.0
# SETTLEMENT_FEED_POLL_INTERVAL as tests/e2e/observer.py sets it: how often holds are redriven.
OBSERVER_POLL = 0.05
# Beyond the grace and a poll: an observer killed and restarting (its downtime and start), or
# waiting out a PostgreSQL restart, decides its holds that much later.
HOLD_SLACK = 10.0
HOLD_LIMIT = UNKNOWN_GRACE + OBSERVER_POLL + HOLD_SLACK
CRASH_POINTS = [
    "claim.after",
    "effect.before_commit",
    "effect.before_statement",
    "effect.after_commit",
    "settle.after",
]

T = TypeVar("T")


@dataclass
class Action:
    key: str
    kind: str  # transfer | payout
    body: dict[str, Any]
    wait: bool
    patient: bool = False  # a 504 unknown is resent after PATIENT_PAUSE, not at once
    unknown: bool = False  # its last call ended in a 504 unknown (a patient caller pauses)
    requests: int = 0
    calls: int = 0  # client calls (each retries on its own; see Clients.perform)
    answers: list[tuple[int, bytes]] = field(default_factory=list)  # terminal answers
    operation_id: str | None = None
    sent_at: float | None = None  # wall clock before the first request
    answered_at: float | None = None  # wall clock after the first terminal answer


@dataclass
class Summary:
    seed: int
    duration: float
    actions: int = 0
    finished: int = 0
    requests: int = 0
    retries: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    retries_per_call: Counter[int] = field(default_factory=Counter)
    gave_up: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    feed_faults: Counter[str] = field(default_factory=Counter)  # units armed per mode
    observer_kills: Counter[str] = field(default_factory=Counter)  # per feed
    resolutions: Counter[str] = field(default_factory=Counter)  # by answer
    patient_pauses: int = 0  # 504 unknowns a patient caller came back to later
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [
            f"seed {self.seed}, load {self.duration:.0f} s",
            f"actions {self.actions} ({self.finished} with a terminal answer), "
            f"requests {self.requests}, retries {self.retries}",
            "answers: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.statuses.items())),
            "retries per client call: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(self.retries_per_call.items()))
            + "; calls given up: "
            + (", ".join(f"{k} x{v}" for k, v in sorted(self.gave_up.items())) or "none"),
            "faults: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items())),
            "feed faults armed (units): "
            + (", ".join(f"{k} x{v}" for k, v in sorted(self.feed_faults.items())) or "none")
            + "; observers killed: "
            + (", ".join(f"{k} x{v}" for k, v in sorted(self.observer_kills.items())) or "none"),
            "operator resolutions: "
            + (", ".join(f"{k} x{v}" for k, v in sorted(self.resolutions.items())) or "none")
            + f"; unknown payouts a patient caller came back to: {self.patient_pauses}",
            *self.notes,
            f"violations: {len(self.violations)}",
            *(f"  - {v}" for v in self.violations),
        ]
        return "\n".join(lines)


class Cluster:
    def __init__(self, data_dir: Path) -> None:
        self.observer_logs = data_dir / "observer-logs"
        self.observer_logs.mkdir()
        self._retired = 0
        self.unused_feed_faults: Counter[str] = Counter()
        self.observer_exits: list[str] = []  # observers found exited on their own at heal
        self.pg = EmbeddedPostgres(data_dir, durable=False)
        self.redis = EmbeddedRedis(data_dir)
        pg_url, redis_url = self.pg.start(), self.redis.start()
        self.pg_relay = Relay(self.pg.port).start()
        self.redis_relay = Relay(self.redis.port).start()
        self.database_url = self.pg_relay.url_for(pg_url, self.pg.port)
        self.redis_url = self.redis_relay.url_for(redis_url, self.redis.port)
        self._redis_direct = redis_url
        self._track_commit_timestamps()
        upgrade(self.database_url)
        self.provider = ProviderProcess().start()
        self.env = {
            "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "SETTLEMENT_PROVIDER_URL": self.provider.base_url,
            "SETTLEMENT_PROVIDER_SECRET": SECRET,
            "SETTLEMENT_PROVIDER_TIMEOUT": "0.5",
            "SETTLEMENT_LATE_RESPONSE_WINDOW": "2",
            "SETTLEMENT_LEASE_TTL": str(LEASE_TTL),
            "SETTLEMENT_SWEEP_INTERVAL": "0.5",
            "SETTLEMENT_DB_CONNECT_TIMEOUT": "2",
            "SETTLEMENT_REDIS_TIMEOUT": "1",
            "SETTLEMENT_LOG_FORMAT": "json",
        }
        self._lock = threading.Lock()
        self.started: list[ServerProcess] = []
        self.servers: list[ServerProcess | None] = [self._server() for _ in range(2)]
        self.observers: dict[str, Observer] = {name: self._observer(name) for name in FEEDS}

    def _track_commit_timestamps(self) -> None:
        """PostgreSQL records when each transaction committed (the 402 check orders the
        transfers by it); the setting needs a restart and is kept in the cluster's
        ``postgresql.auto.conf`` across the nemesis' restarts."""

        async def enable() -> None:
            engine = create_async_engine(async_url(self.database_url), isolation_level="AUTOCOMMIT")
            try:
                async with engine.connect() as conn:
                    await conn.execute(text("ALTER SYSTEM SET track_commit_timestamp = on"))
            finally:
                await engine.dispose()

        asyncio.run(enable())
        self.pg_relay.cut()
        self.pg.stop()
        self.pg.start()
        self.pg_relay.retarget(self.pg.port)
        self.pg_relay.restore()

    def _server(self, failpoint: str | None = None) -> ServerProcess:
        env = dict(self.env)
        if failpoint is not None:
            env |= {"SETTLEMENT_ENABLE_FAILPOINTS": "1", "SETTLEMENT_FAILPOINTS": failpoint}
        server = ServerProcess(self.database_url, self.redis_url, env=env).start()
        self.started.append(server)
        return server

    def errors(self, limit: int = 5) -> list[str]:
        """The first distinct unhandled errors the servers logged (for the summary)."""
        found: list[str] = []
        for server in self.started:
            for line in server.output().splitlines():
                if '"level": "error"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                said = f"{record.get('msg')}: {str(record.get('exc', ''))[-700:]}"
                if said not in found:
                    found.append(said)
        return found[:limit]

    def _observer(self, name: str) -> Observer:
        """The observer of feed ``name`` (its checkpoint, so a restart resumes it)."""
        return Observer(
            self.redis_url,
            self.database_url,
            self.provider,
            FEEDS[name],
            name=name,
            unknown_grace=str(UNKNOWN_GRACE),
            promises=PROMISES[name],
        )

    def kill_observer(self, name: str, downtime: float) -> None:
        """SIGKILL the observer of ``name``; after ``downtime`` seconds, start it again."""
        self.observers[name].proc.send_signal(signal.SIGKILL)
        self._retire(self.observers[name])
        time.sleep(downtime)
        self.observers[name] = self._observer(name)

    def _retire(self, observer: Observer) -> None:
        """Stop ``observer``, keeping its log (its own file goes when it stops)."""
        self._keep_observer_log(observer, f"{self._retired:03d}")
        self._retired += 1
        observer.stop()

    def _keep_observer_log(self, observer: Observer, tag: str) -> None:
        source = observer.log_path
        with contextlib.suppress(OSError):
            (self.observer_logs / f"{observer.name}-{tag}.log").write_bytes(source.read_bytes())

    def keep_logs(self, dest: Path) -> None:
        """Every server's log, every observer's (each start of each), the simulator's."""
        for n, server in enumerate(self.started):
            (dest / f"server-{n}.log").write_text(server.output())
        for observer in self.observers.values():
            self._keep_observer_log(observer, "last")
        for log in sorted(self.observer_logs.iterdir()):
            (dest / log.name).write_bytes(log.read_bytes())
        (dest / "provider.log").write_text(self.provider.output())

    def urls(self) -> list[str]:
        with self._lock:
            return [s.base_url for s in self.servers if s is not None]

    def replace_server(self, index: int, server: ServerProcess | None) -> ServerProcess | None:
        with self._lock:
            old, self.servers[index] = self.servers[index], server
        return old

    def flushall(self) -> None:
        with redis.Redis.from_url(self._redis_direct, socket_timeout=2) as direct:
            direct.flushall()

    def heal(self) -> None:
        self.pg_relay.restore()
        self.redis_relay.restore()
        self.provider.clear_faults()
        for armed in self.provider.feed_faults():  # what no page applied
            self.unused_feed_faults[armed["mode"]] += int(armed["count"])
        self.provider.clear_feed_faults()
        for i, server in enumerate(self.servers):
            if server is None or server.proc is None or server.proc.poll() is not None:
                self.replace_server(i, self._server())
        for name, observer in self.observers.items():
            if observer.proc.poll() is not None:  # the nemesis restarts those it kills
                self.observer_exits.append(f"{name} (exit status {observer.proc.returncode})")
                self._retire(observer)
                self.observers[name] = self._observer(name)

    def close(self) -> None:
        for server in self.servers:
            if server is not None:
                server.stop()
        for observer in self.observers.values():
            observer.stop()
        self.provider.stop()
        self.pg_relay.stop()
        self.redis_relay.stop()
        self.redis.stop()
        self.pg.stop()


# -- clients -------------------------------------------------------------------------------------


class AnyServer(httpx.BaseTransport):
    """Sends each request to one of the cluster's live servers, drawn at random (none up:
    a connect error, which the client retries)."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        urls = self.cluster.urls()
        if not urls:
            raise httpx.ConnectError("no server is up", request=request)
        target = httpx.URL(self.rng.choice(urls))
        request.url = request.url.copy_with(host=target.host, port=target.port)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


class Clients:
    def __init__(self, cluster: Cluster, seed: int, count: int, summary: Summary) -> None:
        self.cluster = cluster
        self.summary = summary
        self.actions: list[Action] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._rngs = [random.Random(seed * 1000 + n) for n in range(count)]
        self.fives: list[tuple[int, str, str]] = []
        self._current = threading.local()
        base = cluster.urls()[0]
        with AdminClient(base, ADMIN_KEY) as admin:
            self.key = admin.create_principal("chaos", "client", "client").value.api_key
        self.openings: dict[str, int] = {}
        with Client(base, self.key) as client:
            for n in range(ACCOUNTS + LOW_ACCOUNTS):
                opening = OPENING if n < ACCOUNTS else LOW_OPENING
                opened = client.create_account("EUR", opening, key=f"open-{n}")
                self.openings[opened.value.id] = opening
        self.accounts = list(self.openings)[:ACCOUNTS]
        self.low_accounts = list(self.openings)[ACCOUNTS:]
        self._threads = [
            threading.Thread(target=self._loop, args=(rng,), daemon=True) for rng in self._rngs
        ]

    def client(self, rng: random.Random) -> Client:
        """A settlement client (one per thread) over every live server, counting each
        answer it gets into the summary through its hook."""
        return Client(
            "http://cluster",
            self.key,
            transport=AnyServer(self.cluster, rng),
            timeout=httpx.Timeout(REQUEST_TIMEOUT),
            hooks=[self._heard],
            rng=rng,
        )

    def _heard(self, event: AttemptEvent) -> None:
        action: Action | None = getattr(self._current, "action", None)
        if action is not None:
            action.requests += 1
            action.operation_id = event.operation_id or action.operation_id
        if event.status is None:
            self._count(f"connection:{event.error}")
            return
        self._count(f"{event.status} {event.slug}".strip())
        if event.status >= 500:
            with self._lock:
                self.fives.append((event.status, event.slug, event.key or ""))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def _loop(self, rng: random.Random) -> None:
        with self.client(rng) as client:
            while not self.stop.is_set():
                action = self._new_action(rng)
                with self._lock:
                    self.actions.append(action)
                self.perform(client, action, rng, ACTION_PATIENCE)

    def _new_action(self, rng: random.Random) -> Action:
        if rng.random() < 0.3:
            body = {"beneficiary": "CHAOS LTD", "amount": rng.randint(1, 5000), "currency": "EUR"}
            return Action(
                uuid.uuid4().hex,
                "payout",
                body,
                wait=rng.random() < 0.33,
                patient=rng.random() < PATIENT_SHARE,
            )
        if rng.random() < LOW_SHARE:
            low = rng.choice(self.low_accounts)
            other = rng.choice([a for a in self.openings if a != low])
            if rng.random() < 0.6:  # drain it
                source, destination, amount = low, other, rng.randint(1_000, 15_000)
            else:  # fund it (and race the debits waiting for it)
                source, destination, amount = other, low, rng.randint(1_000, 10_000)
        else:
            source, destination = rng.sample(self.accounts, 2)
            amount = rng.randint(1, 20_000)
        body = {"source": source, "destination": destination, "amount": amount, "currency": "EUR"}
        return Action(uuid.uuid4().hex, "transfer", body, wait=rng.random() < 0.33)

    def perform(self, client: Client, action: Action, rng: random.Random, patience: float) -> None:
        """Call until the action has a terminal answer, then once more: the replay. The
        client retries within each call; a call that gave up is called again, same key."""
        deadline = time.monotonic() + patience
        wanted = 2 if not action.answers else len(action.answers) + 1
        self._current.action = action
        try:
            while len(action.answers) < wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if action.sent_at is None:
                    action.sent_at = time.time()
                policy = RetryPolicy(
                    max_attempts=1_000, deadline=left, resend_unknown=not action.patient
                )
                answer = self._call(client, action, policy)
                if answer is None and action.patient and action.unknown:
                    action.unknown = False
                    time.sleep(rng.uniform(*PATIENT_PAUSE))
                    continue
                if answer is None:
                    time.sleep(rng.uniform(*GAVE_UP_PAUSE))
                    continue
                if action.answered_at is None:
                    action.answered_at = time.time()
                action.answers.append(answer)
        finally:
            self._current.action = None

    def _call(
        self, client: Client, action: Action, policy: RetryPolicy
    ) -> tuple[int, bytes] | None:
        """One client call: its terminal answer, or None when it gave up."""
        action.calls += 1
        wait = ACTION_WAIT if action.wait else 0
        try:
            answer: Answer[Transfer] | Answer[Payout]
            if action.kind == "transfer":
                answer = client.create_transfer(
                    **action.body, key=action.key, prefer_wait=wait, policy=policy
                )
            else:
                answer = client.create_payout(
                    **action.body, key=action.key, prefer_wait=wait, policy=policy
                )
        except Problem as problem:
            self._tally(problem.attempts, problem.gave_up)
            if action.patient and problem.slug == OUTCOME_UNKNOWN:
                with self._lock:
                    self.summary.patient_pauses += 1
                action.unknown = True  # the caller comes back later (Clients.perform)
                return None
            if problem.gave_up != "final":
                return None
            return problem.status, problem.content
        except TransportFailed as lost:
            self._tally(lost.attempts, lost.gave_up)
            return None
        self._tally(answer.attempts, "final")
        return answer.status, answer.content

    def _tally(self, attempts: int, gave_up: str) -> None:
        with self._lock:
            self.summary.retries_per_call[max(0, attempts - 1)] += 1
            if gave_up != "final":
                self.summary.gave_up[gave_up] += 1

    def _count(self, what: str) -> None:
        with self._lock:
            self.summary.statuses[what] += 1


# -- nemesis -------------------------------------------------------------------------------------


class Nemesis:
    def __init__(self, cluster: Cluster, seed: int, summary: Summary) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.summary = summary
        self.clients: Clients | None = None

    def schedule(self, duration: float) -> list[tuple[float, str]]:
        """(offset seconds, fault), drawn from the seed: a fault every 2-6 s."""
        at, plan = 3.0, []
        kinds, weights = list(FAULTS), list(FAULTS.values())
        while at < duration - 3:
            plan.append((at, self.rng.choices(kinds, weights)[0]))
            at += self.rng.uniform(2.0, 6.0)
        return plan

    def run(self, duration: float, clients: Clients) -> None:
        self.clients = clients
        started = time.monotonic()
        for offset, fault in self.schedule(duration):
            delay = started + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                getattr(self, "_" + fault.replace("-", "_"))()
            except Exception as exc:  # a fault that failed to apply is noted, not fatal
                self.summary.notes.append(f"fault {fault} at {offset:.0f}s failed: {exc!r}")
                continue
            self.summary.faults[fault] += 1
        rest = started + duration - time.monotonic()
        if rest > 0:
            time.sleep(rest)

    def _pick_server(self) -> int:
        return self.rng.randrange(len(self.cluster.servers))

    def _kill_server(self) -> None:
        index = self._pick_server()
        old = self.cluster.replace_server(index, None)
        if old is not None:
            old.stop(signal.SIGKILL)
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.cluster.replace_server(index, self.cluster._server())

    def _failpoint_crash(self) -> None:
        index = self._pick_server()
        point = self.rng.choice(CRASH_POINTS)
        old = self.cluster.replace_server(index, None)
        if old is not None:
            old.stop(signal.SIGKILL)
        doomed = self.cluster._server(f"{point}=crash")
        self.cluster.replace_server(index, doomed)
        deadline = time.monotonic() + 8
        while doomed.proc is not None and doomed.proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.cluster.replace_server(index, None)
        doomed.stop(signal.SIGKILL)
        self.cluster.replace_server(index, self.cluster._server())

    def _redis_outage(self) -> None:
        self.cluster.redis_relay.cut()
        self.cluster.flushall()  # a restarted Redis without persistence has lost every lease
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.cluster.redis_relay.restore()

    def _redis_flushall(self) -> None:
        self.cluster.flushall()

    def _postgres_restart(self) -> None:
        self.cluster.pg_relay.cut()
        self.cluster.pg.stop()
        self.cluster.pg.start()
        self.cluster.pg_relay.retarget(self.cluster.pg.port)
        self.cluster.pg_relay.restore()

    def _provider_fault(self) -> None:
        mode = self.rng.choice(["drop_response", "error_5xx", "delay"])
        count = self.rng.randint(1, 3)
        self.cluster.provider.arm(mode, count, delay_ms=1500 if mode == "delay" else None)

    def _feed_fault(self) -> None:
        mode = self.rng.choice(FEED_FAULTS)
        count = self.rng.randint(*FEED_FAULT_UNITS)
        self.cluster.provider.arm_feed(mode, count)
        self.summary.feed_faults[mode] += count

    def _kill_observer(self) -> None:
        name = self.rng.choice(sorted(FEEDS))
        self.cluster.kill_observer(name, self.rng.uniform(0.2, 1.0))
        self.summary.observer_kills[name] += 1

    def _supersede_unknown(self) -> None:
        urls = self.cluster.urls()
        if not urls:
            return
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        listed = httpx.get(
            f"{urls[0]}/admin/v1/operations", params={"state": "unknown"}, headers=admin, timeout=5
        )
        items = listed.json().get("items", []) if listed.status_code == 200 else []
        if not items:
            return
        target = self.rng.choice(items)["id"]
        httpx.post(
            f"{urls[0]}/admin/v1/operations/{target}/supersede",
            json={"reason": "chaos: superseding an unknown operation"},
            headers=admin,
            timeout=10,
        )

    def _resolve_unknown(self) -> None:
        """An operator settles an ``unknown`` payout as the provider's record says. It reads
        the record by asking the provider again under the operation's sink key (the same
        signed request: the provider answers what it did and pays nothing again), and only
        where the provider counts a payment or a decline for that key; with no record it
        leaves the operation to its client's retries."""
        urls = self.cluster.urls()
        if not urls or self.clients is None:
            return
        self.cluster.provider.arm("drop_response", RESOLVE_DROPS)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        deadline = time.monotonic() + RESOLVE_LOOK
        while True:  # unknown payouts are short-lived: clients retry them at once
            listed = httpx.get(
                f"{urls[0]}/admin/v1/operations",
                params={"state": "unknown"},
                headers=admin,
                timeout=5,
            )
            items = listed.json().get("items", []) if listed.status_code == 200 else []
            payouts = {a.key: a for a in list(self.clients.actions) if a.kind == "payout"}
            items = [i for i in items if i["route"] == "POST /v1/payouts" and i["key"] in payouts]
            if items:
                break
            if time.monotonic() > deadline:
                self.summary.resolutions["no unknown payout"] += 1
                return
            time.sleep(0.1)
        item = self.rng.choice(items)
        view = httpx.get(f"{urls[0]}/v1/operations/{item['id']}", headers=admin, timeout=5)
        if view.status_code != 200:
            return
        op = view.json()
        sink = f"{op['id']}:{op['binding_generation']}"
        counts = self.cluster.provider.counts(sink)
        if counts["count"] + counts["declines"] == 0:
            self.summary.resolutions["no provider record"] += 1
            return
        action = payouts[item["key"]]
        payment = {
            "operation_id": op["id"],
            "binding_generation": op["binding_generation"],
            "request_fingerprint": op["request_fingerprint"],
            **{name: action.body[name] for name in ("beneficiary", "amount", "currency")},
        }
        record = self.cluster.provider.pay(payment, sink)
        if record.status_code not in (201, 402):
            self.summary.resolutions[f"provider answered {record.status_code}"] += 1
            return
        evidence = record.json()["evidence"]
        answer = httpx.post(
            f"{urls[0]}/admin/v1/operations/{op['id']}/resolve",
            json={
                "outcome": evidence["outcome"],
                "provider_reference": record.json()["reference"][:256],
                "reason": "chaos: the provider's record under the sink key",
                "result": evidence["result"],
            },
            headers=admin,
            timeout=10,
        )
        body = answer.json() if answer.status_code in (200, 409) else {}
        self.summary.resolutions[
            f"{answer.status_code} {body.get('disposition') or body.get('type', '')}"
        ] += 1


# -- checker -------------------------------------------------------------------------------------


def check(cluster: Cluster, clients: Clients, summary: Summary) -> None:
    db = cluster.database_url
    violations = summary.violations
    for action in clients.actions:
        if not action.answers:
            violations.append(f"{action.kind} {action.key}: no terminal answer")
            continue
        if len(set(action.answers)) != 1:
            shown = [(s, b[:80]) for s, b in action.answers]
            violations.append(f"{action.kind} {action.key}: answers differ {shown}")
    for action in clients.actions:
        for status, body in action.answers[:1]:
            if status not in (201, 402):
                violations.append(f"{action.kind} {action.key}: terminal {status} {body[:120]!r}")
    twice = scalar(
        db,
        "SELECT count(*) FROM (SELECT operation_id, binding_generation FROM transfers "
        "GROUP BY 1, 2 HAVING count(*) > 1) AS doubled",
    )
    if twice:
        violations.append(f"{twice} operation epochs with more than one transfer")
    total = scalar(db, "SELECT coalesce(sum(balance), 0) FROM accounts WHERE tenant = 'chaos'")
    opened = sum(clients.openings.values())
    if total != opened:
        violations.append(f"money not conserved: {total} != {opened}")
    ledger = _ledger(db)
    balances = ledger.balances(clients.openings)
    off = [a for a, b in _final_balances(db).items() if balances.get(a) != b]
    if off:
        violations.append(f"{len(off)} balances differ from opening + transfers")
    negative = [a for a, b in ledger.lowest(clients.openings).items() if b < 0]
    if negative:
        violations.append(f"{len(negative)} accounts went below 0: {negative[:3]}")
    _check_refusals(clients, ledger, summary)
    open_ops = scalar(db, IN_PROGRESS)
    if open_ops:
        violations.append(f"{open_ops} operations left in_progress")
    payouts = [a.operation_id for a in clients.actions if a.kind == "payout" and a.operation_id]
    paid = _paid_sink_keys(cluster.provider.db_path)
    paid_epochs = 0
    for operation_id, generation in _completed(db, payouts):
        if f"{operation_id}:{generation}" not in paid:
            violations.append(f"payout {operation_id} completed without its payment")
        paid_epochs += generation > 1
    for status, slug, key in clients.fives:
        if (status, slug) not in DOCUMENTED_5XX:
            violations.append(f"undocumented {status} {slug or '(not a problem document)'} ({key})")
    refused = summary.statuses.get("409 effect-refused", 0)
    if refused:  # documented, but a guard let through what a constraint of its table refused
        violations.append(f"{refused} answers 409 effect-refused")
    superseded = scalar(db, "SELECT count(*) FROM operation_epochs")
    summary.notes.append(
        f"superseded epochs {superseded}; completed payouts in a later epoch {paid_epochs}"
    )


def check_feeds(cluster: Cluster, watch: feeds.FeedWatch, summary: Summary) -> None:
    """The feeds' rules (:mod:`tests.reliability.feed_rules`): what the watch saw during the run,
    then, once the observers caught up (bounded), every rule on the final reading."""
    final = feeds.final_check(cluster.database_url, cluster.provider.db_path, FEEDS, HOLD_LIMIT)
    during = list(watch.violations.values())
    summary.violations.extend(f"during the run: {line}" for line in feed_rules.capped(during))
    summary.violations.extend(f"at the end: {line}" for line in feed_rules.capped(final.violations))
    unused = ", ".join(f"{k} x{v}" for k, v in sorted(cluster.unused_feed_faults.items()))
    summary.notes.extend(
        [
            *feed_rules.render(final.snapshot, FEEDS),
            watch.render(),
            final.render(),
            f"feed fault units no page applied (cleared at heal): {unused or 'none'}; "
            f"observers exited on their own: {', '.join(cluster.observer_exits) or 'none'}",
        ]
    )


@dataclass
class Ledger:
    """Every transfer of the run, in commit order: (commit time, source, destination,
    amount)."""

    moves: list[tuple[float, str, str, int]]

    def balances(self, openings: dict[str, int]) -> dict[str, int]:
        found = dict(openings)
        for _, source, destination, amount in self.moves:
            found[source] = found.get(source, 0) - amount
            found[destination] = found.get(destination, 0) + amount
        return found

    def lowest(self, openings: dict[str, int]) -> dict[str, int]:
        """The lowest balance each account ever had."""
        found, low = dict(openings), dict(openings)
        for _, source, destination, amount in self.moves:
            found[source] -= amount
            found[destination] += amount
            low[source] = min(low[source], found[source])
        return low

    def between(self, account: str, opening: int, start: float, end: float) -> set[int]:
        """The balances ``account`` had at some moment from ``start`` to ``end``."""
        balance = opening
        seen: set[int] = set()
        for at, source, destination, amount in self.moves:
            if at > end:
                break
            if at >= start and not seen:
                seen.add(balance)  # what it had when the window opened
            if account in (source, destination):
                balance += amount if destination == account else -amount
                if at >= start:
                    seen.add(balance)
        seen.add(balance)  # what it had when the window closed (or all along)
        return seen


def _ledger(database_url: str) -> Ledger:
    async def query(conn: Any) -> Ledger:
        rows = await conn.execute(
            text(
                "SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 AS at,"
                " source_id, destination_id, amount FROM transfers WHERE tenant = 'chaos'"
                " ORDER BY at"
            )
        )
        return Ledger([(float(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows])

    return _on(database_url, query)


def _final_balances(database_url: str) -> dict[str, int]:
    async def query(conn: Any) -> dict[str, int]:
        rows = await conn.execute(text("SELECT id, balance FROM accounts WHERE tenant = 'chaos'"))
        return {str(r[0]): int(r[1]) for r in rows}

    return _on(database_url, query)


def _on(database_url: str, query: Callable[[Any], Awaitable[T]]) -> T:
    async def go() -> T:
        engine = create_async_engine(async_url(database_url))
        try:
            async with engine.connect() as conn:
                return await query(conn)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def _check_refusals(clients: Clients, ledger: Ledger, summary: Summary) -> None:
    """Every 402 insufficient-funds was judged on a balance its source really had while
    the client waited (from its first request to its first terminal answer), and below the
    amount: never on a balance older than the request, so never while the balance covered
    the amount all along."""
    checked = 0
    for action in clients.actions:
        if action.kind != "transfer" or not action.answers or action.sent_at is None:
            continue
        status, body = action.answers[0]
        if status != 402:
            continue
        said = INSUFFICIENT.search(body.decode(errors="replace"))
        if said is None:
            summary.violations.append(f"transfer {action.key}: a 402 without its balance {body!r}")
            continue
        judged, amount = int(said[1]), int(said[2])
        source = action.body["source"]
        assert action.answered_at is not None
        had = ledger.between(
            source, clients.openings[source], action.sent_at - COMMIT_SLACK, action.answered_at
        )
        checked += 1
        if judged not in had or judged >= amount:
            summary.violations.append(
                f"transfer {action.key}: 402 on balance {judged} for {amount}; the account "
                f"had {sorted(had)[:6]} while the client waited"
            )
    summary.notes.append(f"402 insufficient-funds checked against the ledger: {checked}")


def _paid_sink_keys(db_path: Path) -> set[str]:
    """The sink keys the provider committed a successful payment under (its own store; one
    row per sink key, so a key is paid once or not at all)."""
    with contextlib.closing(sqlite3.connect(db_path, timeout=5)) as conn:
        rows = conn.execute("SELECT sink_key FROM payments WHERE outcome = 'completed'")
        return {row[0] for row in rows}


def _completed(database_url: str, operation_ids: list[str]) -> list[tuple[str, int]]:
    """(id, binding generation) of the ``completed`` operations among ``operation_ids``."""

    async def query() -> list[tuple[str, int]]:
        engine = create_async_engine(async_url(database_url))
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text(
                        "SELECT id, binding_generation FROM operations "
                        "WHERE state = 'completed' AND id = ANY(:ids)"
                    ),
                    {"ids": [uuid.UUID(i) for i in set(operation_ids)]},
                )
                return [(str(row[0]), int(row[1])) for row in rows]
        finally:
            await engine.dispose()

    return asyncio.run(query())


def run(seed: int, duration: float, *, clients: int = 6) -> Summary:
    summary = Summary(seed=seed, duration=duration)
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-chaos-"))
    cluster = Cluster(data_dir)
    watch = feeds.FeedWatch(cluster.database_url, cluster.provider.db_path, FEEDS, HOLD_LIMIT)
    try:
        load = Clients(cluster, seed, clients, summary)
        watch.start()
        load.start()
        Nemesis(cluster, seed, summary).run(duration, load)
        load.join(ACTION_PATIENCE + REQUEST_TIMEOUT)
        cluster.heal()
        settle(cluster, load, seed)
        await_demotions(cluster.database_url)
        watch.stop()
        summary.actions = len(load.actions)
        summary.finished = sum(1 for a in load.actions if a.answers)
        summary.requests = sum(a.requests for a in load.actions)
        summary.retries = summary.requests - 2 * summary.finished
        check(cluster, load, summary)
        check_feeds(cluster, watch, summary)
        if summary.violations:
            summary.notes.extend(f"server log: {line}" for line in cluster.errors())
        if summary.violations or cluster.observer_exits:  # an exit is worth reading too
            kept = Path(tempfile.mkdtemp(prefix=f"settlement-chaos-{seed}-logs-"))
            cluster.keep_logs(kept)
            summary.notes.append(f"server, observer and simulator logs kept in {kept}")
    finally:
        watch.stop()
        cluster.close()
        with contextlib.suppress(OSError):
            import shutil

            shutil.rmtree(data_dir, ignore_errors=True)
    return summary


def await_demotions(database_url: str) -> None:
    """Until no operation is in progress, or DEMOTION_PATIENCE has passed (the checker then
    reports those left)."""
    deadline = time.monotonic() + DEMOTION_PATIENCE
    while scalar(database_url, IN_PROGRESS) and time.monotonic() < deadline:
        time.sleep(0.1)


def settle(cluster: Cluster, clients: Clients, seed: int) -> None:
    """Every unfinished action again, against the healed cluster, until it is terminal and
    replayed (or SETTLE_PATIENCE runs out: the checker reports it)."""
    rng = random.Random(seed)
    deadline = time.monotonic() + SETTLE_PATIENCE
    with clients.client(rng) as client:
        for action in clients.actions:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if len(action.answers) < 2:
                clients.perform(client, action, rng, left)
