"""The import direction of docs/architecture.md, checked on the source: http -> app ->
store/leases/domain -> core, and nothing below imports what sits above it; and ``http``
reaches no database or Redis client of its own (no driver imported, no ``.pool``, no
``.acquire(``)."""

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
    # http runs no SQL and no Redis command of its own: it calls the app's use cases
    "http": ("asyncpg", "sqlalchemy", "redis"),
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


def forbidden(layer: str, name: str) -> bool:
    """Whether ``layer`` may not import module ``name``."""
    if name.startswith(ALLOWED.get(layer, ())):
        return False
    return any(name == prefix.rstrip(".") or name.startswith(prefix) for prefix in FORBIDDEN[layer])


def modules(layer: str) -> list[Path]:
    return sorted((SERVICE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_what_sits_above_it(layer: str) -> None:
    assert modules(layer), f"service/{layer} has no modules"
    wrong = [
        f"{path.relative_to(SERVICE.parent)} imports {name}"
        for path in modules(layer)
        for name in sorted(imports_of(path))
        if forbidden(layer, name)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from service.http.render import render\nimport sqlalchemy.sql\n")
    assert imports_of(module) == {"service.http.render", "sqlalchemy.sql"}


def connection_uses_of(path: Path) -> list[str]:
    """Where a module reaches a connection pool itself: an attribute named ``pool`` (read or
    written: ``settlement.pool``) or a call of a method named ``acquire`` (``x.acquire()``)."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "pool":
            found.append((node.lineno, node.end_col_offset or 0, ".pool"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "acquire"
        ):
            found.append((node.lineno, node.func.end_col_offset or 0, ".acquire("))
    return [f"line {line}: {what}" for line, _, what in sorted(found)]


def test_http_touches_no_connection_pool() -> None:
    """``http`` asks a use case for what it shows; the store reads it (docs/architecture.md)."""
    wrong = [
        f"{path.relative_to(SERVICE.parent)} {use}"
        for path in modules("http")
        for use in connection_uses_of(path)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_pool_or_an_acquire(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "async def read(settlement):\n"
        "    async with settlement.pool.acquire() as conn:\n"
        "        return await conn.fetchrow('SELECT 1')\n"
        "async def other(views):\n"
        "    return views.acquire()\n"
        "def fine(settlement):\n"
        "    return settlement.pooled, settlement.acquired\n"
    )
    assert connection_uses_of(module) == [
        "line 2: .pool",
        "line 2: .acquire(",
        "line 5: .acquire(",
    ]


def test_the_check_sees_a_driver_import_in_http(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import asyncpg\nfrom redis.asyncio import Redis\n")
    assert imports_of(module) == {"asyncpg", "redis.asyncio"}
    assert forbidden("http", "asyncpg")
    assert forbidden("http", "redis.asyncio")
    assert forbidden("http", "sqlalchemy.ext.asyncio")
    assert not forbidden("http", "service.app.root")
