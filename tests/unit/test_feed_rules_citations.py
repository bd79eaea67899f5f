"""``docs/feed-rules.md`` cites code by module and name, never by line number: every cited
function, method, class or constant is still in its module, and every cited test exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "feed-rules.md"

# "`service/core/feed.py` `check_cursor_page`, `cursor_barrier`": a module, then its names
_CODE = re.compile(r"`((?:service|devstack|migrations)/[\w/.]+\.py)`((?: `[\w.]+`(?:,(?= `))?)+)")
_NAME = re.compile(r"`([\w.]+)`")
# "`tests/unit/test_feed_barrier.py::test_final_states`"
_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
# a line-number citation: "service/core/feed.py:129-134" or "`:212-213 _cursor_page`"
_LINES = re.compile(r"\.py:\d|`:\d")


def defined_names(source: str) -> set[str]:
    """Every name a module defines, classes' members qualified: ``FeedClient._get``."""
    names: set[str] = set()

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(prefix + child.name)
                if isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.Assign | ast.AnnAssign):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                names.update(prefix + t.id for t in targets if isinstance(t, ast.Name))

    walk(ast.parse(source), "")
    return names


def stale_citations(text: str, root: Path) -> list[str]:
    """What ``text`` cites that is not there (or cites by line number)."""
    stale = [
        f"line number: {line.strip()[:80]}" for line in text.splitlines() if _LINES.search(line)
    ]
    parsed: dict[str, set[str] | None] = {}

    def names_in(path: str) -> set[str] | None:
        if path not in parsed:
            module = root / path
            parsed[path] = defined_names(module.read_text()) if module.is_file() else None
        return parsed[path]

    for path, names in _CODE.findall(text):
        defined = names_in(path)
        if defined is None:
            stale.append(f"{path}: no such module")
            continue
        stale += [f"{path}: no {name}" for name in _NAME.findall(names) if name not in defined]
    for path, name in _TEST.findall(text):
        defined = names_in(path)
        if defined is None or name not in defined:
            stale.append(f"{path}::{name}: no such test")
    return stale


def test_every_cited_name_is_where_the_rules_say() -> None:
    text = RULES.read_text()
    assert _CODE.search(text) and _TEST.search(text), "docs/feed-rules.md cites nothing"
    stale = stale_citations(text, ROOT)
    assert not stale, "\n".join(stale)


def test_the_check_sees_a_moved_name_a_missing_test_and_a_line_number(tmp_path: Path) -> None:
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "m.py").write_text(
        "LIMIT = 3\nclass Feed:\n    size: int\n    def page(self): ...\ndef check(): ...\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text("def test_it(): ...\nTestMachine = object\n")
    good = (
        "| C1 | a rule | `service/m.py` `check`, `Feed.page`, `Feed.size`, `LIMIT` (called by "
        "`Feed.page`) | `tests/test_m.py::test_it`; `tests/test_m.py::TestMachine` |\n"
    )
    assert stale_citations(good, tmp_path) == []
    bad = (
        "| C1 | a rule | `service/m.py` `check`, `Feed.gone`; `service/x.py` `y` | "
        "`tests/test_m.py::test_gone` |\n| C2 | another | `service/m.py:4-5 check` | |\n"
    )
    assert stale_citations(bad, tmp_path) == [
        "line number: | C2 | another | `service/m.py:4-5 check` | |",
        "service/m.py: no Feed.gone",
        "service/x.py: no such module",
        "tests/test_m.py::test_gone: no such test",
    ]
