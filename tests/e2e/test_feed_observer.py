"""The feed observer end to end: real observer processes (``settlement observer run``) against
the provider simulator's two feeds, a real server and real PostgreSQL and Redis.

A payout whose answer was lost reaches ``completed`` through the feed with no client retry;
an observer killed (SIGKILL) at each failpoint and restarted leaves every event with exactly
one durable outcome; two observers on one feed apply nothing twice; every feed misbehaviour
the simulator can be armed with ends with every payout settled once, or held for an operator.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, PATIENCE, auth, execute, new_principal, scalar, until
from tests.e2e.observer import Observer
from tests.e2e.provider import SECRET, ProviderProcess, make_payment
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

FAILPOINTS = [
    "observer.event.before_commit",
    "observer.event.after_commit",
    "observer.quarantine.before",
    "observer.quarantine.after",
    "observer.barrier.before",
    "observer.barrier.after",
]


def server_env(provider: ProviderProcess) -> dict[str, str]:
    return {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
        "SETTLEMENT_PROVIDER_TIMEOUT": "0.8",
        # a dropped answer never comes back late: only the feed can settle it
        "SETTLEMENT_LATE_RESPONSE_WINDOW": "0",
    }


@pytest.fixture(scope="module")
def server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    with ServerProcess(app_database, services.redis_url, env=server_env(provider)) as proc:
        yield proc


@pytest.fixture(scope="module")
def client_key(server: ServerProcess) -> str:
    return str(new_principal(server.base_url)["api_key"])


@pytest.fixture(autouse=True)
def no_faults_leak(provider: ProviderProcess) -> Iterator[None]:
    provider.clear_faults()
    provider.clear_feed_faults()
    yield
    provider.clear_faults()
    provider.clear_feed_faults()


def lost_payout(base: str, key: str, provider: ProviderProcess) -> str:
    """A payout the provider made but whose answer was dropped: 504, ``unknown``. While an
    observer runs, its feed may settle the payout before the attempt gives up on the
    provider, and the attempt then rightly answers the completed outcome (201)."""
    provider.arm("drop_response")
    lost = httpx.post(
        f"{base}/v1/payouts",
        json={"beneficiary": "ACME Supplies", "amount": 700, "currency": "EUR"},
        headers={**auth(key), "Idempotency-Key": uuid.uuid4().hex},
        timeout=30,
    )
    assert lost.status_code in (504, 201), lost.text
    if lost.status_code == 201:
        return str(lost.json()["id"])
    return lost.headers["operation-id"]


def state(base: str, key: str, operation_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{base}/v1/operations/{operation_id}", headers=auth(key))
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def feed_view(base: str, name: str) -> dict[str, Any]:
    """The admin view of the feed (empty until its observer has made its checkpoint)."""
    answer = httpx.get(f"{base}/admin/v1/feeds/{name}", headers=auth(ADMIN_KEY))
    if answer.status_code == 404:
        return {"lag": None, "holds": [], "alarms": []}
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def completed(base: str, key: str, ops: list[str]) -> bool:
    return all(state(base, key, op)["state"] == "completed" for op in ops)


def feed_settlements(database_url: str, operation_id: str) -> int:
    return int(
        scalar(
            database_url,
            "SELECT count(*) FROM observations WHERE operation_id = :op AND source = 'feed' "
            "AND disposition = 'applied'",
            op=uuid.UUID(operation_id),
        )
    )


def receipt_state(database_url: str, feed: str, event_id: str) -> str:
    return str(
        scalar(
            database_url,
            "SELECT state FROM feed_receipts WHERE feed = :n AND event_id = :e",
            n=feed,
            e=event_id,
        )
    )


def caught_up(base: str, name: str) -> bool:
    view = feed_view(base, name)
    return view["lag"] is not None and not view["holds"]


def every_event_passed_has_a_final_receipt(
    database_url: str, provider: ProviderProcess, name: str, kind: str
) -> None:
    """The checkpoint never passes an event without a durable final outcome."""
    if kind == "cursor":
        through = scalar(
            database_url,
            "SELECT coalesce(applied_position, 0) FROM feed_checkpoints WHERE name = :n",
            n=name,
        )
        page = httpx.get(f"{provider.base_url}/feeds/cursor", params={"limit": 500}).json()
        passed = [e for e in page["events"] if e["position"] <= through]
    else:
        through = scalar(
            database_url,
            "SELECT coalesce(closed_through_timestamp, -1) FROM feed_checkpoints WHERE name = :n",
            n=name,
        )
        page = httpx.get(f"{provider.base_url}/feeds/timestamp", params={"limit": 500}).json()
        passed = [e for e in page["events"] if e["timestamp"] <= through]
    for event in passed:
        final = scalar(
            database_url,
            "SELECT count(*) FROM feed_receipts WHERE feed = :n AND event_id = :e "
            "AND state <> 'held'",
            n=name,
            e=event["event_id"],
        )
        assert final == 1, (event["event_id"], through)


# -- the promise ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
def test_a_lost_answer_payout_completes_through_the_feed_with_no_retry(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    kind: str,
) -> None:
    base = server.base_url
    op = lost_payout(base, client_key, provider)
    assert state(base, client_key, op)["state"] == "unknown"
    observer = Observer(services.redis_url, app_database, provider, kind)
    try:
        until(lambda: completed(base, client_key, [op]), "the feed settles the payout")
    finally:
        observer.stop()
    view = state(base, client_key, op)
    feed = [o for o in view["observations"] if o["source"] == "feed"]
    assert [(o["kind"], o["disposition"]) for o in feed] == [("completed", "applied")]
    assert feed[0]["detail"]["feed"] == observer.name
    replay = httpx.post(
        f"{base}/v1/payouts",
        json={"beneficiary": "ACME Supplies", "amount": 700, "currency": "EUR"},
        headers={**auth(client_key), "Idempotency-Key": view["key"]},
    )
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert provider.counts(f"{op}:1") == {"count": 1, "declines": 0}


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_an_observer_killed_at_a_failpoint_resumes_with_one_outcome_per_event(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    failpoint: str,
) -> None:
    base = server.base_url
    ops = [lost_payout(base, client_key, provider) for _ in range(3)]
    body, sink_key = make_payment()  # a payment about an operation that is not here
    assert provider.pay(body, sink_key).status_code in (200, 201)
    kind = "timestamp" if "barrier" in failpoint else "cursor"
    doomed = Observer(
        services.redis_url, app_database, provider, kind, failpoint=failpoint, page_size=2
    )
    try:
        doomed.proc.wait(PATIENCE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the observer never reached {failpoint}:\n{doomed.output()}")
    finally:
        code = doomed.stop()
    assert code == -signal.SIGKILL, doomed.output()
    every_event_passed_has_a_final_receipt(app_database, provider, doomed.name, kind)

    resumed = Observer(
        services.redis_url, app_database, provider, kind, name=doomed.name, page_size=2
    )
    try:
        until(lambda: completed(base, client_key, ops), "every payout settles")
        until(lambda: caught_up(base, doomed.name), "the observer catches up")
    finally:
        resumed.stop()
    every_event_passed_has_a_final_receipt(app_database, provider, doomed.name, kind)
    for op in ops:
        assert feed_settlements(app_database, op) == 1
    quarantined = scalar(
        app_database,
        "SELECT state FROM feed_receipts WHERE feed = :n AND operation_id = :op",
        n=doomed.name,
        op=uuid.UUID(body["operation_id"]),
    )
    assert quarantined == "quarantined"


def test_two_observers_on_one_feed_apply_each_event_once(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    base = server.base_url
    first = Observer(services.redis_url, app_database, provider, "cursor", page_size=3)
    second = Observer(
        services.redis_url, app_database, provider, "cursor", name=first.name, page_size=3
    )
    try:
        ops = [lost_payout(base, client_key, provider) for _ in range(8)]
        until(lambda: completed(base, client_key, ops), "every payout settles")
        until(lambda: caught_up(base, first.name), "the observers catch up")
    finally:
        first.stop()
        second.stop()
    for op in ops:
        assert feed_settlements(app_database, op) == 1
    every_event_passed_has_a_final_receipt(app_database, provider, first.name, "cursor")
    assert not [a for a in feed_view(base, first.name)["alarms"] if a["kind"] != "stuck-token"]


# -- misbehaving feeds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "mode", "count", "alarm"),
    [
        ("cursor", "overlap", 3, None),
        ("timestamp", "overlap", 3, None),
        ("cursor", "empty_advance", 2, None),
        ("cursor", "stuck_token", 3, None),
        ("timestamp", "stuck_token", 3, None),
        ("timestamp", "big_tie", 7, None),
        ("timestamp", "late_tie", 1, None),
        ("cursor", "conflicting_identity", 1, "conflicting-identity"),
        ("timestamp", "conflicting_identity", 1, "conflicting-identity"),
    ],
)
def test_a_misbehaving_feed_still_settles_every_payout_once(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    kind: str,
    mode: str,
    count: int,
    alarm: str | None,
) -> None:
    base = server.base_url
    before = [lost_payout(base, client_key, provider) for _ in range(2)]
    observer = Observer(services.redis_url, app_database, provider, kind, page_size=3)
    try:
        until(lambda: completed(base, client_key, before), "the first payouts settle")
        until(lambda: caught_up(base, observer.name), "the observer catches up")
        provider.arm_feed(mode, count)
        ops = [
            lost_payout(base, client_key, provider)
            for _ in range(count if mode == "big_tie" else 3)
        ]
        until(lambda: completed(base, client_key, ops), f"every payout settles under {mode}")
        until(lambda: caught_up(base, observer.name), "the observer catches up again")
    finally:
        observer.stop()
    for op in before + ops:
        assert feed_settlements(app_database, op) == 1
    every_event_passed_has_a_final_receipt(app_database, provider, observer.name, kind)
    if alarm is not None:
        kinds = {a["kind"] for a in feed_view(base, observer.name)["alarms"]}
        assert alarm in kinds, kinds


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
def test_a_bad_signature_is_held_until_an_operator_releases_it(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    kind: str,
) -> None:
    base = server.base_url
    observer = Observer(services.redis_url, app_database, provider, kind, page_size=50)
    try:
        until(lambda: caught_up(base, observer.name), "the observer catches up")
        # every page flips its first signature until the event is held: an idle observer
        # also reads a page of its walk with every request, and those take units too
        provider.arm_feed("bad_signature", 1000)
        op = lost_payout(base, client_key, provider)
        holds = until(lambda: feed_view(base, observer.name)["holds"], "the event is held")
        provider.clear_feed_faults()
        assert [h["reason"] for h in holds] == ["bad-signature"]
        # three more pages read (each takes a unit): at least one main page was decided
        # whole meanwhile; held, the barrier stays closed and the payout stays unknown
        provider.arm_feed("bad_signature", 3)
        until(lambda: not provider.feed_faults(), "the observer reads three more pages")
        assert state(base, client_key, op)["state"] == "unknown"
        again = feed_view(base, observer.name)["holds"]
        assert [h["event_id"] for h in again] == [h["event_id"] for h in holds]

        def released() -> bool:
            for hold in feed_view(base, observer.name)["holds"]:
                decided = httpx.post(
                    f"{base}/admin/v1/feeds/{observer.name}/holds/{hold['event_id']}",
                    json={"action": "retry"},
                    headers=auth(ADMIN_KEY),
                )
                assert decided.status_code in (200, 404), decided.text
            return completed(base, client_key, [op])

        until(released, "the released event settles")
    finally:
        observer.stop()
    assert feed_settlements(app_database, op) == 1
    assert "bad-signature" in {a["kind"] for a in feed_view(base, observer.name)["alarms"]}


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
def test_a_backfilled_event_behind_the_checkpoint_is_found_and_never_skipped(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    kind: str,
) -> None:
    """Cursor feed: the backfill shows up on a following overlap page; timestamp feed: the
    idle observer's look-back finds it. Either way it gets a durable outcome (its operation
    is not here: quarantined) and an alarm."""
    base = server.base_url
    observer = Observer(services.redis_url, app_database, provider, kind, page_size=50)
    try:
        lost_payout(base, client_key, provider)
        until(lambda: caught_up(base, observer.name), "the observer catches up")
        backfill(base, client_key, provider, kind, observer.name)
        until(lambda: caught_up(base, observer.name), "the observer catches up again")
    finally:
        observer.stop()
    quarantined = scalar(
        app_database,
        "SELECT count(*) FROM feed_receipts WHERE feed = :n AND state = 'quarantined'",
        n=observer.name,
    )
    assert quarantined >= 1


def backfill(
    base: str, key: str, provider: ProviderProcess, kind: str, feed: str, *, overlap: bool = True
) -> None:
    """Arm a backfill behind what the observer has read (an overlap page shows it to a
    cursor feed, else its reconciliation pass finds it), and wait for the observer's alarm
    about it."""
    provider.arm_feed("backfill", 1)
    if kind == "cursor" and overlap:
        provider.arm_feed("overlap", 5)
    lost_payout(base, key, provider)  # a new event: the next page applies the fault
    alarm = "backfill" if kind == "cursor" else "late-event"
    until(
        lambda: alarm in {a["kind"] for a in feed_view(base, feed)["alarms"]},
        f"a {alarm} alarm",
    )


def test_a_backfill_behind_a_cursor_with_no_overlap_page_is_found_by_reading_again(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    """The simulator's backfill with no overlap page: no main page ever shows it again; the
    reconciliation pass of a feed that does not promise no-backfill finds it, alarms it, and
    gives it its outcome (its operation is not here: quarantined)."""
    base = server.base_url
    observer = Observer(services.redis_url, app_database, provider, "cursor", page_size=50)
    try:
        lost_payout(base, client_key, provider)
        until(lambda: caught_up(base, observer.name), "the observer catches up")
        backfill(base, client_key, provider, "cursor", observer.name, overlap=False)
        until(lambda: caught_up(base, observer.name), "the observer catches up again")
    finally:
        observer.stop()
    backfilled = [a for a in feed_view(base, observer.name)["alarms"] if a["kind"] == "backfill"]
    assert backfilled
    assert receipt_state(app_database, observer.name, backfilled[0]["event_id"]) == "quarantined"


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
def test_a_backfilled_event_held_for_the_default_grace_is_never_forgotten(
    services: Services, app_database: str, kind: str
) -> None:
    """The same backfill with the default grace (60 s): its operation is not here, so it is
    held, listed with its age while the checkpoint moves on past it, and the observer
    quarantines it by itself once the grace has run out (aged here in the database, whose
    clock the grace runs on), although the feed no longer serves it. A provider of its own:
    another test's backfills would be held too."""
    with (
        ProviderProcess() as provider,
        ServerProcess(app_database, services.redis_url, env=server_env(provider)) as server,
    ):
        base = server.base_url
        key = str(new_principal(base)["api_key"])
        observer = Observer(
            services.redis_url, app_database, provider, kind, page_size=50, unknown_grace=None
        )
        try:
            lost_payout(base, key, provider)
            until(lambda: caught_up(base, observer.name), "the observer catches up")
            backfill(base, key, provider, kind, observer.name)
            [held] = until(lambda: feed_view(base, observer.name)["holds"], "the event is held")
            assert held["reason"] == "unknown-operation" and held["kept"] is True
            assert 0 <= held["age"] < 60
            # the checkpoint moves on while the event is held
            until(lambda: feed_view(base, observer.name)["lag"] is not None, "a caught-up page")
            execute(
                app_database,
                "UPDATE feed_receipts SET first_seen_at = first_seen_at - interval '61 seconds'"
                " WHERE feed = :n AND event_id = :e",
                n=observer.name,
                e=held["event_id"],
            )
            until(lambda: caught_up(base, observer.name), "the observer quarantines it itself")
        finally:
            observer.stop()
        assert receipt_state(app_database, observer.name, held["event_id"]) == "quarantined"
