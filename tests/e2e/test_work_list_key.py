"""The admin API's work list narrowed to one Idempotency-Key (``key``), in the caller's
tenant scope, and the client's ``list_work(key=...)``; a key that is not one is a 400."""

from __future__ import annotations

import uuid

import httpx
import pytest
from settlement_client import AdminClient

from tests.e2e.client import ADMIN_KEY, auth, execute, new_principal
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def _unknown(base: str, database: str, tenant: str, key: str) -> str:
    """An operation of ``tenant`` under ``key``, made ``unknown`` (as a lost answer leaves
    one) so that the work list holds it."""
    opened = httpx.post(
        f"{base}/v1/accounts",
        json={"currency": "EUR", "opening_balance": 5},
        headers={**auth(new_principal(base, tenant=tenant)["api_key"]), "Idempotency-Key": key},
    )
    assert opened.status_code == 201, opened.text
    operation = opened.headers["operation-id"]
    execute(
        database,
        "UPDATE operations SET state = 'unknown', result_status = NULL, "
        "result_content_type = NULL, result_body = NULL, result_digest = NULL, "
        "expires_at = NULL WHERE id = :i",
        i=operation,
    )
    return operation


def test_the_work_list_narrows_to_one_key_in_the_callers_reach(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    key = "order " + uuid.uuid4().hex[:8]
    ours = _unknown(base, app_database, "keyed-a", key)
    theirs = _unknown(base, app_database, "keyed-b", key)
    _unknown(base, app_database, "keyed-a", "other-" + key)
    with AdminClient(base, ADMIN_KEY) as admin:
        every = admin.list_work("unknown", key=key).value
        assert {str(item.id) for item in every.items} == {ours, theirs}
        one = admin.list_work("unknown", key=key, tenant="keyed-b").value
        assert [str(item.id) for item in one.items] == [theirs]
        assert admin.list_work("conflict", key=key).value.items == []
    tenant_admin = new_principal(base, tenant="keyed-a", role="admin")["api_key"]
    with AdminClient(base, tenant_admin) as admin:
        assert [str(item.id) for item in admin.list_work("unknown", key=key).value.items] == [ours]
    for bad in ("", "k" * 256, "a\nb", "a\x00b", "kl\u00e9"):
        refused = httpx.get(
            f"{base}/admin/v1/operations",
            params={"state": "unknown", "key": bad},
            headers=auth(ADMIN_KEY),
        )
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["type"] == "/problems/validation-error"
