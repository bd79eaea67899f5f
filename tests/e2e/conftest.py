from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Services, fresh_database
from tests.e2e.client import ADMIN_KEY
from tests.e2e.provider import ProviderProcess
from tests.e2e.server import ServerProcess


@pytest.fixture(scope="module")
def app_database(services: Services) -> str:
    """A migrated database of this module's own, so row counts are not shared."""
    from service.store.migrate import upgrade

    url = fresh_database(services, "e2e")
    upgrade(url)
    return url


@pytest.fixture(scope="module")
def server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    with ServerProcess(
        app_database, services.redis_url, env={"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY}
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderProcess]:
    """The payout provider's simulator, one process per test module."""
    with ProviderProcess() as proc:
        yield proc
