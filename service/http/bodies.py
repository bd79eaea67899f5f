"""Request bodies: JSON only, decoded strictly against their schema, every failure a problem.

A body must say it is JSON (``Content-Type: application/json``, or an ``application/*+json``
type, in UTF-8): anything else is a 415 before a byte of it is decoded, so a form post or a
text body is refused as what it is rather than half-understood.

msgspec raises ``RecursionError`` (not a ValidationError) for JSON nested deeper than it
recurses, and a 2 KB body can do that; it is a bad body like any other.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
from litestar.dto import MsgspecDTO
from litestar.openapi.spec import Reference, Schema
from litestar.typing import FieldDefinition

from service.http.problems import ProblemError

__all__ = ["StrictJson", "check_json_content_type", "decode_strict"]

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)


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


def decode_strict(raw: bytes, schema: type[T]) -> T:
    """``raw`` (JSON) as a ``schema``, no type coercion; ProblemError ``validation-error``."""
    try:
        return msgspec.json.decode(raw, type=schema)
    except RecursionError:
        raise ProblemError("validation-error", "JSON nested too deeply") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProblemError("validation-error", str(exc)) from None


class StrictJson(MsgspecDTO[S], Generic[S]):
    """A request body decoded strictly against its Struct (:func:`decode_strict`), once a
    guard has checked its media type: no type coercion (Litestar's own decoding converts
    ``"1"`` to ``1``), every failure a ``validation-error`` problem. Litestar documents the
    body from the Struct."""

    def decode_bytes(self, value: bytes) -> Any:
        return decode_strict(value, self.model_type)

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any
    ) -> Reference | Schema:
        """The body's schema is the Struct's own (the DTO's transfer model would be a copy)."""
        model = FieldDefinition.from_annotation(
            cls.model_type, kwarg_definition=field_definition.kwarg_definition
        )
        schema: Reference | Schema = schema_creator.for_field_definition(model)
        return schema
