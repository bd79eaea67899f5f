"""GET /health, /livez, /readyz and start-up refusals, against a real server process."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.conftest import Services, fresh_database
from tests.e2e.proxy import TcpProxy
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


def test_livez_and_readyz_when_both_dependencies_answer(
    services: Services, migrated_url: str
) -> None:
    with ServerProcess(migrated_url, services.redis_url) as server:
        live = httpx.get(f"{server.base_url}/livez")
        ready = httpx.get(f"{server.base_url}/readyz")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": "ok", "redis": "ok"}


def test_readyz_stays_ready_with_redis_down_since_replays_still_work(
    services: Services, migrated_url: str
) -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    with ServerProcess(migrated_url, dead_redis) as server:
        ready = httpx.get(f"{server.base_url}/readyz")
        live = httpx.get(f"{server.base_url}/livez")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": "ok", "redis": "degraded"}
    assert live.status_code == 200


def test_readyz_is_503_once_the_database_is_unreachable_and_livez_still_200(
    services: Services, migrated_url: str
) -> None:
    url = make_url(migrated_url)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        env = {"SETTLEMENT_HEALTH_TIMEOUT": "1", "SETTLEMENT_DB_CONNECT_TIMEOUT": "1"}
        with ServerProcess(proxied, services.redis_url, env=env) as server:
            before = httpx.get(f"{server.base_url}/readyz")
            proxy.cut()
            after = httpx.get(f"{server.base_url}/readyz", timeout=10)
            live = httpx.get(f"{server.base_url}/livez")
    assert before.status_code == 200
    assert after.status_code == 503
    assert after.json()["status"] == "unavailable"
    assert after.json()["database"] in ("unavailable", "timeout")
    assert live.status_code == 200
    assert live.json() == {"status": "ok"}
