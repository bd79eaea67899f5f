"""Bearer API keys: who is calling, and may they call this route?"""

from __future__ import annotations

import re
from typing import Any

from litestar.connection import ASGIConnection

from service.app.ports import PrincipalKeys
from service.domain.principals import Principal, Role
from service.http.problems import ProblemError

# any request or websocket of Litestar's: what authentication reads of it
Connection = ASGIConnection[Any, Any, Any, Any]

__all__ = ["AuthError", "authenticate", "bearer_key", "require_role", "unknown_key"]

# Longest Authorization header value examined; keys are ~46 characters.
MAX_AUTHORIZATION = 512
_BEARER = re.compile(r"Bearer[ ]+([\x21-\x7e]{1,400})[ ]*", re.IGNORECASE)


class AuthError(ProblemError):
    """``unauthenticated`` (401) or ``forbidden`` (403)."""


async def authenticate(request: Connection, principals: PrincipalKeys) -> Principal:
    principal = await principals.authenticate(bearer_key(request))
    if principal is None:
        raise unknown_key()
    return principal


def bearer_key(request: Connection) -> str:
    """The API key of the ``Authorization: Bearer`` header (its syntax only; no lookup)."""
    header = request.headers.get("authorization")
    if header is None:
        raise AuthError("unauthenticated", "missing Authorization: Bearer <api key> header")
    match = _BEARER.fullmatch(header) if len(header) <= MAX_AUTHORIZATION else None
    if match is None:
        raise AuthError("unauthenticated", "malformed Authorization header: Bearer <api key>")
    return match.group(1)


def unknown_key() -> AuthError:
    return AuthError("unauthenticated", "unknown or revoked API key")


async def authenticate_admin(request: Connection, principals: PrincipalKeys) -> Principal:
    """The caller, who must be an admin (401, 403 otherwise)."""
    admin = await authenticate(request, principals)
    require_role(admin, Role.ADMIN)
    return admin


def require_role(principal: Principal, *roles: Role) -> None:
    if principal.role not in roles:
        allowed = ", ".join(r.value for r in roles)
        raise AuthError(
            "forbidden", f"role {principal.role.value} may not call this; needs {allowed}"
        )
