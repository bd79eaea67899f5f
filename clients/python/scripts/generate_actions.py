"""Write ``settlement_client/_actions.py`` from the server's published OpenAPI document.

    python clients/python/scripts/generate_actions.py [openapi/openapi.json]

Every idempotent operation of the document (one that takes an ``Idempotency-Key`` header)
becomes an action: its kind (``createTransfer`` -> ``transfer``), its path, its request and
answer models, ``create_<kind>`` on the sync and the async client, and the constructor
``IntendedAction.<kind>``. Each method's parameters are the request's fields, required ones
first, in the schema's order. ``tests/test_client_models.py`` regenerates the module in
memory and fails when it differs from the committed one. Standard library only, and the
project's formatter (``ruff format``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "settlement_client" / "_actions.py"
DEFAULT_SCHEMA = HERE.parents[2] / "openapi" / "openapi.json"
PREFIX = "create"

HEADER = '''"""The server's idempotent routes as the client's actions, generated from the OpenAPI
document (openapi/openapi.json): their paths, bodies and answers, the ``create_<kind>``
methods of the sync and async clients, and ``IntendedAction.<kind>``.

Do not edit: run ``python clients/python/scripts/generate_actions.py``. A test fails when the
document changes and this module does not.
"""

from __future__ import annotations

from typing import Any, Literal, Self

import msgspec

from ._call import Answer, Request
from ._routes import new_key
from .models import (
{models}
)
from .policy import RetryPolicy

__all__ = [
{names}
]
'''


def _models() -> Any:
    spec = importlib.util.spec_from_file_location("generate_models", HERE / "generate_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[1]


def actions(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The idempotent operations, in the document's order."""
    found = []
    for path, item in doc["paths"].items():
        op = item.get("post")
        if not op or not _models().idempotent(op):
            continue
        operation_id = op["operationId"]
        if not operation_id.startswith(PREFIX):
            raise SystemExit(f"{operation_id}: an idempotent operation is named create<Kind>")
        kind = operation_id[len(PREFIX) :]
        kind = "".join("_" + c.lower() if c.isupper() else c for c in kind).lstrip("_")
        body = _name(op["requestBody"]["content"]["application/json"]["schema"]["$ref"])
        success = next(r for code, r in op["responses"].items() if code.startswith("2"))
        answer = _name(success["content"]["application/json"]["schema"]["$ref"])
        found.append(
            {"kind": kind, "path": path, "body": body, "answer": answer, "summary": op["summary"]}
        )
    return found


def _parameters(schema: dict[str, Any], schemas: dict[str, Any]) -> tuple[str, str]:
    """``(signature, keyword arguments)`` of a request body's fields."""
    type_of = _models()._type
    required = set(schema.get("required", []))
    first, then, passed = [], [], []
    for field, prop in schema.get("properties", {}).items():
        annotation = type_of(prop, schemas)
        if field in required:
            first.append(f"{field}: {annotation}")
        elif "default" in prop:
            then.append(f"{field}: {annotation} = {prop['default']!r}")
        else:
            then.append(f"{field}: {annotation} | None = None")
        passed.append(f"{field}={field}")
    return ", ".join(first + then), ", ".join(passed)


def _methods(found: list[dict[str, Any]], schemas: dict[str, Any], *, asynchronous: bool) -> str:
    lines = []
    prefix, wait = ("async ", "await ") if asynchronous else ("", "")
    for action in found:
        signature, passed = _parameters(schemas[action["body"]], schemas)
        kind, answer = action["kind"], action["answer"]
        lines.append(
            f"""
    {prefix}def create_{kind}(
        self,
        {signature},
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[{answer}]:
        \"\"\"{action["summary"]}: ``POST {action["path"]}``.\"\"\"
        body = {action["body"]}({passed})
        request = idempotent("{kind}", body, key, prefer_wait)
        answer: Answer[{answer}] = {wait}self.send(request, {answer}, policy=policy)
        return answer
"""
        )
    return "".join(lines)


def _isort(name: str) -> tuple[int, str]:
    """``__all__``'s order: constants, classes, functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def formatted(source: str) -> str:
    """``source`` as ``ruff format`` writes it (the project's formatter, a dev dependency)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def render(doc: dict[str, Any]) -> str:
    return formatted(_render(doc))


def _render(doc: dict[str, Any]) -> str:
    schemas = doc["components"]["schemas"]
    found = actions(doc)
    answers = sorted({a["answer"] for a in found})
    models = sorted({a["answer"] for a in found} | {a["body"] for a in found})
    names = ["ANSWERS", "ROUTES", "ActionAnswer", "AsyncIdempotentCalls", "IdempotentCalls"]
    names += ["IntendedActions", "Kind", "idempotent", *answers]
    parts = [
        HEADER.format(
            models="\n".join(f"    {m}," for m in models),
            names="\n".join(f'    "{n}",' for n in sorted(names, key=_isort)),
        )
    ]
    kinds = ", ".join(json.dumps(a["kind"]) for a in found)
    parts.append(f"\n# the kind of an intended action\nKind = Literal[{kinds}]\n")
    parts.append("# its route\nROUTES: dict[str, str] = {\n")
    parts += [f'    "{a["kind"]}": "{a["path"]}",\n' for a in found]
    parts.append("}\n# the body of its success\nANSWERS: dict[str, type[Any]] = {\n")
    parts += [f'    "{a["kind"]}": {a["answer"]},\n' for a in found]
    parts.append("}\n# what any action answers\n")
    parts.append(f"ActionAnswer = {' | '.join(a['answer'] for a in found)}\n")
    parts.append(
        '''

_encode = msgspec.json.Encoder()


def idempotent(kind: str, body: Any, key: str | None, prefer_wait: int) -> Request:
    """The request of an action: its key, or a new one (a random UUID) when None."""
    return Request(
        "POST",
        ROUTES[kind],
        body=_encode.encode(body),
        key=key if key is not None else new_key(),
        prefer_wait=prefer_wait,
    )


class IdempotentCalls:
    """The sync client's ``create_<kind>`` methods (the client provides ``send``)."""

    __slots__ = ()

    def send(self, request: Request, kind: Any, *, policy: RetryPolicy | None = None) -> Any:
        raise NotImplementedError
'''
    )
    parts.append(_methods(found, schemas, asynchronous=False))
    parts.append(
        '''

class AsyncIdempotentCalls:
    """The async client's ``create_<kind>`` methods (the client provides ``send``)."""

    __slots__ = ()

    async def send(
        self, request: Request, kind: Any, *, policy: RetryPolicy | None = None
    ) -> Any:
        raise NotImplementedError
'''
    )
    parts.append(_methods(found, schemas, asynchronous=True))
    parts.append(
        '''

class IntendedActions:
    """``IntendedAction.<kind>(...)``: an action and its key, chosen now (a new one when
    ``key`` is None)."""

    __slots__ = ()

    @classmethod
    def of(cls, kind: Kind, body: Any, key: str | None) -> Self:
        raise NotImplementedError
'''
    )
    for action in found:
        signature, passed = _parameters(schemas[action["body"]], schemas)
        parts.append(
            f"""
    @classmethod
    def {action["kind"]}(cls, {signature}, *, key: str | None = None) -> Self:
        return cls.of("{action["kind"]}", {action["body"]}({passed}), key)
"""
        )
    return "".join(parts)


def main(argv: list[str]) -> None:
    source = Path(argv[0]) if argv else DEFAULT_SCHEMA
    TARGET.write_text(render(json.loads(source.read_text())))
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main(sys.argv[1:])
