"""The problem-type registry: every slug declared once, its status and title as the contract
says, and everything derived from it (pages, business failures, the OpenAPI headers, the
client's exception classes) in step with it."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from service.app.effects import business_outcome
from service.errors import SettlementError
from service.http.contract import all_slugs
from service.http.pages import PAGES
from service.problem_types import PROBLEM_TYPES, business_failures, problem_type

ROOT = Path(__file__).resolve().parents[2]

# slug, status, title: public API (docs/design.md section 6), as they were before the registry
CONTRACT = [
    ("unauthenticated", 401, "Authentication required"),
    ("forbidden", 403, "Forbidden"),
    ("validation-error", 400, "Invalid request"),
    ("idempotency-key-missing", 400, "Idempotency-Key header missing"),
    ("idempotency-key-invalid", 400, "Idempotency-Key header invalid"),
    ("fingerprint-mismatch", 422, "Idempotency key reused with a different request"),
    ("binding-mismatch", 409, "Reservation bound to another credential"),
    ("operation-in-progress", 409, "Operation in progress"),
    ("operation-conflict", 409, "Operation outcome in conflict"),
    ("operation-superseded", 409, "Operation superseded while this attempt ran"),
    ("operation-outcome-unknown", 504, "Operation outcome unknown"),
    ("effect-refused", 409, "Effect refused by a database constraint"),
    ("idempotency-key-expired", 410, "Idempotency key expired"),
    ("lease-unavailable", 503, "Lease store unavailable"),
    ("not-found", 404, "Not found"),
    ("method-not-allowed", 405, "Method not allowed"),
    ("payload-too-large", 413, "Payload too large"),
    ("request-timeout", 408, "Request body too slow"),
    ("unsupported-media-type", 415, "Unsupported media type"),
    ("too-many-requests", 429, "Too many requests running for this principal"),
    ("invalid-evidence", 422, "Evidence signature does not verify"),
    ("evidence-quota-exceeded", 429, "Too much of this observer's evidence was quarantined"),
    ("service-unavailable", 503, "Service unavailable"),
    ("principal-exists", 409, "Principal exists"),
    ("principal-limit", 409, "The tenant holds as many principals as it may"),
    ("supersede-needs-force", 409, "Superseding a completed operation needs force"),
    ("conflict-in-one-page", 409, "An event twice in one page is for the source to fix"),
    ("internal-error", 500, "Internal server error"),
    ("insufficient-funds", 402, "Insufficient funds"),
    ("account-not-found", 404, "Account not found"),
    ("currency-mismatch", 422, "Currency mismatch"),
    ("balance-limit", 422, "Balance limit exceeded"),
    ("payout-declined", 402, "Payout declined"),
    ("transfer-not-found", 404, "Transfer not found"),
    ("transfer-not-refundable", 422, "Transfer not refundable"),
    ("refund-exceeds-transfer", 422, "Refund exceeds transfer"),
    ("resolution-refused", 409, "Resolution refused"),
]
# what was answered with Retry-After before the registry (contract.py's table)
RETRY_AFTER = {
    "request-timeout",
    "operation-in-progress",
    "effect-refused",
    "operation-outcome-unknown",
    "lease-unavailable",
    "too-many-requests",
    "evidence-quota-exceeded",
    "service-unavailable",
}


def _generator() -> ModuleType:
    path = ROOT / "clients" / "python" / "scripts" / "generate_problems.py"
    spec = importlib.util.spec_from_file_location("generate_problems", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_slug_keeps_its_status_and_title() -> None:
    declared = [(slug, p.status, p.title) for slug, p in PROBLEM_TYPES.items()]
    assert sorted(declared) == sorted(CONTRACT)
    assert all_slugs() == {slug: (status, title) for slug, status, title in CONTRACT}


def test_every_slug_has_a_page_with_its_registry_text() -> None:
    assert set(PAGES) == set(PROBLEM_TYPES)
    for slug, page in PAGES.items():
        problem = problem_type(slug)
        assert (page.status, page.title) == (problem.status, problem.title)
        assert page.what_happened == problem.what_happened and problem.what_happened
        assert page.what_to_do == problem.what_to_do and problem.what_to_do
        assert page.retry_with_same_key_safe is problem.retry_safe


def test_headers_carried_are_those_answered_before() -> None:
    assert {s for s, p in PROBLEM_TYPES.items() if p.retry_after} == RETRY_AFTER
    assert {s for s, p in PROBLEM_TYPES.items() if p.location} == {"operation-in-progress"}


def test_business_failures_are_stored_outcomes_that_a_retry_replays() -> None:
    failures = business_failures()
    assert set(failures) == {
        "insufficient-funds",
        "account-not-found",
        "currency-mismatch",
        "balance-limit",
        "payout-declined",
        "transfer-not-found",
        "transfer-not-refundable",
        "refund-exceeds-transfer",
    }
    assert not any(p.retry_safe or p.retry_after for p in failures.values())
    outcome = business_outcome("insufficient-funds", "short", uuid.uuid4())
    assert outcome.status == 402 and b'"/problems/insufficient-funds"' in outcome.body
    with pytest.raises(ValueError, match="no business failure"):
        business_outcome("not-found", "x", uuid.uuid4())


def test_the_client_problems_module_is_what_the_generator_writes() -> None:
    generator = _generator()
    expected = generator.render(generator.registry().PROBLEM_TYPES)
    assert generator.TARGET.read_text() == expected, (
        "service/problem_types.py changed: run python clients/python/scripts/generate_problems.py"
    )


def test_the_client_has_one_class_per_slug_with_its_name_and_retry_advice() -> None:
    from settlement_client.problems import PROBLEMS, SupersedeRequired

    assert set(PROBLEMS) == set(PROBLEM_TYPES)
    for slug, cls in PROBLEMS.items():
        problem = problem_type(slug)
        assert cls.__name__ == problem.exception_name and cls.retry_safe is problem.retry_safe
        assert issubclass(cls, SupersedeRequired) is problem.supersede_required
    assert PROBLEMS["fingerprint-mismatch"].__name__ == "IdempotencyKeyReused"  # as before


def _subclasses(cls: type[SettlementError]) -> set[type[SettlementError]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_error_of_the_tree_names_a_declared_problem_type() -> None:
    import service.http.app  # noqa: F401 - every layer's errors, imported

    errors = _subclasses(SettlementError)
    assert len(errors) >= 10
    for error in errors:
        assert error.problem in PROBLEM_TYPES, error
