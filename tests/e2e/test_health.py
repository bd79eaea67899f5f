"""GET /health and start-up refusals, against a real server process over HTTP."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Services, fresh_database
from tests.e2e.server import ServerProcess, free_port

pytestmark = pytest.mark.e2e


def test_health_reports_both_dependencies_ok(services: Services, migrated_url: str) -> None:
    with ServerProcess(migrated_url, services.redis_url) as server:
        response = httpx.get(f"{server.base_url}/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_health_names_the_failed_dependency(services: Services, migrated_url: str) -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    with ServerProcess(migrated_url, dead_redis) as server:
        response = httpx.get(f"{server.base_url}/health")
    assert response.status_code == 503
    assert response.json() == {"status": "degraded", "database": "ok", "redis": "unavailable"}


def test_unknown_route_is_a_problem_document(services: Services, migrated_url: str) -> None:
    with ServerProcess(migrated_url, services.redis_url) as server:
        response = httpx.get(f"{server.base_url}/v1/nothing-here")
        wrong_method = httpx.delete(f"{server.base_url}/health")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "/problems/not-found"
    assert wrong_method.status_code == 405
    assert wrong_method.json()["type"] == "/problems/method-not-allowed"


def test_server_refuses_to_start_on_unmigrated_database(services: Services) -> None:
    url = fresh_database(services, "unmigrated_e2e")
    server = ServerProcess(url, services.redis_url)
    server.start(wait=False)
    try:
        code = server.wait_exit()
    finally:
        server.stop()
    assert code != 0
    assert "settlement migrate" in server.output()


def test_invalid_setting_fails_at_start_naming_the_variable(
    services: Services, migrated_url: str
) -> None:
    server = ServerProcess(
        migrated_url, services.redis_url, env={"SETTLEMENT_LEASE_TTL": "ten seconds"}
    )
    server.start(wait=False)
    try:
        code = server.wait_exit()
    finally:
        server.stop()
    assert code == 2
    assert "SETTLEMENT_LEASE_TTL" in server.output()
