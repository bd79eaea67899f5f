"""Retention end to end, with retention settings of seconds: a retry replays until the result
expires, then gets 410 and runs nothing until the tombstone is forgotten, then runs as new;
a retry racing the purge of its own operation (two server processes purging) replays or gets
410, never runs twice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import Services, fresh_database
from tests.e2e.client import (
    ADMIN_KEY,
    auth,
    balance,
    execute,
    new_account,
    new_principal,
    scalar,
    transfer,
)
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# results kept 2 s, tombstones 4 s more; the purge loop runs every 0.2 s
ENV = {
    "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
    "SETTLEMENT_RETENTION": "2",
    "SETTLEMENT_TOMBSTONE_RETENTION": "4",
    "SETTLEMENT_SWEEP_INTERVAL": "0.2",
}
# longest wait for the purge loop to reach a boundary: retention plus several passes
PATIENCE = 20.0


@pytest.fixture(scope="module")
def server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    with ServerProcess(app_database, services.redis_url, env=ENV) as proc:
        yield proc


def until(
    answer: Callable[[], httpx.Response], done: Callable[[httpx.Response], bool]
) -> httpx.Response:
    """Call ``answer`` every 0.1 s until ``done`` holds for its response (or PATIENCE)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        response = answer()
        if done(response) or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def test_a_key_replays_until_expiry_then_is_410_then_new_after_the_tombstone(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    key = new_principal(base)["api_key"]
    source, destination = new_account(base, key, 100), new_account(base, key, 0)
    first = transfer(base, key, "kept", source, destination, 10)
    assert first.status_code == 201, first.text
    op = first.headers["operation-id"]
    status = httpx.get(f"{base}/v1/operations/{op}", headers=auth(key)).json()
    assert status["expires_at"] is not None

    replay = transfer(base, key, "kept", source, destination, 10)  # well within 2 s
    assert replay.status_code == 201, replay.text
    assert replay.headers["idempotent-replayed"] == "true"

    gone = until(
        lambda: transfer(base, key, "kept", source, destination, 10),
        lambda r: r.status_code != 201,
    )
    assert gone.status_code == 410, gone.text
    problem = gone.json()
    assert problem["type"] == "/problems/idempotency-key-expired"
    assert (problem["operation_id"], problem["state"]) == (op, "completed")
    assert problem["expired_at"] and problem["forget_at"]
    assert gone.headers["operation-id"] == op
    # whatever the body, nothing runs
    other = transfer(base, key, "kept", source, destination, 33)
    assert other.status_code == 410, other.text
    assert balance(base, key, source) == 90
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=source) == 1
    # the status resource says the same, by id and by key; to its owner only
    by_id = httpx.get(f"{base}/v1/operations/{op}", headers=auth(key))
    assert by_id.status_code == 410, by_id.text
    assert by_id.json()["operation_id"] == op
    by_key = httpx.get(f"{base}/v1/operations?key=kept", headers=auth(key))
    assert by_key.status_code == 410, by_key.text
    stranger = new_principal(base)["api_key"]
    hidden = httpx.get(f"{base}/v1/operations/{op}", headers=auth(stranger))
    assert hidden.status_code == 404, hidden.text

    anew = until(
        lambda: transfer(base, key, "kept", source, destination, 10),
        lambda r: r.status_code != 410,
    )
    assert anew.status_code == 201, anew.text
    assert anew.headers["idempotent-replayed"] == "false"
    assert anew.headers["operation-id"] != op
    assert balance(base, key, source) == 80


