"""The peers' scenarios of ``make bench`` (``bench.peer_app``): for each idempotency layer,
``<layer>-replay`` (retries of ``BENCH_SEED`` transfers seeded through it) and ``<layer>-new``
(a new key per request, with the transfers made per key counted in SQL), each layer in its own
server under the production server's options and workers; and
``peer-plain-transfer``, the peers' transaction without a layer. What each layer does not do
is checked again each run and said in its rows' notes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from importlib.metadata import version

import asyncpg
import redis

from bench.client import send_all
from bench.fixtures import Fixture
from bench.loadgen import write_requests
from bench.peer_app import ASGI_IDEM_KEYS, LAYERS, PEER_PLAIN_PATH, route, validation_probe
from bench.runner import PEER_SERVERS, Row, Runner, System
from bench.session import say, send_seed
from bench.stack import ServerProcess, Stack

__all__ = ["PEER_SERVER", "peer_systems"]

# Each layer: its package (whose version the notes name) and how it answers a replay and a
# new key.
PACKAGES = {"powertools": "aws-lambda-powertools", "asgi-idem": "asgi-idempotency-header"}
REPLAY_HOW = {
    "powertools": "each answer from Powertools' Redis record (sync redis-py: its in-progress "
    "SET NX, refused, then two GETs of the completed record) and sent by the handler",
    "asgi-idem": "each answer read from the middleware's two Redis keys (GET body, GET "
    "status) and rebuilt as a Starlette JSONResponse",
}
NEW_HOW = {
    "powertools": "Powertools' in-progress record (SET NX) -> the transaction -> its completed "
    "record",
    "asgi-idem": "GET (miss) -> SADD to its set of keys -> the transaction -> SET body, SET "
    "status, EXPIRE both",
}
COMMON = (
    "no API-key authentication (it does less work than the server); a Litestar app under the "
    "server's options and worker count; a sync handler in a thread, a psycopg pool of "
    "SETTLEMENT_DB_POOL_SIZE connections per worker"
)


# Each peer's server in make bench: the faster of the two for it in a run that measured both
# (BENCH_PEER_TRIAL=1, bench/README.md); BENCH_PEER_SERVER sets both peers' at once.
PEER_SERVER = {"powertools": "uvicorn", "asgi-idem": "granian"}


def peer_systems(
    runner: Runner, stack: Stack, fixture: Fixture, servers: contextlib.ExitStack
) -> list[System]:
    """Each layer in its own server (started and seeded now, stopped when ``servers``
    closes): its replay and new rows, and on the Powertools peer ``peer-plain-transfer``.
    With ``BENCH_PEER_TRIAL=1``, each layer also under the other server, rows
    ``<layer>-replay@<server>`` and ``<layer>-new@<server>``."""
    cfg = runner.config
    systems = []
    for layer in LAYERS:
        chosen = cfg.peer_server or PEER_SERVER[layer]
        trials = [kind for kind in PEER_SERVERS if kind != chosen] if cfg.peer_trial else []
        for kind in [chosen, *trials]:
            suffix = "" if kind == chosen else f"@{kind}"
            server = servers.enter_context(
                stack.peer_server(cfg.workers, fixture.principal_id, layer, kind)
            )
            say(f"peer server up: {server.base_url} ({layer}, {PACKAGES[layer]}, {kind})")
            peer = _Peer(runner, stack, fixture, server, layer, kind, suffix)
            units = [peer.replay, peer.new]
            if layer == "powertools" and not suffix:
                units.append(functools.partial(_plain, runner, stack, server, fixture))
            what = f"peer server ({layer}, {kind})"
            servers.callback(runner.session.server_errors, server, what)
            systems.append(System(f"{layer}{suffix}", units))
    return systems


class _Peer:
    """One layer under one server: its seeded keys, and its rows ``<layer>-replay<suffix>``
    and ``<layer>-new<suffix>`` (``suffix``: ``""``, or ``@<server>`` for a trial)."""

    def __init__(
        self,
        runner: Runner,
        stack: Stack,
        fixture: Fixture,
        server: ServerProcess,
        layer: str,
        kind: str,
        suffix: str,
    ) -> None:
        self.runner, self.stack, self.fixture, self.server = runner, stack, fixture, server
        self.layer, self.suffix = layer, suffix
        self.path = LAYERS[layer]
        # keys "<layer><suffix>-replay-<i>": each server's peer seeds keys of its own
        self.requests = fixture.seed_transfers(
            server.port, self.path, f"{layer}{suffix}-replay", runner.config.seed
        )
        first = send_seed(server, self.requests)[0]
        self.package = f"{PACKAGES[layer]} {version(PACKAGES[layer])}"
        self.notes = [
            f"peer: {self.package}; {COMMON}; served by {kind}",
            *_checks(stack, server, fixture, layer, first, f"{layer}{suffix}-replay-1"),
        ]
        self.replays = write_requests(
            runner.session.log_dir / f"{layer}-replay{suffix}.requests", self.requests
        )

    def replay(self) -> None:
        runner, cfg, name = self.runner, self.runner.config, f"{self.layer}-replay{self.suffix}"
        say(f"{name}: retries of completed transfers on the peer")
        result, usage = runner.wrk(self.stack, self.server, "cycle.lua", [str(self.replays)])
        runner.add(
            Row(
                name,
                f"POST {self.path}, {cfg.seed} completed keys",
                result,
                usage,
                [
                    f"wrk cycles through the {cfg.seed} keys seeded through the peer; "
                    + REPLAY_HOW[self.layer],
                    *self.notes,
                ],
                {"package": self.package},
            )
        )

    def new(self) -> None:
        runner, stack, layer = self.runner, self.stack, self.layer
        name = f"{layer}-new{self.suffix}"
        say(f"{name}: fresh transfers with unique keys on the peer")
        # one tag per round, so that each round's transfers are counted apart
        turn = f"{layer}{self.suffix}-r{runner.round or 0}"
        tag = f"{turn}-{self.fixture.run_token}"
        args = self.fixture.fresh_args(self.path, turn)
        result, usage = runner.wrk(stack, self.server, "fresh.lua", args)
        check = asyncio.run(_executions(stack.database_url, route(layer), tag))
        created = sum(r.statuses.get("201", 0) for r in runner.last_runs)
        once = check["most_per_key"] <= 1 and check["transfers"] >= created
        new_notes = [
            f"{NEW_HOW[layer]}; unique keys from Lua",
            f"{check['transfers']} transfers for {check['keys']} keys, at most "
            f"{check['most_per_key']} per key; wrk counted {created} x 201 over its "
            f"{len(runner.last_runs)} runs (warm-up included), "
            f"{check['transfers'] - created} more transfers were made for requests in flight "
            "when wrk stopped: "
            + ("one execution per key" if once else "NOT one execution per key"),
        ]
        if layer == "asgi-idem":
            new_notes.append(_key_set(stack.redis_url))
        runner.add(
            Row(
                name,
                f"POST {self.path}, unique keys",
                result,
                usage,
                [*new_notes, *self.notes],
                {
                    "package": self.package,
                    "executions": {**check, "answers_201": created, "one_per_key": once},
                },
            )
        )


def _plain(runner: Runner, stack: Stack, server: ServerProcess, fixture: Fixture) -> None:
    say("peer-plain-transfer: the peer's transaction without an idempotency layer")
    args = fixture.fresh_args(PEER_PLAIN_PATH, "peerplain")
    result, usage = runner.wrk(stack, server, "fresh.lua", args)
    runner.add(
        Row(
            "peer-plain-transfer",
            f"POST {PEER_PLAIN_PATH}",
            result,
            usage,
            [
                "the peers' transaction (sync psycopg, a thread per request) with no "
                "idempotency layer and no authentication: what plain-transfer is compared to"
            ],
        )
    )


def _checks(
    stack: Stack,
    server: ServerProcess,
    fixture: Fixture,
    layer: str,
    first: tuple[int, dict[str, str], bytes],
    key: str,
) -> list[str]:
    """What the layer makes of an identical retry and of a changed body (amount 2) under the
    first seeded key, asked of the peer this run; for Powertools, also why it runs without
    payload validation (its answer to an identical retry with validation on, in this
    process, on the bench's Redis)."""
    same = fixture.transfer_request(server.port, key, 1, LAYERS[layer])
    changed = fixture.transfer_request(server.port, key, 1, LAYERS[layer], 2)
    [again, other] = asyncio.run(send_all(server.port, [same, changed], concurrency=1))
    if again[0] != first[0]:
        same_as_first = f"with another status than the first answer's {first[0]}"
    elif again[2] == first[2]:
        same_as_first = "byte-identical to the first answer"
    elif json.loads(again[2]) == json.loads(first[2]):
        same_as_first = "the first answer's JSON with its keys in another order"
    else:
        same_as_first = "with ANOTHER body than the first answer"
    replayed = again[1].get("idempotent-replayed", "absent")
    amount = json.loads(other[2]).get("amount") if other[0] == 201 else None
    if other[0] == 201 and amount == 1:
        changed_answer = "silently answered 201 with the first body's result (amount 1)"
    else:
        changed_answer = f"answered {other[0]} (amount {amount})"
    notes = [
        f"peer: an identical retry answered {again[0]}, {same_as_first} (Idempotent-Replayed: "
        f"{replayed}); a changed body (amount 2) under a seeded key was {changed_answer}; the "
        "server answers such a request 422",
    ]
    if layer == "powertools":
        probe = validation_probe(stack.redis_url)
        notes.append(
            "peer: measured without payload validation: on the Redis layer, "
            "payload_validation_jmespath answered an identical retry of a completed key with "
            f"{probe} (checked in this run)"
        )
    else:
        notes.append(
            "peer: the middleware has no payload validation to turn on, no lease and no "
            "authentication; it stores application/json answers only"
        )
    return notes


def _key_set(redis_url: str) -> str:
    """The middleware's set of every key it has seen: its size and expiry, after the run."""
    client = redis.Redis.from_url(redis_url)
    try:
        members = client.scard(ASGI_IDEM_KEYS)
        ttl = client.ttl(ASGI_IDEM_KEYS)
    finally:
        client.close()
    expiry = "never expires" if ttl == -1 else f"expires in {ttl} s"
    return (
        f"the middleware's set of keys holds {members} members and {expiry}: a key stays in it "
        "after its stored answer expires (and then answers 409)"
    )


async def _executions(database_url: str, peer_route: str, tag: str) -> dict[str, int]:
    """Transfers the peer made for keys starting with ``tag``: keys, transfers, most per key.
    Its operation rows hold ``<key>/<operation id>`` (``bench.peer_transfer``)."""
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS keys, coalesce(sum(n), 0) AS transfers,"
            " coalesce(max(n), 0) AS most FROM ("
            "  SELECT left(o.idempotency_key, length(o.idempotency_key) - 37) AS key,"
            "         count(*) AS n"
            "    FROM transfers t JOIN operations o ON o.id = t.operation_id"
            "   WHERE o.route = $1 AND o.idempotency_key LIKE $2 GROUP BY 1) AS per_key",
            peer_route,
            f"{tag}-%",
        )
    finally:
        await conn.close()
    assert row is not None
    return {
        "keys": int(row["keys"]),
        "transfers": int(row["transfers"]),
        "most_per_key": int(row["most"]),
    }
