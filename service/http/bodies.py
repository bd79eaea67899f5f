"""Request bodies: decoded strictly against their schema, every failure a 400 problem.

msgspec raises ``RecursionError`` (not a ValidationError) for JSON nested deeper than it
recurses, and a 2 KB body can do that; it is a bad body like any other.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from service.http.problems import ProblemError

__all__ = ["decode_json"]

T = TypeVar("T")


def decode_json(raw: bytes, schema: type[T]) -> T:
    """``raw`` as a ``schema``, or ProblemError ``validation-error``."""
    try:
        return msgspec.json.decode(raw, type=schema)
    except RecursionError:
        raise ProblemError("validation-error", "JSON nested too deeply") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProblemError("validation-error", str(exc)) from None
