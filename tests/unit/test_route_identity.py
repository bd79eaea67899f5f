"""An idempotent route is named once (service/app/routes.py): its handler is served at the path
of that name, so a scope and the URL a client calls cannot drift apart."""

from __future__ import annotations

from typing import Any

import pytest

from service.app.routes import ACCOUNTS, TRANSFERS, payouts
from service.http.idempotent import IDEMPOTENT
from service.http.routes.ledger import post_account, post_transfer
from service.http.routes.payouts import post_payout


class _Settlement:
    accounts = ACCOUNTS
    transfers = TRANSFERS
    payouts = payouts(None)


@pytest.mark.parametrize("handler", [post_account, post_transfer, post_payout])
def test_an_idempotent_handler_is_served_where_its_scope_is_named(handler: Any) -> None:
    spec_of, _ = handler.opt[IDEMPOTENT]
    spec = spec_of(_Settlement())
    served = {f"{method} {path}" for method in handler.http_methods for path in handler.paths}
    assert served == {spec.route}


def test_a_scope_name_is_a_post_and_a_path() -> None:
    with pytest.raises(ValueError, match="POST /<path>"):
        type(TRANSFERS)(
            route="/v1/transfers", body_type=TRANSFERS.body_type, statement=TRANSFERS.statement
        )
