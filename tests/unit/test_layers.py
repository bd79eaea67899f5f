"""The import direction of docs/architecture.md, checked on the source: http -> app ->
store/leases/domain -> core, and nothing below imports what sits above it; and ``http``
reaches no database or Redis client of its own (no driver or store imported, no ``.pool``,
no ``.acquire(``).

The import rules are the import-linter contracts in pyproject.toml ([tool.importlinter]),
which ``make lint`` runs too; here they run on the source, and on a copy of it with a
forbidden import added to show that each kind of rule is seen. What an import contract
cannot say (an attribute named ``pool``, a call of ``.acquire(``) is checked below by
reading the source."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(source_root: Path) -> subprocess.CompletedProcess[str]:
    """pyproject.toml's import contracts, checked on the ``service`` package under
    ``source_root`` (no cache: the package may be a copy)."""
    environment = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=source_root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def modules(layer: str) -> list[Path]:
    return sorted((SERVICE / layer).rglob("*.py"))


def test_no_layer_imports_what_sits_above_it() -> None:
    checked = lint_imports(ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 broken" in checked.stdout, checked.stdout


# a forbidden import added to a copy of the source -> the contract it breaks (a part of its
# name) and the module the report names (a package outside service by its top-level name)
FORBIDDEN = {
    ("core/model.py", "import time"): ("core is pure", "time"),
    ("core/model.py", "from service.config import Settings"): ("core is pure", "service.config"),
    ("store/tables.py", "from service.app.answers import Problem"): (
        "nothing imports a layer",
        "service.app.answers",
    ),
    ("store/tables.py", "from service.leases import Lease"): ("store and leases", "service.leases"),
    ("http/render.py", "from service.store.db import ping"): ("http reaches", "service.store.db"),
    ("http/render.py", "import asyncpg"): ("http reaches", "asyncpg"),
    ("http/render.py", "from redis.asyncio import Redis"): ("http reaches", "redis"),
    ("http/render.py", "import sqlalchemy.sql"): ("http reaches", "sqlalchemy"),
    ("app/answers.py", "from service.http.render import render"): (
        "nothing imports a layer",
        "service.http.render",
    ),
    ("app/answers.py", "import litestar"): ("app imports no web framework", "litestar"),
    ("telemetry/context.py", "from service.store import tables"): (
        "telemetry is used",
        "service.store.tables",
    ),
    ("errors.py", "from service.core import Record"): ("the error root", "service.core"),
}


def test_the_contracts_see_each_forbidden_import(tmp_path: Path) -> None:
    shutil.copytree(SERVICE, tmp_path / "service", ignore=shutil.ignore_patterns("__pycache__"))
    for module, line in FORBIDDEN:
        with (tmp_path / "service" / module).open("a") as source:
            source.write(f"\n{line}  # noqa\n")
    checked = lint_imports(tmp_path)
    assert checked.returncode != 0
    broken = checked.stdout.split("Broken contracts", 1)[-1]
    for (module, line), (contract, named) in FORBIDDEN.items():
        importer = "service." + module.removesuffix(".py").replace("/", ".")
        assert contract in broken, (module, line)
        assert f"{importer} -> {named} " in broken, (module, line)
    assert "0 broken" not in checked.stdout


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
