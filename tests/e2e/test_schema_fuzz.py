"""Schemathesis over the committed openapi/openapi.json against a real server: for a bounded
number of generated requests per operation (valid and invalid), no 5xx, every answer's
status, content type, headers and body as documented, and invalid input refused with a
problem document.

Each operation is called with a real key of the role it is for: admin routes with the
bootstrap admin key, observations with an observer's, the client routes with a client's.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.http.openapi import OPENAPI_JSON
from tests.e2e.client import ADMIN_KEY, auth, new_principal
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# generated requests per operation and mode: 21 operations, two modes, well under a minute
EXAMPLES = 10
PROBLEM = "application/problem+json"
# A valid Idempotency-Key as the schema states it.
VALID_KEY = re.compile(r"[\x21\x23-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
# Operations whose valid-looking input the server may still refuse, and why: the schema
# cannot state a signature only the provider's secret makes, nor a cursor only the server
# makes; both are 4xx by design, so "schema-valid input is accepted" does not hold there.
UNGUESSABLE = {
    "postObservation": "evidence needs a signature made with the provider's secret",
    "listWork": "the after cursor is opaque: only one the server made is valid",
}

schema = schemathesis.openapi.from_path(str(OPENAPI_JSON))
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    deterministic=True,
    database="none",
)


@pytest.fixture(scope="module")
def keys(server: ServerProcess) -> dict[str, str]:
    return {
        "admin": ADMIN_KEY,
        "client": new_principal(server.base_url, role="client")["api_key"],
        "observer": new_principal(server.base_url, role="observer")["api_key"],
    }


def integers_as_integers(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer; this API takes amounts written as integers only
    (tests/contract.py: "a JSON integer, not a float"; the schema says so in words), so a
    valid request the generator writes as 5.0 is sent as 5."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integers_as_integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integers_as_integers(v) for v in value]
    return value


def as_the_api_means_it(case: Any) -> None:
    """Adjust a valid generated request where the API is stricter than JSON Schema can say."""
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and VALID_KEY.fullmatch(key):
        # one key per generated request: the examples reuse keys with other bodies, and the
        # server rightly answers 422 fingerprint-mismatch to that
        case.headers["Idempotency-Key"] = key[:200] + uuid.uuid4().hex
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return
    case.body = body = integers_as_integers(case.body)
    if isinstance(body, dict) and "source" in body and body["source"] == body.get("destination"):
        # the one rule of a transfer JSON Schema cannot state (its schema says it in words)
        body["destination"] = str(uuid.uuid4())
    if isinstance(body, dict) and isinstance(body.get("result"), dict) and "outcome" in body:
        # a resolution's status follows its outcome (its schema says it in words)
        body["result"]["status"] = 201 if body["outcome"] == "completed" else 409


def role_for(path: str) -> str:
    if path.startswith("/admin/"):
        return "admin"
    if path == "/v1/observations":
        return "observer"
    return "client"


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(
    case: Any, server: ServerProcess, keys: dict[str, str]
) -> None:
    operation = case.operation.definition.raw
    headers = auth(keys[role_for(case.path)]) if operation.get("security") else {}
    as_the_api_means_it(case)
    excluded = [positive_data_acceptance] if operation.get("operationId") in UNGUESSABLE else []
    response = case.call_and_validate(
        base_url=server.base_url, headers=headers, excluded_checks=excluded, timeout=15
    )
    if 400 <= response.status_code < 500:
        assert response.headers.get("content-type") == [PROBLEM], response.text
