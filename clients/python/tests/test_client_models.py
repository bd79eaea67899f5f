"""The client's models are what the published OpenAPI document says (a drift test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import msgspec
from settlement_client import AsyncClient, Client, IntendedAction, Transfer
from settlement_client.models import TransferRequest

ROOT = Path(__file__).resolve().parents[1]


def _generator(name: str = "generate_models"):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_models_match_the_openapi_document() -> None:
    generator = _generator()
    document = json.loads(generator.DEFAULT_SCHEMA.read_text())
    expected = generator.render(document)
    assert generator.TARGET.read_text() == expected, (
        "openapi/openapi.json changed: run python clients/python/scripts/generate_models.py"
    )


def test_the_actions_match_the_openapi_document() -> None:
    """Every idempotent operation of the document is a ``create_<kind>`` method of both
    clients and an ``IntendedAction.<kind>`` constructor."""
    generator = _generator("generate_actions")
    document = json.loads(generator.DEFAULT_SCHEMA.read_text())
    assert generator.TARGET.read_text() == generator.render(document), (
        "openapi/openapi.json changed: run python clients/python/scripts/generate_actions.py"
    )
    kinds = [action["kind"] for action in generator.actions(document)]
    assert "transfer" in kinds and len(set(kinds)) == len(kinds)
    for kind in kinds:
        assert callable(getattr(Client, f"create_{kind}"))
        assert callable(getattr(AsyncClient, f"create_{kind}"))
        assert callable(getattr(IntendedAction, kind))


def test_a_request_leaves_out_its_defaults_and_an_answer_ignores_new_fields() -> None:
    body = msgspec.json.encode(
        TransferRequest(source="a", destination="b", amount=1, currency="EUR")
    )
    assert json.loads(body) == {"source": "a", "destination": "b", "amount": 1, "currency": "EUR"}
    newer = {
        "id": "t",
        "source": "a",
        "destination": "b",
        "amount": 1,
        "currency": "EUR",
        "memo": None,
        "created_at": "now",
        "added_later": True,
    }
    assert msgspec.json.decode(json.dumps(newer), type=Transfer).amount == 1
