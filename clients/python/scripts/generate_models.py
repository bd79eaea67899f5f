"""Write ``settlement_client/models.py`` from the server's published OpenAPI document.

    python clients/python/scripts/generate_models.py [openapi/openapi.json]

Only the schemas reachable from the operations the client calls (``OPERATIONS``) are
written, as frozen msgspec Structs (keyword-only, unknown fields ignored, so a server that
adds a field does not break an older client). ``tests/test_client_models.py`` regenerates
the module in memory and fails when it differs from the committed one. Standard library only.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "settlement_client" / "models.py"
DEFAULT_SCHEMA = HERE.parents[2] / "openapi" / "openapi.json"

# The operations the client has a method for (operationId of the document), besides every
# idempotent one (an operation with an Idempotency-Key header: generate_actions.py).
OPERATIONS = (
    "getAccount",
    "getOperation",
    "findOperationByKey",
    "getProblemPage",
    "health",
    "createPrincipal",
    "rotatePrincipal",
    "revokePrincipal",
    "supersedeOperation",
    "resolveOperation",
    "listWork",
)
SCHEMA_REF = "#/components/schemas/"
# Request bodies are sent without the fields left at their defaults (those of the idempotent
# operations too).
REQUESTS = {"PrincipalRequest", "ResolveBody", "SupersedeBody"}
# Closed sets of strings written as Literal types; longer enums (Currency) stay ``str``.
MAX_LITERAL = 8

HEADER = '''"""Typed bodies of the settlement server's contract, generated from the OpenAPI
document (openapi/openapi.json).

Do not edit: run ``python clients/python/scripts/generate_models.py``. A test fails when the
document changes and this module does not.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
{names}
]
'''


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(SCHEMA_REF):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def idempotent(op: dict[str, Any]) -> bool:
    """An operation that takes an Idempotency-Key header."""
    return any(
        p.get("in") == "header" and p.get("name") == "Idempotency-Key"
        for p in op.get("parameters", [])
    )


def _requests(doc: dict[str, Any]) -> set[str]:
    """The request bodies sent without their defaults."""
    found = set(REQUESTS)
    for item in doc["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and idempotent(op):
                found |= _refs(op.get("requestBody", {}))
    return found


def _wanted(doc: dict[str, Any]) -> list[str]:
    schemas = doc["components"]["schemas"]
    todo: set[str] = set()
    seen_ops = set()
    for item in doc["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and (op.get("operationId") in OPERATIONS or idempotent(op)):
                seen_ops.add(op["operationId"])
                todo |= _refs(op.get("requestBody", {}))
                for code, response in op.get("responses", {}).items():
                    if code.startswith("2"):
                        todo |= _refs(response)
    missing = set(OPERATIONS) - seen_ops
    if missing:
        raise SystemExit(f"operations gone from the document: {sorted(missing)}")
    todo.add("ProblemDocument")
    done: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        todo |= _refs(schemas[name]) - done
    return sorted(done)


def _type(schema: dict[str, Any], schemas: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        target = schemas[name]
        return name if target.get("type") == "object" else _type(target, schemas)
    if "anyOf" in schema:
        parts = [_type(s, schemas) for s in schema["anyOf"]]
        return " | ".join(dict.fromkeys(parts))
    if "enum" in schema and len(schema["enum"]) <= MAX_LITERAL:
        return "Literal[" + ", ".join(json.dumps(v) for v in schema["enum"]) + "]"
    kind = schema.get("type")
    if kind == "array":
        return f"list[{_type(schema.get('items', {}), schemas)}]"
    return {
        "string": "str",
        "integer": "int",
        "number": "float",
        "boolean": "bool",
        "null": "None",
        "object": "dict[str, Any]",
    }.get(kind or "", "str" if "enum" in schema else "Any")


def _struct(name: str, schema: dict[str, Any], schemas: dict[str, Any], requests: set[str]) -> str:
    options = "kw_only=True, frozen=True"
    if name in requests:
        options += ", omit_defaults=True"
    lines = [f"class {name}(msgspec.Struct, {options}):"]
    doc = schema.get("description")
    if doc:
        text = textwrap.fill(
            " ".join(doc.split()), width=96, initial_indent='    """', subsequent_indent="    "
        )
        lines.append(text + ("\n    " if "\n" in text else "") + '"""')
        lines.append("")
    required = set(schema.get("required", []))
    properties = schema.get("properties", {})
    for field, prop in properties.items():
        annotation = _type(prop, schemas)
        if field in required:
            lines.append(f"    {field}: {annotation}")
        elif "default" in prop:
            lines.append(f"    {field}: {annotation} = {prop['default']!r}")
        else:
            lines.append(f"    {field}: {annotation} | None = None")
    if not properties:
        lines.append("    pass")
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    schemas = doc["components"]["schemas"]
    names = [n for n in _wanted(doc) if schemas[n].get("type") == "object"]
    parts = [HEADER.format(names="\n".join(f'    "{n}",' for n in names))]
    for name in names:
        parts.append("\n\n" + _struct(name, schemas[name], schemas, _requests(doc)) + "\n")
    return "".join(parts)


def main(argv: list[str]) -> None:
    source = Path(argv[0]) if argv else DEFAULT_SCHEMA
    TARGET.write_text(render(json.loads(source.read_text())))
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main(sys.argv[1:])
