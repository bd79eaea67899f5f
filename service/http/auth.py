"""Bearer API keys: who is calling, and may they call this route?"""

from __future__ import annotations

import re
from typing import Any

from litestar import Request

from service.http.problems import ProblemError
from service.store.principals import Principal, PrincipalStore, Role

__all__ = ["AuthError", "authenticate", "require_role"]

# Longest Authorization header value examined; keys are ~46 characters.
MAX_AUTHORIZATION = 512
_BEARER = re.compile(r"Bearer[ ]+([\x21-\x7e]{1,400})[ ]*", re.IGNORECASE)


class AuthError(ProblemError):
    """``unauthenticated`` (401) or ``forbidden`` (403)."""


async def authenticate(request: Request[Any, Any, Any], principals: PrincipalStore) -> Principal:
    header = request.headers.get("authorization")
    if header is None:
        raise AuthError("unauthenticated", "missing Authorization: Bearer <api key> header")
    match = _BEARER.fullmatch(header) if len(header) <= MAX_AUTHORIZATION else None
    if match is None:
        raise AuthError("unauthenticated", "malformed Authorization header: Bearer <api key>")
    principal = await principals.authenticate(match.group(1))
    if principal is None:
        raise AuthError("unauthenticated", "unknown or revoked API key")
    return principal


def require_role(principal: Principal, *roles: Role) -> None:
    if principal.role not in roles:
        allowed = ", ".join(r.value for r in roles)
        raise AuthError(
            "forbidden", f"role {principal.role.value} may not call this; needs {allowed}"
        )
