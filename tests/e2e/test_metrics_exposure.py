"""Review finding 4: /metrics is an admin's by default (``none`` opens it, knowingly), and a
scrape reads no table: the feeds' figures are read in the background by one worker of the
server, on a connection of its own, and a scrape shows the last ones with their age."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from service.app.root import FIGURES_CONNECTION
from service.store.migrate import upgrade
from tests.conftest import Services, fresh_database
from tests.e2e.client import ADMIN_KEY, auth, execute, new_principal, scalar, until
from tests.e2e.server import ServerProcess
from tests.reliability.relay import Relay

pytestmark = pytest.mark.e2e

HELD = 'settlement_feed_events{feed="payments",state="held"}'
# the figures are read this often here, so a change shows soon
INTERVAL = "0.2"


def receipts(database_url: str, state: str, count: int) -> None:
    """``count`` receipts of feed ``payments`` in ``state``, written as an observer would."""
    execute(
        database_url,
        "INSERT INTO feed_checkpoints (name, kind) VALUES ('payments', 'cursor') "
        "ON CONFLICT DO NOTHING",
    )
    execute(
        database_url,
        "INSERT INTO feed_receipts (feed, event_id, event_order, operation_id, state, reason, "
        "first_seen_at, decided_at) SELECT 'payments', :prefix || n, n, gen_random_uuid(), "
        ":state, 'bad-signature', now(), now() FROM generate_series(1, :count) AS n",
        prefix=f"{state}-{uuid.uuid4().hex[:8]}-",
        state=state,
        count=count,
    )


def figure(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def test_anonymous_metrics_are_refused_by_default(server: ServerProcess) -> None:
    base = server.base_url
    anonymous = httpx.get(f"{base}/metrics")
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.headers["content-type"] == "application/problem+json"
    assert "settlement_" not in anonymous.text
    client = new_principal(base)["api_key"]
    assert httpx.get(f"{base}/metrics", headers=auth(client)).status_code == 403
    observer = new_principal(base, role="observer")["api_key"]
    assert httpx.get(f"{base}/metrics", headers=auth(observer)).status_code == 403
    scraped = httpx.get(f"{base}/metrics", headers=auth(ADMIN_KEY))
    assert scraped.status_code == 200, scraped.text
    assert "settlement_feed_figures_age_seconds" in scraped.text


def test_metrics_are_open_only_when_the_operator_says_none(
    services: Services, app_database: str
) -> None:
    env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_METRICS_ROLE": "none"}
    with ServerProcess(app_database, services.redis_url, env=env) as open_server:
        scraped = httpx.get(f"{open_server.base_url}/metrics")
        assert scraped.status_code == 200, scraped.text
        assert "settlement_http_requests_total" in scraped.text


def test_a_scrape_reads_no_table_it_answers_while_the_database_is_gone(
    services: Services,
) -> None:
    """The server reaches PostgreSQL through a relay; once the relay is cut, scrapes still
    answer with the last figures read, their age growing, and the next read after the relay
    is back brings fresh ones."""
    database = fresh_database(services, "scrape")
    upgrade(database)
    backend = urlsplit(database).port
    assert backend is not None
    relay = Relay(backend).start()
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_METRICS_ROLE": "none",  # no key to look up: the scrape alone
        "SETTLEMENT_FEED_FIGURES_INTERVAL": INTERVAL,
        "SETTLEMENT_DB_CONNECT_TIMEOUT": "1",
    }
    try:
        with ServerProcess(relay.url_for(database, backend), services.redis_url, env=env) as s:
            base = s.base_url
            receipts(database, "held", 3)
            until(lambda: figure(httpx.get(f"{base}/metrics").text, HELD) == 3, "3 held shown")
            relay.cut()
            receipts(database, "held", 2)  # written while the server cannot read them
            # the age grows past many intervals: no read succeeds, yet every scrape answers
            for _ in range(3):
                until(
                    lambda: (
                        (scraped := httpx.get(f"{base}/metrics")).status_code == 200
                        and figure(scraped.text, HELD) == 3
                        and (figure(scraped.text, "settlement_feed_figures_age_seconds") or 0) > 2.0
                    ),
                    "the last figures, older and older, while the database is away",
                )
            relay.restore()
            until(lambda: figure(httpx.get(f"{base}/metrics").text, HELD) == 5, "5 held shown")
            age = figure(httpx.get(f"{base}/metrics").text, "settlement_feed_figures_age_seconds")
            assert age is not None and age < 2.0
    finally:
        relay.stop()


def test_one_worker_of_the_server_reads_the_figures_on_its_own_connection(
    services: Services, tmp_path: Path
) -> None:
    database = fresh_database(services, "readers")  # no other server reads it
    upgrade(database)
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_FEED_FIGURES_INTERVAL": INTERVAL,
        "SETTLEMENT_METRICS_DIR": str(tmp_path),
    }
    readers = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = :name"
    )
    with ServerProcess(database, services.redis_url, env=env, workers=2) as two:
        until(
            lambda: len({p.stem.rsplit("_", 1)[1] for p in tmp_path.glob("counter_*.db")}) == 2,
            "both workers are up",
        )
        receipts(database, "quarantined", 4)
        for _ in range(2):  # through two reads, from whichever worker answers
            until(
                lambda: (
                    figure(
                        (t := httpx.get(f"{two.base_url}/metrics", headers=auth(ADMIN_KEY)).text),
                        'settlement_feed_events{feed="payments",state="quarantined"}',
                    )
                    is not None
                    and (figure(t, "settlement_feed_figures_age_seconds") or 9) < 0.1
                ),
                "figures read just now",
            )
            assert scalar(database, readers, name=FIGURES_CONNECTION) == 1
