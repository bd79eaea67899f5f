"""The operator console: server-rendered pages under ``/console`` for reconciliation
(work list, operation timelines, supersede, resolve), feed holds and principals, on the same
use cases as the admin API. HTML pages only, so they are left out of the OpenAPI document."""

from __future__ import annotations

from litestar import Router

from service.http.console.actions import (
    accept_conflict,
    create_principal,
    decide_hold,
    principal_action,
    resolve,
    sign_in,
    sign_out,
    supersede,
)
from service.http.console.pages import (
    feeds_page,
    operation_page,
    principals_page,
    revoke_page,
    sign_in_page,
    stylesheet,
    work_page,
)
from service.http.console.render import template_config
from service.http.console.security import (
    CONSOLE_PATH,
    FORM_LIMIT,
    ConsoleHeaders,
    SignInRequired,
    to_sign_in,
)

__all__ = ["ConsoleHeaders", "console_router", "template_config"]


def console_router() -> Router:
    return Router(
        path=CONSOLE_PATH,
        route_handlers=[
            stylesheet,
            sign_in_page,
            sign_in,
            sign_out,
            work_page,
            operation_page,
            supersede,
            resolve,
            feeds_page,
            decide_hold,
            accept_conflict,
            principals_page,
            revoke_page,
            create_principal,
            principal_action,
        ],
        include_in_schema=False,
        exception_handlers={SignInRequired: to_sign_in},
        request_max_body_size=FORM_LIMIT,
    )
