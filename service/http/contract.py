"""The published contract of each route, as data: what the OpenAPI document says beyond what
Litestar can see in a handler's signature.

Handlers read their bodies themselves (credentials and the Idempotency-Key are checked before
a byte of the body is decoded), so Litestar sees no request body, and every handler returns
raw bytes. This table names, per operation id, the request and response Structs, the header
parameters, the problems the route can answer (by slug) and whether it needs a bearer key;
:func:`complete` writes them into the document Litestar generated.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgspec

from service.app.admin import (
    PrincipalCreated,
    PrincipalRequest,
    PrincipalRevoked,
    ResolveBody,
    Resolved,
    SupersedeBody,
    Superseded,
    WorkPage,
)
from service.app.answers import ProblemDocument
from service.app.effects import PROBLEM_CONTENT_TYPE, IdempotentRoute
from service.app.evidence import Accepted
from service.app.feeds import (
    ConflictAccepted,
    ConflictAction,
    FeedList,
    FeedView,
    HoldAction,
    HoldDecided,
    HoldPage,
)
from service.app.routes import ROUTES
from service.app.status import OperationView
from service.domain.currencies import ISO_4217
from service.domain.ledger import Account
from service.evidence import SignedEvidence
from service.http.health import Health, Liveness, Readiness
from service.http.idempotent_doc import read_by_the_middleware
from service.http.pages import ProblemPage
from service.problem_types import PROBLEM_TYPES

__all__ = ["BEARER", "OPERATIONS", "RouteDoc", "all_slugs", "complete"]

BEARER = "bearer"
_CURRENCIES = sorted(ISO_4217)
JSON = "application/json"


@dataclass(frozen=True)
class RouteDoc:
    """What one operation documents beyond its path and query parameters."""

    status: int  # the success status
    response: type | None  # its JSON body (None: documented by hand below)
    problems: tuple[str, ...]  # slugs it may answer (service.problem_types)
    request: type | None = None  # its JSON body (the handler's data type: checked, not set)
    auth: str = "bearer"  # "bearer", "none", or "optional" (GET /metrics)
    idempotent: bool = False  # Idempotency-Key, Prefer and the idempotency response headers
    html: bool = False  # the success answer is also text/html (the default one)
    describe: str | None = None  # the success response's description


# Every route that authenticates can answer these; every route that reads the database can
# answer 503 when no connection comes free, and any route 500 on a bug.
_AUTH = ("unauthenticated", "forbidden")
_ALWAYS = ("service-unavailable", "internal-error")
_BODY = ("validation-error", "payload-too-large", "request-timeout", "unsupported-media-type")
_IDEMPOTENT = (
    *_AUTH,
    *_BODY,
    "idempotency-key-missing",
    "idempotency-key-invalid",
    "fingerprint-mismatch",
    "binding-mismatch",
    "operation-in-progress",
    "operation-conflict",
    "operation-superseded",
    "idempotency-key-expired",
    "lease-unavailable",
    "too-many-requests",
    *_ALWAYS,
)

_SUPERSEDE_REFUSALS = ("not-found", "supersede-needs-force", "operation-in-progress")
# what a local effect may answer beyond its refusals: the database refused its writes; an
# external one: the route is off (no provider), or no definitive answer in time
_LOCAL = ("effect-refused",)
_EXTERNAL = ("not-found", "operation-outcome-unknown")


def _idempotent(spec: IdempotentRoute) -> RouteDoc:
    """The operation of an idempotent route of the registry (service.app.routes)."""
    effect = _LOCAL if spec.statement is not None else _EXTERNAL
    return RouteDoc(
        201,
        spec.answer_type,
        (*_IDEMPOTENT, *effect, *spec.refusals),
        spec.body_type,
        idempotent=True,
    )


OPERATIONS: dict[str, RouteDoc] = {
    **{spec.operation_id: _idempotent(spec) for spec in ROUTES},
    "getAccount": RouteDoc(200, Account, (*_AUTH, "not-found", *_ALWAYS)),
    "getOperation": RouteDoc(
        200,
        OperationView,
        ("unauthenticated", "validation-error", "not-found", "idempotency-key-expired", *_ALWAYS),
    ),
    "findOperationByKey": RouteDoc(
        200,
        OperationView,
        ("unauthenticated", "validation-error", "not-found", "idempotency-key-expired", *_ALWAYS),
    ),
    "createPrincipal": RouteDoc(
        201,
        PrincipalCreated,
        (*_AUTH, *_BODY, "principal-exists", "principal-limit", *_ALWAYS),
        PrincipalRequest,
    ),
    "rotatePrincipal": RouteDoc(200, PrincipalCreated, (*_AUTH, "not-found", *_ALWAYS)),
    "revokePrincipal": RouteDoc(200, PrincipalRevoked, (*_AUTH, "not-found", *_ALWAYS)),
    "supersedeOperation": RouteDoc(
        200,
        Superseded,
        (*_AUTH, *_BODY, *_SUPERSEDE_REFUSALS, *_ALWAYS),
        SupersedeBody,
    ),
    "resolveOperation": RouteDoc(
        200,
        Resolved,
        (*_AUTH, *_BODY, "not-found", "resolution-refused", "lease-unavailable", *_ALWAYS),
        ResolveBody,
    ),
    "listWork": RouteDoc(200, WorkPage, (*_AUTH, "validation-error", *_ALWAYS)),
    "listFeeds": RouteDoc(200, FeedList, (*_AUTH, *_ALWAYS)),
    "getFeed": RouteDoc(200, FeedView, (*_AUTH, "validation-error", "not-found", *_ALWAYS)),
    "listFeedHolds": RouteDoc(200, HoldPage, (*_AUTH, "validation-error", "not-found", *_ALWAYS)),
    "decideFeedHold": RouteDoc(
        200, HoldDecided, (*_AUTH, *_BODY, "not-found", *_ALWAYS), HoldAction
    ),
    "acceptFeedConflict": RouteDoc(
        200,
        ConflictAccepted,
        (*_AUTH, *_BODY, "not-found", "conflict-in-one-page", *_ALWAYS),
        ConflictAction,
    ),
    "postObservation": RouteDoc(
        202,
        Accepted,
        (*_AUTH, *_BODY, "invalid-evidence", "not-found", "evidence-quota-exceeded", *_ALWAYS),
        SignedEvidence,
    ),
    "health": RouteDoc(200, Health, (), auth="none"),
    "livez": RouteDoc(200, Liveness, (), auth="none"),
    "readyz": RouteDoc(200, Readiness, (), auth="none"),
    "metrics": RouteDoc(200, None, ("unauthenticated", "forbidden", *_ALWAYS), auth="optional"),
    "getProblemPage": RouteDoc(
        200,
        ProblemPage,
        ("not-found",),
        auth="none",
        html=True,
        describe="The page: HTML, or JSON on Accept: application/json",
    ),
}

# Statuses that answer with the route's own JSON body rather than a problem document.
_UNHEALTHY = {
    "health": (503, "a dependency is down (the body names which)"),
    "readyz": (503, "the database is unreachable (the body says so)"),
}


def _header(description: str, schema: dict[str, Any], *, required: bool = False) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": schema}


_REPLAYED = "`true` when this answer is a replay of a stored outcome, else `false`."
_OPERATION = "The operation this answer is about (its status resource: /v1/operations/{id})."
# components/headers: name -> header object; responses refer to them by name
HEADERS: dict[str, dict[str, Any]] = {
    "Request-Id": _header(
        "An id of this request (also in the server's log lines); sent on every response.",
        {"type": "string"},
        required=True,
    ),
    "Idempotent-Replayed": _header(
        _REPLAYED, {"type": "string", "enum": ["true", "false"]}, required=True
    ),
    "Operation-Id": _header(_OPERATION, {"type": "string", "format": "uuid"}, required=True),
    "Operation-Id-If-Known": _header(
        _OPERATION + " Sent when the problem is about an operation (a new operation's"
        " statement that a constraint refused names the id it would have had).",
        {"type": "string", "format": "uuid"},
    ),
    "Preference-Applied": _header("`wait=N` when Prefer: wait was honoured.", {"type": "string"}),
    "Retry-After": _header(
        "Seconds to wait before retrying (sent with the retryable problems of this status).",
        {"type": "integer", "minimum": 0},
    ),
    "Location": _header(
        "With operation-in-progress: the status resource of the operation (or its lookup by key).",
        {"type": "string"},
    ),
    "WWW-Authenticate": _header("The scheme a 401 asks for: Bearer.", {"type": "string"}),
}


def _headers(*names: str) -> dict[str, Any]:
    """``{header: $ref}``; a name ending in -If-... documents the header without it."""
    refs = {}
    for name in names:
        shown = name.split("-If-")[0]
        refs[shown] = {"$ref": f"#/components/headers/{name}"}
    return refs


def all_slugs() -> dict[str, tuple[int, str]]:
    """Every slug the server can answer: slug -> (status, title)."""
    return {slug: (problem.status, problem.title) for slug, problem in PROBLEM_TYPES.items()}


def _problem_responses(doc: RouteDoc) -> dict[str, Any]:
    slugs = all_slugs()
    by_status: dict[int, list[str]] = {}
    for slug in doc.problems:
        by_status.setdefault(slugs[slug][0], []).append(slug)
    responses: dict[str, Any] = {}
    for status, group in sorted(by_status.items()):
        names = ["Request-Id"]
        if doc.idempotent:
            names += ["Idempotent-Replayed", "Operation-Id-If-Known"]
        carried = [PROBLEM_TYPES[slug] for slug in group]
        if any(problem.retry_after for problem in carried):
            names.append("Retry-After")
        if any(problem.location for problem in carried):
            names.append("Location")
        if status == 401:
            names.append("WWW-Authenticate")
        lines = [f"- `{slug}`: {slugs[slug][1]} (/problems/{slug})" for slug in group]
        responses[str(status)] = {
            "description": "Problem: " + ", ".join(group) + "\n\n" + "\n".join(lines),
            "headers": _headers(*names),
            "content": {
                PROBLEM_CONTENT_TYPE: {
                    "schema": {"$ref": "#/components/schemas/ProblemDocument"},
                    "examples": {slug: {"$ref": f"#/components/examples/{slug}"} for slug in group},
                }
            },
        }
    return responses


def _success(operation_id: str, doc: RouteDoc, litestar: dict[str, Any]) -> dict[str, Any]:
    names = ["Request-Id"]
    if doc.idempotent:
        names += ["Idempotent-Replayed", "Operation-Id", "Preference-Applied"]
    headers = _headers(*names)
    if doc.response is None:  # GET /metrics: keep Litestar's media type, a text body
        response = copy.deepcopy(litestar)
        for media in response.get("content", {}).values():
            media["schema"] = {"type": "string"}
        response["headers"] = headers
        return response
    content: dict[str, Any] = {
        JSON: {"schema": {"$ref": f"#/components/schemas/{doc.response.__name__}"}}
    }
    if doc.html:
        content = {"text/html": {"schema": {"type": "string"}}, **content}
    return {
        "description": doc.describe
        or (_IDEMPOTENT_SUCCESS if doc.idempotent else litestar.get("description", "OK")),
        "headers": headers,
        "content": content,
    }


_IDEMPOTENT_SUCCESS = (
    "The outcome: this request's own (Idempotent-Replayed: false) or the stored one replayed "
    "(Idempotent-Replayed: true, byte for byte)."
)


_BODY_RULE = (
    "JSON (application/json or application/*+json, UTF-8); anything else is 415 "
    "unsupported-media-type."
)


def _components() -> dict[str, Any]:
    types: list[Any] = [ProblemDocument]
    for doc in OPERATIONS.values():
        types += [t for t in (doc.request, doc.response) if t is not None]
    _, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    for name, extra in _SCHEMA_RULES.items():
        components[name] = {**components[name], **extra}
    currency: dict[str, Any] = {}
    named: dict[str, Any] = _named_currency(components, currency)
    return {**named, "Currency": currency}


def _named_currency(node: Any, found: dict[str, Any]) -> Any:
    """Each inline ISO 4217 enum as one ``Currency`` component (one enum in a generated
    client, not one per field)."""
    if isinstance(node, dict):
        if node.get("enum") == _CURRENCIES:
            found.update(node)
            return {"$ref": "#/components/schemas/Currency"}
        return {k: _named_currency(v, found) for k, v in node.items()}
    if isinstance(node, list):
        return [_named_currency(v, found) for v in node]
    return node


def _status_range(low: int, high: int) -> dict[str, Any]:
    return {"properties": {"result": {"properties": {"status": {"minimum": low, "maximum": high}}}}}


# Rules a Struct checks in __post_init__ that its types do not show msgspec, written into
# its schema by hand: Evidence's outcome decides its status class; a transfer's accounts
# differ (no JSON Schema keyword compares two fields, so that one is said in words).
_SCHEMA_RULES: dict[str, dict[str, Any]] = {
    "TransferRequest": {
        "description": "source and destination must be different accounts (400 otherwise)"
    },
    "Evidence": {
        "if": {"properties": {"outcome": {"const": "completed"}}},
        "then": _status_range(200, 299),
        "else": _status_range(400, 499),
    },
}


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    """Litestar's document with each operation's bodies, headers, problems and security."""
    done = copy.deepcopy(schema)
    seen = set()
    for path_item in done["paths"].values():
        for method, operation in path_item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            operation_id = operation["operationId"]
            doc = OPERATIONS.get(operation_id)
            if doc is None:
                raise KeyError(f"operation {operation_id} is not in service/http/contract.py")
            seen.add(operation_id)
            _complete_operation(operation_id, operation, doc)
    missing = set(OPERATIONS) - seen
    if missing:
        raise KeyError(f"documented operations with no route: {sorted(missing)}")
    components = done.setdefault("components", {})
    components["schemas"] = {**components.get("schemas", {}), **_components()}
    components["headers"] = HEADERS
    components["examples"] = {
        slug: {
            "summary": title,
            "value": {
                "type": f"/problems/{slug}",
                "title": title,
                "status": status,
                "detail": f"({slug}: the detail says what was wrong with this request)",
            },
        }
        for slug, (status, title) in sorted(all_slugs().items())
    }
    components["securitySchemes"] = {
        BEARER: {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: Authorization: Bearer <api key>. Keys are made by "
            "POST /admin/v1/principals or `settlement principals create`.",
        }
    }
    return done


def _complete_operation(operation_id: str, operation: dict[str, Any], doc: RouteDoc) -> None:
    litestar = operation.get("responses", {}).get(str(doc.status), {})
    responses = {str(doc.status): _success(operation_id, doc, litestar)}
    if operation_id in _UNHEALTHY:
        status, why = _UNHEALTHY[operation_id]
        ref = {"$ref": f"#/components/schemas/{doc.response.__name__}"}  # type: ignore[union-attr]
        responses[str(status)] = {
            "description": why,
            "headers": _headers("Request-Id"),
            "content": {JSON: {"schema": ref}},
        }
    responses.update(_problem_responses(doc))
    operation["responses"] = responses
    if doc.idempotent:  # the Idempotency-Key middleware reads these, not Litestar
        assert doc.request is not None
        read_by_the_middleware(operation, doc.request)
    body = operation.get("requestBody")
    documented = body and body["content"][JSON]["schema"].get("$ref", "").rpartition("/")[2]
    if documented != (doc.request.__name__ if doc.request else None):
        raise KeyError(f"{operation_id}: the handler takes {documented}, the table {doc.request}")
    if body:  # Litestar documented the typed body; the media-type rule is ours
        body["description"] = _BODY_RULE
    if doc.auth == "bearer":
        operation["security"] = [{BEARER: []}]
    elif doc.auth == "optional":  # open unless SETTLEMENT_METRICS_ROLE names a role
        operation["security"] = [{}, {BEARER: []}]
    else:
        operation["security"] = []
