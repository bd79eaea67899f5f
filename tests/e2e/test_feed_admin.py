"""The feed admin routes over HTTP: only an all-tenant admin sees feeds; a held event is
quarantined by an operator once, or decided again by a retry that never deletes it."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, execute, new_principal, scalar, until
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

ENV = {
    "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
    # configured but never observed here (no observer process runs in this module)
    "SETTLEMENT_FEEDS": "payments=cursor:http://127.0.0.1:9/feeds/cursor",
    "SETTLEMENT_FEED_PROMISES": "payments=no-backfill+empty-advance",
    # the feeds' figures of /metrics, read in the background: soon after a change
    "SETTLEMENT_FEED_FIGURES_INTERVAL": "0.2",
}


@pytest.fixture(scope="module")
def server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    with ServerProcess(app_database, services.redis_url, env=ENV) as proc:
        yield proc


def hold(database_url: str, event_id: str) -> None:
    execute(
        database_url,
        "INSERT INTO feed_checkpoints (name, kind) VALUES ('payments', 'cursor') "
        "ON CONFLICT DO NOTHING",
    )
    execute(
        database_url,
        "INSERT INTO feed_receipts (feed, event_id, event_order, operation_id, state, reason, "
        "first_seen_at, decided_at) VALUES ('payments', :e, 7, :op, 'held', 'bad-signature', "
        "now(), now())",
        e=event_id,
        op=uuid.uuid4(),
    )


def test_only_an_all_tenant_admin_sees_the_feeds(server: ServerProcess) -> None:
    base = server.base_url
    tenant_admin = new_principal(base, role="admin")["api_key"]
    client = new_principal(base)["api_key"]
    assert httpx.get(f"{base}/admin/v1/feeds", headers=auth(tenant_admin)).status_code == 403
    assert httpx.get(f"{base}/admin/v1/feeds", headers=auth(client)).status_code == 403
    assert httpx.get(f"{base}/admin/v1/feeds").status_code == 401
    listed = httpx.get(f"{base}/admin/v1/feeds", headers=auth(ADMIN_KEY))
    assert listed.status_code == 200, listed.text
    names = [feed["name"] for feed in listed.json()["items"]]
    assert "payments" in names
    one = httpx.get(f"{base}/admin/v1/feeds/payments", headers=auth(ADMIN_KEY))
    assert one.status_code == 200 and one.json()["kind"] == "cursor"
    assert one.json()["promises"] == ["empty-advance", "no-backfill"]
    for missing in ("nope", "BAD%00NAME", "x" * 70):
        answer = httpx.get(f"{base}/admin/v1/feeds/{missing}", headers=auth(ADMIN_KEY))
        assert answer.status_code in (400, 404), answer.text
        assert answer.headers["content-type"] == "application/problem+json"


def test_an_operator_quarantines_a_held_event_once_and_a_retry_never_deletes_one(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    hold(app_database, "held-1")
    hold(app_database, "held-2")
    shown = httpx.get(f"{base}/admin/v1/feeds/payments", headers=auth(ADMIN_KEY)).json()
    assert {h["event_id"] for h in shown["holds"]} >= {"held-1", "held-2"}

    url = f"{base}/admin/v1/feeds/payments/holds"
    quarantined = httpx.post(
        f"{url}/held-1", json={"action": "quarantine"}, headers=auth(ADMIN_KEY)
    )
    assert quarantined.status_code == 200, quarantined.text
    assert quarantined.json()["state"] == "quarantined"
    again = httpx.post(f"{url}/held-1", json={"action": "retry"}, headers=auth(ADMIN_KEY))
    assert again.status_code == 404  # final now: nothing to decide
    # held-2 kept no event (a hold written without one): a retry has nothing to decide
    # again, so the hold stays, listed with its age
    retried = httpx.post(f"{url}/held-2", json={"action": "retry"}, headers=auth(ADMIN_KEY))
    assert retried.status_code == 200 and retried.json()["state"] == "held"
    shown = httpx.get(f"{base}/admin/v1/feeds/payments", headers=auth(ADMIN_KEY)).json()
    holds = {h["event_id"]: h for h in shown["holds"]}
    assert "held-1" not in holds and holds["held-2"]["age"] >= 0
    assert holds["held-2"]["kept"] is False
    assert shown["open_holds"] >= 1
    bad = httpx.post(f"{url}/held-3", json={"action": "forget"}, headers=auth(ADMIN_KEY))
    assert bad.status_code == 400
    tenant_admin = new_principal(base, role="admin")["api_key"]
    hold(app_database, "held-4")
    refused = httpx.post(f"{url}/held-4", json={"action": "retry"}, headers=auth(tenant_admin))
    assert refused.status_code == 403


def test_every_open_hold_can_be_paged_through_oldest_first(
    server: ServerProcess, app_database: str
) -> None:
    """More holds than a page: each comes once, oldest first (ties by event id, whatever
    characters it has); a cursor that is not one of ours is a 400 problem."""
    base = server.base_url
    feed = "paged-" + uuid.uuid4().hex[:8]
    execute(
        app_database, "INSERT INTO feed_checkpoints (name, kind) VALUES (:n, 'timestamp')", n=feed
    )
    expected = [f"e{n}|x" for n in range(7)]
    for n, event_id in enumerate(expected):
        execute(
            app_database,
            "INSERT INTO feed_receipts (feed, event_id, event_order, state, reason, "
            "first_seen_at, decided_at) VALUES (:f, :e, 1, 'held', 'unknown-operation', "
            "timestamp '2026-01-01 00:00:00+00' + make_interval(secs => :s), now())",
            f=feed,
            e=event_id,
            s=n // 2,  # two holds per moment: the event id breaks the tie
        )
    url = f"{base}/admin/v1/feeds/{feed}/holds"
    seen: list[str] = []
    after: str | None = None
    for _ in range(5):
        params = {"limit": "3"} | ({"after": after} if after else {})
        page = httpx.get(url, params=params, headers=auth(ADMIN_KEY))
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["open_holds"] == 7
        seen += [h["event_id"] for h in body["items"]]
        after = body["next"]
        if after is None:
            break
    assert seen == expected
    nul = base64.urlsafe_b64encode(b"2026-01-01T00:00:00+00:00|\x00").decode()
    for bad in (
        {"after": "bm90IG91cnM="},
        {"after": "%%%"},
        {"after": nul},
        {"limit": "0"},
        {"limit": "501"},
    ):
        refused = httpx.get(url, params=bad, headers=auth(ADMIN_KEY))
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.headers["content-type"] == "application/problem+json"
    missing = httpx.get(f"{base}/admin/v1/feeds/nope-{feed}/holds", headers=auth(ADMIN_KEY))
    assert missing.status_code == 404
    tenant_admin = new_principal(base, role="admin")["api_key"]
    assert httpx.get(url, headers=auth(tenant_admin)).status_code == 403


def test_an_operator_accepts_a_conflicting_identity_once(
    server: ServerProcess, app_database: str
) -> None:
    """The receipt of the event and the one holding the place it was served at are
    unpinned; the alarm stays as conflict-accepted; a second accept finds nothing."""
    base = server.base_url
    feed = "conflicted-" + uuid.uuid4().hex[:8]
    execute(app_database, "INSERT INTO feed_checkpoints (name, kind) VALUES (:n, 'cursor')", n=feed)
    for event_id, position in (("moved", 3), ("owner", 8)):
        execute(
            app_database,
            "INSERT INTO feed_receipts (feed, event_id, event_order, state, reason, "
            "first_seen_at, decided_at) VALUES (:f, :e, :p, 'applied', 'applied', now(), now())",
            f=feed,
            e=event_id,
            p=position,
        )
    execute(
        app_database,
        "INSERT INTO feed_alarms (feed, kind, event_id, detail, event_order) VALUES "
        "(:f, 'conflicting-identity', 'moved', 'event seen at position 3, now at 8', 8)",
        f=feed,
    )
    url = f"{base}/admin/v1/feeds/{feed}/conflicts/moved"
    tenant_admin = new_principal(base, role="admin")["api_key"]
    assert httpx.post(url, json={"action": "accept"}, headers=auth(tenant_admin)).status_code == 403
    for bad in ({"action": "forget"}, {}, {"action": "accept", "also": 1}):
        refused = httpx.post(url, json=bad, headers=auth(ADMIN_KEY))
        assert refused.status_code == 400, (bad, refused.text)

    accepted = httpx.post(url, json={"action": "accept"}, headers=auth(ADMIN_KEY))

    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["unpinned"] == ["moved", "owner"]
    again = httpx.post(url, json={"action": "accept"}, headers=auth(ADMIN_KEY))
    assert again.status_code == 404
    assert again.headers["content-type"] == "application/problem+json"
    view = httpx.get(f"{base}/admin/v1/feeds/{feed}", headers=auth(ADMIN_KEY)).json()
    assert [(a["kind"], a["event_id"]) for a in view["alarms"]] == [("conflict-accepted", "moved")]


def test_an_event_twice_in_one_page_is_not_accepted(
    server: ServerProcess, app_database: str
) -> None:
    """The alarm of an event served twice in one page (here by the reconciliation walk): a
    409 problem saying the source must serve the page in order; the alarm and the receipts
    stay as they were."""
    base = server.base_url
    feed = "twice-" + uuid.uuid4().hex[:8]
    execute(app_database, "INSERT INTO feed_checkpoints (name, kind) VALUES (:n, 'cursor')", n=feed)
    for event_id, position in (("twice", 3), ("owner", 8)):
        execute(
            app_database,
            "INSERT INTO feed_receipts (feed, event_id, event_order, state, reason, "
            "first_seen_at, decided_at) VALUES (:f, :e, :p, 'applied', 'applied', now(), now())",
            f=feed,
            e=event_id,
            p=position,
        )
    detail = "reconciliation: served twice in one page: at 3 and at 8, with the same content"
    execute(
        app_database,
        "INSERT INTO feed_alarms (feed, kind, event_id, detail, event_order) VALUES "
        "(:f, 'conflicting-identity', 'twice', :d, 8)",
        f=feed,
        d=detail,
    )
    url = f"{base}/admin/v1/feeds/{feed}/conflicts/twice"

    refused = httpx.post(url, json={"action": "accept"}, headers=auth(ADMIN_KEY))

    assert refused.status_code == 409, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["type"] == "/problems/conflict-in-one-page"
    assert "serves the page in order" in refused.json()["detail"]
    view = httpx.get(f"{base}/admin/v1/feeds/{feed}", headers=auth(ADMIN_KEY)).json()
    kept = [(a["kind"], a["event_id"], a["count"], a["detail"]) for a in view["alarms"]]
    assert kept == [("conflicting-identity", "twice", 1, detail)]
    pinned = "SELECT count(*) FROM feed_receipts WHERE feed = :f AND pinned"
    assert scalar(app_database, pinned, f=feed) == 2


def test_metrics_show_the_feeds_figures(server: ServerProcess, app_database: str) -> None:
    hold(app_database, "held-m")
    until(
        lambda: (
            'settlement_feed_events{feed="payments",state="held"}'
            in httpx.get(f"{server.base_url}/metrics", headers=auth(ADMIN_KEY)).text
        ),
        "the held event is in the figures read next",
    )
