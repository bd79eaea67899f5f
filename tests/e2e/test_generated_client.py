"""A client team's view: generate a Python client from the committed openapi/openapi.json
with openapi-python-client, import it, and run a transfer and its replay on a real server."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from service.http.openapi import OPENAPI_JSON
from tests.e2e.client import ADMIN_KEY
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# not settlement_client: that is the name of clients/python, installed in the same .venv
PACKAGE = "generated_settlement_client"
# the generator and ruff (which formats what it writes) are this interpreter's neighbours
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    root = tmp_path_factory.mktemp("generated-client")
    done = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(OPENAPI_JSON),
            "--output-path",
            str(root / PACKAGE),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _api(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.default.{name}")


def _models() -> Any:
    return importlib.import_module(f"{PACKAGE}.models")


def test_a_generated_client_makes_a_transfer_and_replays_it(
    generated: ModuleType, server: ServerProcess
) -> None:
    models = _models()
    admin = generated.AuthenticatedClient(base_url=server.base_url, token=ADMIN_KEY)
    created = _api("create_principal").sync_detailed(
        client=admin,
        body=models.PrincipalRequest(
            tenant="acme", name=f"generated-{uuid.uuid4().hex[:8]}", role=models.Role.CLIENT
        ),
    )
    assert created.status_code == 201, created.content
    client = generated.AuthenticatedClient(base_url=server.base_url, token=created.parsed.api_key)

    accounts = []
    for balance in (100, 0):
        opened = _api("create_account").sync_detailed(
            client=client,
            body=models.AccountRequest(currency=models.Currency.EUR, opening_balance=balance),
            idempotency_key=f"open-{uuid.uuid4().hex}",
        )
        assert opened.status_code == 201, opened.content
        assert isinstance(opened.parsed, models.Account)
        accounts.append(opened.parsed.id)

    body = models.TransferRequest(
        source=accounts[0],
        destination=accounts[1],
        amount=30,
        currency=models.Currency.EUR,
        memo="rent",
    )
    key = f"pay-{uuid.uuid4().hex}"
    first = _api("create_transfer").sync_detailed(client=client, body=body, idempotency_key=key)
    again = _api("create_transfer").sync_detailed(client=client, body=body, idempotency_key=key)

    assert first.status_code == again.status_code == 201, first.content
    assert isinstance(first.parsed, models.Transfer)
    assert (first.parsed.amount, first.parsed.memo) == (30, "rent")
    assert first.headers["idempotent-replayed"] == "false"
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["operation-id"] == first.headers["operation-id"]
    assert again.content == first.content
    assert again.parsed == first.parsed

    source = _api("get_account").sync(client=client, account_id=accounts[0])
    assert isinstance(source, models.Account) and source.balance == 70


def test_the_generated_client_parses_a_problem(
    generated: ModuleType, server: ServerProcess
) -> None:
    models = _models()
    stranger = generated.AuthenticatedClient(base_url=server.base_url, token="sk_not_a_key")
    refused = _api("create_transfer").sync_detailed(
        client=stranger,
        body=models.TransferRequest(
            source=uuid.uuid4(), destination=uuid.uuid4(), amount=1, currency=models.Currency.EUR
        ),
        idempotency_key="k",
    )
    assert refused.status_code == 401
    assert isinstance(refused.parsed, models.ProblemDocument)
    assert refused.parsed.type_ == "/problems/unauthenticated"
