"""A stuck feed shows: the source answers empty pages that repeat the request's cursor (or
hold its watermark back) while events wait, so the observer's own lag looks healthy; the age
of the oldest unknown payout, which the feed should have settled, grows on the admin view and
in /metrics, and falls back once the feed moves again."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, until
from tests.e2e.observer import Observer
from tests.e2e.provider import ProviderProcess
from tests.e2e.server import ServerProcess
from tests.e2e.test_feed_observer import (
    caught_up,
    completed,
    feed_view,
    lost_payout,
    server_env,
)

pytestmark = pytest.mark.e2e

# How old the unknown payout must grow while the stuck feed looks caught up: several of the
# observer's polls (0.05 s, backing off to 0.3 s).
STUCK_FOR = 3.0


@pytest.fixture(scope="module")
def server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    # the feeds' figures of /metrics, read in the background: soon after a change
    env = {**server_env(provider), "SETTLEMENT_FEED_FIGURES_INTERVAL": "0.2"}
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


def oldest_unknown_metric(base: str) -> float:
    for line in httpx.get(f"{base}/metrics", headers=auth(ADMIN_KEY)).text.splitlines():
        if line.startswith("settlement_feed_oldest_unknown_seconds "):
            return float(line.split()[1])
    raise AssertionError("no settlement_feed_oldest_unknown_seconds in /metrics")


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
def test_a_stuck_feed_shows_in_the_age_of_the_oldest_unknown_payout(
    services: Services,
    app_database: str,
    server: ServerProcess,
    provider: ProviderProcess,
    kind: str,
) -> None:
    base = server.base_url
    made = httpx.post(
        f"{base}/admin/v1/principals",
        json={"tenant": "stuck", "name": f"c-{kind}", "role": "client"},
        headers=auth(ADMIN_KEY),
    )
    key = made.json()["api_key"]
    observer = Observer(services.redis_url, app_database, provider, kind)
    try:
        until(lambda: caught_up(base, observer.name), "the observer catches up")
        provider.arm_feed("stuck_token", 1000)
        op = lost_payout(base, key, provider)
        view = until(
            lambda: (
                (v := feed_view(base, observer.name))["oldest_unknown"] is not None
                and v["oldest_unknown"] >= STUCK_FOR
                and v
            ),
            "the unknown payout ages while the feed is stuck",
        )
        # the observer's own lag says caught up all along: only the payout's age shows it
        assert view["lag"] is not None and view["lag"] < view["oldest_unknown"]
        until(lambda: oldest_unknown_metric(base) >= STUCK_FOR, "the figures read next show it")
        provider.clear_feed_faults()
        until(lambda: completed(base, key, [op]), "the feed moves again and settles it")
        until(
            lambda: (feed_view(base, observer.name)["oldest_unknown"] or 0) < STUCK_FOR,
            "the age falls back",
        )
    finally:
        observer.stop()
