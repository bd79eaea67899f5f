"""Who may manage which principal: tenant admins their own tenant's, only an all-tenant
admin the bootstrap admin; tenant `system` is reserved; a revoked key stops at once; a rotated
bootstrap key is not restored by a restart."""

from __future__ import annotations

from typing import Any

import httpx

from service.store.migrate import upgrade
from tests.conftest import Services, fresh_database
from tests.e2e.client import ADMIN_KEY, auth, new_principal, scalar
from tests.e2e.server import ServerProcess


def post(base: str, path: str, key: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body or {}, headers=auth(key), timeout=30)


def bootstrap_id(database_url: str) -> str:
    return str(scalar(database_url, "SELECT id::text FROM principals WHERE tenant = 'system'"))


def test_a_tenant_admin_cannot_touch_the_bootstrap_admin_or_the_system_tenant(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    tenant_admin = new_principal(base, tenant="acme-admins", role="admin")["api_key"]
    boot = bootstrap_id(app_database)
    for action in ("rotate", "revoke"):
        refused = post(base, f"/admin/v1/principals/{boot}/{action}", tenant_admin)
        assert refused.status_code == 404, refused.text
    for key in (tenant_admin, ADMIN_KEY):
        reserved = post(
            base, "/admin/v1/principals", key, {"tenant": "system", "name": "x", "role": "admin"}
        )
        assert reserved.status_code == 403, reserved.text
        assert reserved.json()["type"] == "/problems/forbidden"
    # the bootstrap admin's key was left alone
    probe = httpx.get(f"{base}/admin/v1/operations?state=unknown", headers=auth(ADMIN_KEY))
    assert probe.status_code == 200, probe.text


def test_a_revoked_key_stops_at_once(server: ServerProcess) -> None:
    base = server.base_url
    client = new_principal(base)
    alive = httpx.get(f"{base}/v1/operations?key=k", headers=auth(client["api_key"]))
    assert alive.status_code != 401, alive.text
    revoked = post(base, f"/admin/v1/principals/{client['id']}/revoke", ADMIN_KEY)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["id"] == client["id"] and revoked.json()["revoked_at"]
    gone = httpx.get(f"{base}/v1/operations?key=k", headers=auth(client["api_key"]))
    assert gone.status_code == 401
    again = post(base, f"/admin/v1/principals/{client['id']}/revoke", ADMIN_KEY)
    assert again.status_code == 404


def test_a_rotated_bootstrap_key_survives_a_restart(services: Services) -> None:
    database = fresh_database(services, "bootstrap")
    upgrade(database)
    env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY}
    with ServerProcess(database, services.redis_url, env=env) as first:
        rotated = post(
            first.base_url, f"/admin/v1/principals/{bootstrap_id(database)}/rotate", ADMIN_KEY
        )
        assert rotated.status_code == 200, rotated.text
        new_key = rotated.json()["api_key"]
    with ServerProcess(database, services.redis_url, env=env) as second:
        probe = "/admin/v1/operations?state=unknown"
        old = httpx.get(f"{second.base_url}{probe}", headers=auth(ADMIN_KEY))
        assert old.status_code == 401  # the compromised key is not brought back
        new = httpx.get(f"{second.base_url}{probe}", headers=auth(new_key))
        assert new.status_code == 200, new.text
        assert "not restored" in second.output()


def test_metrics_can_require_a_role(services: Services, app_database: str) -> None:
    env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_METRICS_ROLE": "observer"}
    with ServerProcess(app_database, services.redis_url, env=env) as guarded:
        base = guarded.base_url
        assert httpx.get(f"{base}/metrics").status_code == 401
        client = new_principal(base)["api_key"]
        assert httpx.get(f"{base}/metrics", headers=auth(client)).status_code == 403
        observer = new_principal(base, role="observer")["api_key"]
        for key in (observer, ADMIN_KEY):
            scraped = httpx.get(f"{base}/metrics", headers=auth(key))
            assert scraped.status_code == 200, scraped.text
            assert "settlement_claims_total" in scraped.text