def test_unknown_and_conflict_operations_are_listed_and_never_purged(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    key = new_principal(base)["api_key"]
    source, destination = new_account(base, key, 100), new_account(base, key, 0)
    ops = []
    for state in ("unknown", "conflict"):
        made = transfer(base, key, f"open-{state}", source, destination, 1)
        assert made.status_code == 201
        ops.append(made.headers["operation-id"])
        extra = ", conflict = '{}'::jsonb" if state == "conflict" else ""
        execute(
            app_database,
            f"UPDATE operations SET state = :state, expires_at = now() - interval '1 hour'"
            f"{extra} WHERE id = :id",
            state=state,
            id=uuid.UUID(made.headers["operation-id"]),
        )
    # a completed operation expired beside them: once it is purged, a purge pass has seen
    # the open ones too
    control = transfer(base, key, "open-control", source, destination, 1)
    assert control.status_code == 201
    control_id = control.headers["operation-id"]
    execute(
        app_database,
        "UPDATE operations SET expires_at = now() - interval '1 hour' WHERE id = :id",
        id=uuid.UUID(control_id),
    )
    purged = until(
        lambda: httpx.get(f"{base}/v1/operations/{control_id}", headers=auth(key)),
        lambda r: r.status_code == 410,
    )
    assert purged.status_code == 410, purged.text
    for op in ops:
        assert httpx.get(f"{base}/v1/operations/{op}", headers=auth(key)).status_code == 200
    listed = httpx.get(f"{base}/admin/v1/operations?state=unknown", headers=auth(ADMIN_KEY))
    assert ops[0] in {item["id"] for item in listed.json()["items"]}


@pytest.fixture
def race_database(services: Services) -> str:
    """A database of the race test's own: the module's server (tombstones of 4 s, still
    running) must not purge its keys, or a key forgotten after 4 s runs anew, rightly."""
    from service.store.migrate import upgrade

    url = fresh_database(services, "race")
    upgrade(url)
    return url


def test_retries_racing_the_purge_of_their_operation_replay_or_410_never_run_twice(
    services: Services, race_database: str
) -> None:
    """Two server processes, each purging every 50 ms with retention 0: every retry of every
    key sees its row (a replay) or its tombstone (410)."""
    app_database = race_database
    env = {
        **ENV,
        "SETTLEMENT_RETENTION": "0",
        "SETTLEMENT_TOMBSTONE_RETENTION": "600",
        "SETTLEMENT_SWEEP_INTERVAL": "0.05",
    }
    with (
        ServerProcess(app_database, services.redis_url, env=env) as one,
        ServerProcess(app_database, services.redis_url, env=env) as two,
    ):
        key = new_principal(one.base_url)["api_key"]
        source = new_account(one.base_url, key, 1000)
        destination = new_account(one.base_url, key, 0)
        keys = [f"race-{n}" for n in range(30)]

        def one_key(name: str) -> list[tuple[int, str, str]]:
            seen = []
            first = transfer(one.base_url, key, name, source, destination, 1)
            assert first.status_code == 201, first.text
            for n in range(12):
                base = (one, two)[n % 2].base_url
                again = transfer(base, key, name, source, destination, 1)
                seen.append(
                    (
                        again.status_code,
                        again.headers.get("idempotent-replayed", ""),
                        again.headers.get("operation-id", ""),
                    )
                )
                assert again.headers.get("operation-id") == first.headers["operation-id"], (
                    again.status_code,
                    again.headers,
                    again.content,
                    first.content,
                )
                if again.status_code == 201:
                    assert again.content == first.content, (again.headers, first.headers)
                if again.status_code == 410:  # whichever read found the purge: the whole 410
                    gone = again.json()
                    assert gone["state"] == "completed" and gone["forget_at"], gone
            return seen

        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = [a for seen in pool.map(one_key, keys) for a in seen]
    kinds = {(status, replayed) for status, replayed, _ in answers}
    assert kinds <= {(201, "true"), (410, "false")}, kinds
    assert (410, "false") in kinds  # the purge did run under the retries
    # every tombstone is these two servers' (600 s): no other purger reached these keys
    short = "SELECT count(*) FROM tombstones WHERE forget_at < now() + interval '500 seconds'"
    assert scalar(app_database, short) == 0
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=uuid.UUID(source)) == len(keys)
    assert balance_of(app_database, source) == 1000 - len(keys)


def balance_of(database_url: str, account: str) -> int:
    return int(scalar(database_url, "SELECT balance FROM accounts WHERE id = :a", a=account))
