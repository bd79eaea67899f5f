"""Request bodies: JSON only, decoded strictly against their schema, every failure a problem.

A body must say it is JSON (``Content-Type: application/json``, or an ``application/*+json``
type, in UTF-8): anything else is a 415 before a byte of it is decoded, so a form post or a
text body is refused as what it is rather than half-understood.

msgspec raises ``RecursionError`` (not a ValidationError) for JSON nested deeper than it
recurses, and a 2 KB body can do that; it is a bad body like any other.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from service.http.problems import ProblemError

__all__ = ["check_json_content_type", "decode_json", "decode_strict"]

T = TypeVar("T")


def check_json_content_type(header: str | None) -> None:
    """Nothing if ``header`` names JSON in UTF-8, else ProblemError ``unsupported-media-type``."""
    media_type, _, params = (header or "").partition(";")
    media_type = media_type.strip().lower()
    kind, _, subtype = media_type.partition("/")
    if kind != "application" or not (subtype == "json" or subtype.endswith("+json")):
        shown = media_type[:64] or "none"
        raise ProblemError(
            "unsupported-media-type", f"the body must be application/json, not {shown!r}"
        )
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise ProblemError("unsupported-media-type", "a JSON body must be UTF-8")


def decode_json(raw: bytes, schema: type[T], content_type: str | None) -> T:
    """``raw`` as a ``schema``; ProblemError ``unsupported-media-type`` or ``validation-error``."""
    check_json_content_type(content_type)
    return decode_strict(raw, schema)


def decode_strict(raw: bytes, schema: type[T]) -> T:
    """``raw`` (JSON) as a ``schema``, no type coercion; ProblemError ``validation-error``."""
    try:
        return msgspec.json.decode(raw, type=schema)
    except RecursionError:
        raise ProblemError("validation-error", "JSON nested too deeply") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProblemError("validation-error", str(exc)) from None
