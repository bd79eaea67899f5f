"""What the OpenAPI document says of an idempotent operation that its handler cannot show:
the Idempotency-Key middleware (:mod:`service.http.idempotent`) reads the header parameters
and the body, not Litestar, so they are written here, as the middleware reads them
(:mod:`service.http.keys`, :func:`service.http.render.prefer_wait`,
:func:`service.http.bodies.decode_strict`)."""

from __future__ import annotations

from typing import Any

from service.http.keys import MAX_KEY_LENGTH

__all__ = ["IDEMPOTENT_PARAMETERS", "KEY_PATTERN", "read_by_the_middleware"]

JSON = "application/json"
_KEY_TEXT = (
    "The client's key for this intended action, scoped to (tenant, principal, route):"
    f" 1-{MAX_KEY_LENGTH} printable ASCII characters, bare or as an RFC 8941"
    ' sf-string ("pay-42"). A retry with the same key and request replays the answer.'
)
# what service.http.keys accepts: 1-255 printable ASCII characters with no surrounding space,
# not starting with a quote; or an RFC 8941 sf-string ("...", with \" and \\ escapes) of
# 1-255 such characters
KEY_PATTERN = (
    rf"^(?:[\x21\x23-\x7e](?:[\x20-\x7e]{{0,{MAX_KEY_LENGTH - 2}}}[\x21-\x7e])?"
    rf'|"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\]){{1,{MAX_KEY_LENGTH}}}")$'
)
# the longest header value: a key of MAX_KEY_LENGTH characters, each escaped, and its quotes
MAX_KEY_HEADER = 2 * MAX_KEY_LENGTH + 2
_PREFER_TEXT = (
    "`wait=N`: if another attempt is in progress, wait up to N seconds (capped by"
    " SETTLEMENT_MAX_WAIT) for it to settle and replay its answer;"
    " `Preference-Applied` says so."
)
IDEMPOTENT_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "Idempotency-Key",
        "in": "header",
        "schema": {
            "type": "string",
            "maxLength": MAX_KEY_HEADER,
            "minLength": 1,
            "pattern": KEY_PATTERN,
            "description": _KEY_TEXT,
            "examples": ["pay-42"],
        },
        "description": _KEY_TEXT,
        "required": True,
        "deprecated": False,
        "examples": {"idempotency_key-example-1": {"value": "pay-42"}},
    },
    {
        "name": "Prefer",
        "in": "header",
        "schema": {
            "type": "string",
            "description": _PREFER_TEXT,
            "examples": ["wait=5"],
        },
        "description": _PREFER_TEXT,
        "required": False,
        "deprecated": False,
        "examples": {"prefer-example-1": {"value": "wait=5"}},
    },
]


def read_by_the_middleware(operation: dict[str, Any], request: type) -> None:
    """An idempotent operation's header parameters and its body (``request``), in the
    document's order."""
    done: dict[str, Any] = {}
    for name, value in list(operation.items()):
        if name == "responses":
            done["parameters"] = IDEMPOTENT_PARAMETERS
            done["requestBody"] = {
                "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}},
                "required": True,
            }
        if name not in ("parameters", "requestBody"):
            done[name] = value
    operation.clear()
    operation.update(done)
