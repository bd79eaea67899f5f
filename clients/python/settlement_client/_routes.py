"""The contract's operations other than the idempotent routes (those are generated:
``_actions``) as :class:`Request` values, shared by the sync and async clients."""

from __future__ import annotations

import uuid
from typing import Any, Literal
from urllib.parse import quote

import msgspec

from ._call import Request
from .models import PrincipalRequest, ResolutionResult, ResolveBody, SupersedeBody

__all__ = ["new_key"]

_encode = msgspec.json.Encoder()


def new_key() -> str:
    """A fresh Idempotency-Key: a random UUID (version 4)."""
    return str(uuid.uuid4())


def get(path: str, params: dict[str, str] | None = None) -> Request:
    return Request("GET", path, params=params)


def segment(value: str) -> str:
    return quote(value, safe="")


def principal(tenant: str, name: str, role: Literal["admin", "client", "observer"]) -> Request:
    body = PrincipalRequest(tenant=tenant, name=name, role=role)
    return Request("POST", "/admin/v1/principals", body=_encode.encode(body))


def supersede(operation_id: str, reason: str, request: Any, rebind: bool, force: bool) -> Request:
    body = SupersedeBody(reason=reason, request=request, rebind=rebind, force=force)
    return Request(
        "POST",
        f"/admin/v1/operations/{segment(operation_id)}/supersede",
        body=_encode.encode(body),
    )


def resolve(
    operation_id: str,
    outcome: Literal["completed", "failed"],
    provider_reference: str,
    reason: str,
    status: int,
    body: dict[str, Any],
) -> Request:
    resolution = ResolveBody(
        outcome=outcome,
        provider_reference=provider_reference,
        reason=reason,
        result=ResolutionResult(status=status, body=body),
    )
    return Request(
        "POST",
        f"/admin/v1/operations/{segment(operation_id)}/resolve",
        body=_encode.encode(resolution),
    )


def work(
    state: str, tenant: str | None, limit: int | None, after: str | None, key: str | None = None
) -> Request:
    params = {"state": state}
    params |= {"tenant": tenant} if tenant else {}
    params |= {"key": key} if key else {}
    params |= {"limit": str(limit)} if limit else {}
    params |= {"after": after} if after else {}
    return get("/admin/v1/operations", params)
