"""The import direction of docs/architecture.md, checked on the source: http -> app ->
store/leases/domain -> core, and nothing below imports what sits above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"

# layer -> module prefixes it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": ("service.", "sqlalchemy", "redis", "litestar", "httpx", "time", "asyncio"),
    "store": ("service.app", "service.http", "service.leases", "litestar", "redis"),
    "leases": ("service.app", "service.http", "service.store", "litestar", "sqlalchemy"),
    "domain": ("service.app", "service.http", "litestar", "redis"),
    "telemetry": ("service.app", "service.http", "service.store", "litestar"),
    "app": ("service.http", "litestar", "asyncpg"),
    "http": ("sqlalchemy", "redis"),
}
# what a layer may import although a prefix above forbids it
ALLOWED: dict[str, tuple[str, ...]] = {"core": ("service.core",)}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def modules(layer: str) -> list[Path]:
    return sorted((SERVICE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_what_sits_above_it(layer: str) -> None:
    assert modules(layer), f"service/{layer} has no modules"
    wrong = []
    for path in modules(layer):
        for name in imports_of(path):
            if name.startswith(ALLOWED.get(layer, ())):
                continue
            if any(
                name == prefix.rstrip(".") or name.startswith(prefix) for prefix in FORBIDDEN[layer]
            ):
                wrong.append(f"{path.relative_to(SERVICE.parent)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from service.http.render import render\nimport sqlalchemy.sql\n")
    assert imports_of(module) == {"service.http.render", "sqlalchemy.sql"}
