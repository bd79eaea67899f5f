"""An idempotent route is declared once (service/app/routes.py): its handler is made from that
entry and served at the path of its scope name, so a scope and the URL a client calls cannot
drift apart, and every entry's effect names only refusals it declares."""

from __future__ import annotations

import re
import uuid

import pytest

from service.app.effects import ExecutionContext, IdempotentRoute
from service.app.routes import ROUTES, TRANSFERS
from service.domain import ledger, refunds
from service.domain.principals import Principal, Role
from service.http.idempotent import IDEMPOTENT, idempotent_handler
from service.problem_types import PROBLEM_TYPES


@pytest.mark.parametrize("spec", ROUTES, ids=lambda spec: spec.route)
def test_an_idempotent_handler_is_served_where_its_scope_is_named(spec: IdempotentRoute) -> None:
    handler = idempotent_handler(spec)
    assert handler.opt[IDEMPOTENT] is spec
    served = {f"{method} {path}" for method in handler.http_methods for path in handler.paths}
    assert served == {spec.route}


def test_a_scope_name_is_a_post_and_a_path() -> None:
    with pytest.raises(ValueError, match="POST /<path>"):
        type(TRANSFERS)(
            route="/v1/transfers", body_type=TRANSFERS.body_type, statement=TRANSFERS.statement
        )


def test_a_refusal_is_a_declared_business_failure() -> None:
    with pytest.raises(ValueError, match="no business failure"):
        type(TRANSFERS)(
            route="POST /v1/x",
            body_type=TRANSFERS.body_type,
            statement=TRANSFERS.statement,
            refusals=("not-found",),
        )


def test_every_entry_names_its_operation_summary_and_answer() -> None:
    ids = [spec.operation_id for spec in ROUTES]
    assert len(set(ids)) == len(ids) == len({spec.route for spec in ROUTES})
    for spec in ROUTES:
        assert re.fullmatch(r"create[A-Z][A-Za-z]*", spec.operation_id), spec.route
        assert spec.summary and spec.answer_type is not None, spec.route


_ID = uuid.UUID(int=1)
_EXAMPLES: dict[type, object] = {
    ledger.AccountRequest: ledger.AccountRequest(currency="EUR"),
    ledger.TransferRequest: ledger.TransferRequest(
        source=_ID, destination=uuid.UUID(int=2), amount=1, currency="EUR"
    ),
    refunds.RefundRequest: refunds.RefundRequest(transfer=_ID, amount=1, currency="EUR"),
}
_PRINCIPAL = Principal(id=_ID, tenant="t", name="n", role=Role.CLIENT, credential_generation=1)


@pytest.mark.parametrize(
    "spec", [s for s in ROUTES if s.statement is not None], ids=lambda spec: spec.route
)
def test_a_local_effect_refuses_only_with_the_refusals_its_entry_declares(
    spec: IdempotentRoute,
) -> None:
    """The slugs written into the guard's SQL are the entry's ``refusals`` (which the OpenAPI
    operation lists), so a refusal never reaches a client undocumented."""
    assert spec.statement is not None
    context = ExecutionContext(principal=_PRINCIPAL, operation_id=_ID, binding_generation=1)
    sql, _, _ = spec.statement(context, _EXAMPLES[spec.body_type])
    written = str(sql.guard().compile())
    named = {slug for slug in PROBLEM_TYPES if f"'{slug}'" in written}
    assert named == set(spec.refusals)
