"""Write ``settlement_client/problems.py`` from the server's problem-type registry.

    python clients/python/scripts/generate_problems.py

One exception class per problem type of ``service/problem_types.py`` (its name is the
registry's ``exception_name``, so the names users catch stay put), each under ``Problem``
or, for a type that needs an operator (``supersede_required``), ``SupersedeRequired``; with
``RETRY_SAFE`` and ``PROBLEMS``. The classes that belong to no one slug are written by hand
in ``settlement_client/_problem_base.py``. ``tests/unit/test_problem_types.py`` renders the
module in memory and fails when it differs from the committed one. Standard library only:
the registry is read from its file.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "settlement_client" / "problems.py"
REGISTRY = HERE.parents[2] / "service" / "problem_types.py"
# What _problem_base.py gives, re-exported from problems.py as before (PROBLEM_CONTENT_TYPE
# too, though not in __all__).
BASE = (
    "Problem",
    "SettlementError",
    "SupersedeRequired",
    "TransportFailed",
    "UnknownProblem",
)

HEADER = '''"""One exception class per problem slug the server answers (RFC 9457 ``type`` =
``/problems/<slug>``), each carrying the problem document and the headers that identify the
call: ``Operation-Id``, ``Request-Id``, ``Idempotent-Replayed``.

``RETRY_SAFE`` is the server's ``retry_with_same_key_safe`` (``GET /problems/<slug>``):
resending the same request with the same key cannot run the effect twice and may get another
answer. Every other problem is final: the same retry gets the same answer until something
changes.

Do not edit: generated from the server's problem types (service/problem_types.py) by
``python clients/python/scripts/generate_problems.py``; a test fails when they differ.
"""

from __future__ import annotations

from settlement_client._problem_base import (
    PROBLEM_CONTENT_TYPE as PROBLEM_CONTENT_TYPE,
)
from settlement_client._problem_base import (
{base}
    read_problem,
    slug_of,
)

__all__ = [
{names}
]
'''

FOOTER = '''

# slug -> exception class, for every slug of the server (and business failures)
PROBLEMS: dict[str, type[Problem]] = {{
{table}
}}
RETRY_SAFE: frozenset[str] = frozenset(slug for slug, cls in PROBLEMS.items() if cls.retry_safe)


def problem_from(
    content: bytes,
    *,
    status: int,
    operation_id: str | None,
    request_id: str | None,
    replayed: bool,
    retry_after: str | None,
) -> Problem:
    """The exception for one problem answer (an unreadable body becomes UnknownProblem)."""
    problem = read_problem(content, status=status)
    cls = PROBLEMS.get(slug_of(problem), UnknownProblem)
    return cls(
        problem,
        content=content,
        operation_id=operation_id,
        request_id=request_id,
        replayed=replayed,
        retry_after=retry_after,
    )
'''


def registry(path: Path = REGISTRY) -> ModuleType:
    """The server's ``service/problem_types.py``, loaded from its file."""
    spec = importlib.util.spec_from_file_location("problem_types", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _class(problem: Any) -> str:
    base = "SupersedeRequired" if problem.supersede_required else "Problem"
    doc = f"{problem.status} ``{problem.slug}``: {problem.title}. {problem.what_to_do}"
    text = textwrap.fill(doc, width=96, initial_indent='    """', subsequent_indent="    ")
    lines = [f"class {problem.exception_name}({base}):", text + '"""', ""]
    lines.append(f'    slug = "{problem.slug}"')
    if problem.retry_safe:
        lines.append("    retry_safe = True")
    return "\n".join(lines)


def render(types: dict[str, Any]) -> str:
    problems = list(types.values())
    names = sorted(
        [*BASE, "PROBLEMS", "RETRY_SAFE", "problem_from"] + [p.exception_name for p in problems],
        key=lambda name: (not name.isupper(), not name[0].isupper(), name),
    )
    parts = [
        HEADER.format(
            base="\n".join(f"    {name}," for name in BASE),
            names="\n".join(f'    "{name}",' for name in names),
        )
    ]
    parts += ["\n\n" + _class(problem) + "\n" for problem in problems]
    table = "\n".join(f'    "{p.slug}": {p.exception_name},' for p in problems)
    parts.append(FOOTER.format(table=table))
    return "".join(parts)


def main() -> None:
    TARGET.write_text(render(registry().PROBLEM_TYPES))
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
