"""No module of the server imports a private (``_``-prefixed) module or name of a third-party
package: such imports break on any release of the package, without a deprecation."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
OURS = ("service", "devstack", "__future__")


def private_imports(path: Path) -> list[str]:
    """``module:line`` of every import of a private module or name of another package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            imported = [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in imported:
            if module.split(".")[0] in OURS:
                continue
            parts = [*module.split("."), name]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                found.append(f"{path.name}:{node.lineno}: {module} {name}".rstrip())
    return found


def test_no_module_of_the_server_imports_a_private_module_of_another_package() -> None:
    found = [line for path in sorted(SERVICE.rglob("*.py")) for line in private_imports(path)]
    assert found == []


def test_the_check_finds_every_kind_of_private_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from redis._parsers.base import BaseParser\n"
        "import litestar._asgi.utils\n"
        "from litestar import _private_name\n"
        "from service._own import y\n"
        "from . import _relative\n"
        "import os.path\n"
        "from typing import __all__\n"
    )
    assert private_imports(module) == [
        "m.py:1: redis._parsers.base BaseParser",
        "m.py:2: litestar._asgi.utils",
        "m.py:3: litestar _private_name",
    ]
