"""Idempotent transfers over HTTP against a real server, PostgreSQL and Redis."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.e2e.client import (
    auth,
    balance,
    new_account,
    new_principal,
    scalar,
    transfer,
)
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def test_first_request_executes_and_retry_replays_identically(
    server: ServerProcess, app_database: str
) -> None:
    client = new_principal(server.base_url)
    key = client["api_key"]
    source = new_account(server.base_url, key, 100)
    destination = new_account(server.base_url, key, 0)

    first = transfer(server.base_url, key, "pay-1", source, destination, 30)
    retry = transfer(server.base_url, key, "pay-1", source, destination, 30)

    assert first.status_code == 201
    assert first.headers["idempotent-replayed"] == "false"
    assert retry.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert retry.headers["content-type"] == first.headers["content-type"]
    assert retry.headers["operation-id"] == first.headers["operation-id"]
    assert balance(server.base_url, key, source) == 70
    assert balance(server.base_url, key, destination) == 30
    assert (
        scalar(app_database, "SELECT count(*) FROM transfers WHERE source_id = :s", s=source) == 1
    )


def test_same_key_with_another_amount_is_a_fingerprint_mismatch(server: ServerProcess) -> None:
    key = new_principal(server.base_url)["api_key"]
    source = new_account(server.base_url, key, 100)
    destination = new_account(server.base_url, key, 0)
    assert transfer(server.base_url, key, "k", source, destination, 10).status_code == 201

    other = transfer(server.base_url, key, "k", source, destination, 11)

    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["type"] == "/problems/fingerprint-mismatch"
    assert balance(server.base_url, key, source) == 90


def test_reordered_keys_whitespace_and_explicit_default_replay(server: ServerProcess) -> None:
    key = new_principal(server.base_url)["api_key"]
    source = new_account(server.base_url, key, 100)
    destination = new_account(server.base_url, key, 0)
    first = transfer(server.base_url, key, '"quoted-key"', source, destination, 10)
    assert first.status_code == 201

    body = (
        '{ "currency" : "EUR",\n  "amount": 10, "memo": null,'
        f'  "destination": "{destination}", "source": "{source}" }}'
    )
    again = httpx.post(
        f"{server.base_url}/v1/transfers",
        content=body,
        headers={**auth(key), "Idempotency-Key": "quoted-key", "Content-Type": "application/json"},
    )
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert balance(server.base_url, key, source) == 90


def test_another_principal_with_the_same_key_gets_its_own_operation(
    server: ServerProcess,
) -> None:
    alice = new_principal(server.base_url)["api_key"]
    bob = new_principal(server.base_url)["api_key"]
    a_src, a_dst = new_account(server.base_url, alice, 50), new_account(server.base_url, alice, 0)
    b_src, b_dst = new_account(server.base_url, bob, 50), new_account(server.base_url, bob, 0)

    a = transfer(server.base_url, alice, "shared-key", a_src, a_dst, 5)
    b = transfer(server.base_url, bob, "shared-key", b_src, b_dst, 7)

    assert a.status_code == b.status_code == 201
    assert b.headers["idempotent-replayed"] == "false"
    assert a.headers["operation-id"] != b.headers["operation-id"]
    # neither may read the other's operation, nor account
    mine = httpx.get(
        f"{server.base_url}/v1/operations/{a.headers['operation-id']}", headers=auth(alice)
    )
    theirs = httpx.get(
        f"{server.base_url}/v1/operations/{a.headers['operation-id']}", headers=auth(bob)
    )
    assert mine.status_code == 200
    assert theirs.status_code == 404
    assert theirs.json()["type"] == "/problems/not-found"


def test_insufficient_funds_is_stored_and_replayed_after_funding(server: ServerProcess) -> None:
    key = new_principal(server.base_url)["api_key"]
    poor = new_account(server.base_url, key, 5)
    rich = new_account(server.base_url, key, 1000)
    other = new_account(server.base_url, key, 0)

    refused = transfer(server.base_url, key, "too-much", poor, other, 50)
    assert refused.status_code == 402
    assert refused.json()["type"] == "/problems/insufficient-funds"

    assert transfer(server.base_url, key, "fund", rich, poor, 500).status_code == 201
    replayed = transfer(server.base_url, key, "too-much", poor, other, 50)

    assert replayed.status_code == 402
    assert replayed.headers["idempotent-replayed"] == "true"
    assert replayed.content == refused.content
    assert balance(server.base_url, key, poor) == 505
    assert balance(server.base_url, key, other) == 0


def test_unknown_account_is_a_stored_404_outcome(server: ServerProcess) -> None:
    key = new_principal(server.base_url)["api_key"]
    source = new_account(server.base_url, key, 10)
    missing = str(uuid.uuid4())
    first = transfer(server.base_url, key, "ghost", source, missing, 1)
    again = transfer(server.base_url, key, "ghost", source, missing, 1)
    assert first.status_code == again.status_code == 404
    assert first.json()["type"] == "/problems/account-not-found"
    assert again.headers["idempotent-replayed"] == "true"


def test_another_tenants_account_is_not_found(server: ServerProcess) -> None:
    acme = new_principal(server.base_url, tenant="acme")["api_key"]
    globex = new_principal(server.base_url, tenant="globex")["api_key"]
    account = new_account(server.base_url, acme, 10)
    response = httpx.get(f"{server.base_url}/v1/accounts/{account}", headers=auth(globex))
    assert response.status_code == 404
    theirs = new_account(server.base_url, globex, 10)
    attempt = transfer(server.base_url, globex, "steal", account, theirs, 5)
    assert attempt.status_code == 404
    assert balance(server.base_url, acme, account) == 10


def test_status_resource_shows_the_settled_operation(server: ServerProcess) -> None:
    key = new_principal(server.base_url)["api_key"]
    source = new_account(server.base_url, key, 10)
    destination = new_account(server.base_url, key, 0)
    done = transfer(server.base_url, key, "status-me", source, destination, 4)

    by_id = httpx.get(
        f"{server.base_url}/v1/operations/{done.headers['operation-id']}", headers=auth(key)
    )
    by_key = httpx.get(
        f"{server.base_url}/v1/operations", params={"key": "status-me"}, headers=auth(key)
    )

    assert by_id.status_code == by_key.status_code == 200
    view = by_id.json()
    assert view == by_key.json()
    assert view["state"] == "completed"
    assert view["route"] == "POST /v1/transfers"
    assert view["key"] == "status-me"
    assert view["binding_generation"] == 1
    assert view["result"]["status"] == 201
    assert view["result"]["body"] == json.loads(done.content)
    assert [a["outcome"] for a in view["attempts"]] == ["completed"]
    assert view["attempts"][0]["response_status"] == 201
    assert view["epochs"] == []
    assert view["conflict"] is None
