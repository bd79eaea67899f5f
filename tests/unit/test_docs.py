"""The documents name only what is there: every repository path and every backticked dotted
Python name of this repo in ``README.md`` and ``docs/*.md`` exists, every relative link
between the documents resolves, and the benchmark tables are their result files' figures.

A path is one that starts with a top-level directory of the repo (``service/...``,
``tests/...``, ``bench/...``, ``docs/...``, ``migrations/...``, ``clients/...``,
``devstack/...``, ``openapi/...``); a placeholder (``bench/results/<date>.json``) or a
pattern (``*``) is not checked. A dotted name starts with a package of the repo
(``service.``, ``devstack.``, ``bench.``, ``tests.``, ``settlement_client.``): its longest
prefix that is a module must exist, and the rest must be defined in that module (a function,
a class, an assignment or an import; a class's members qualified), read with ``ast``,
importing nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench import results_table

ROOT = Path(__file__).resolve().parents[2]
# where a top-level package of the repo lives (settlement_client is the client's)
PACKAGES = {
    "service": ROOT,
    "devstack": ROOT,
    "bench": ROOT,
    "tests": ROOT,
    "settlement_client": ROOT / "clients" / "python",
}
TOP_DIRS = ("service", "tests", "bench", "docs", "migrations", "clients", "devstack", "openapi")
# paths the tests make and git ignores: named in the documents, absent from a fresh clone
MADE_BY_TESTS = ("tests/artifacts/",)

_PATH = re.compile(rf"(?<![\w/.:<>-])((?:{'|'.join(TOP_DIRS)})/[\w./<>*…-]*)")
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(rf"(?<![\w.]){'(?:' + '|'.join(PACKAGES) + ')'}(?:\.[A-Za-z_]\w*)+")
# [text](target): a markdown link; its target up to a space or the closing parenthesis
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


BENCH_README = ROOT / "bench" / "README.md"
# its paths are the client's own (tests/... under clients/python): only its names are checked
CLIENT_README = ROOT / "clients" / "python" / "README.md"


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The repository paths ``text`` names that are not there."""
    missing = []
    for match in _PATH.finditer(text):
        path = match.group(1).rstrip(".,;:")
        if any(mark in path for mark in "<>*…") or path.startswith(MADE_BY_TESTS):
            continue
        if not (root / path).exists():
            missing.append(path)
    return missing


def defined_names(source: str) -> set[str]:
    """What a module defines or imports at its top level, classes' members qualified
    (``Settings.from_env``)."""
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
            elif isinstance(child, ast.Import | ast.ImportFrom) and not prefix:
                names.update((a.asname or a.name).split(".")[0] for a in child.names)
            elif isinstance(child, ast.If | ast.Try) and not prefix:
                walk(child, prefix)  # TYPE_CHECKING imports, optional imports

    walk(ast.parse(source), "")
    return names


def module_file(parts: list[str]) -> Path | None:
    """The source of the module ``parts`` names, if there is one."""
    base = PACKAGES[parts[0]].joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_names(text: str) -> list[str]:
    """The backticked dotted names of the repo's packages in ``text`` that do not exist."""
    missing = []
    for span in _BACKTICKED.findall(text):
        for dotted in _DOTTED.findall(span):
            parts = dotted.split(".")
            for cut in range(len(parts), 0, -1):
                source = module_file(parts[:cut])
                if source is not None:
                    break
            rest = ".".join(parts[cut:])
            if source is None or (rest and rest not in defined_names(source.read_text())):
                missing.append(dotted)
    return missing


def broken_links(document: Path) -> list[str]:
    """The relative link targets of ``document`` that do not resolve (anchors not checked)."""
    broken = []
    for target in _LINK.findall(document.read_text()):
        if re.match(r"[a-z][a-z+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of this document
        path = target.split("#", 1)[0]
        if not (document.parent / path).exists():
            broken.append(target)
    return broken


@pytest.mark.parametrize(
    "document", [*documents(), BENCH_README], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_path_named_exists(document: Path) -> None:
    missing = missing_paths(document.read_text())
    assert not missing, f"{document.relative_to(ROOT)} names paths that are not there: {missing}"


@pytest.mark.parametrize(
    "document",
    [*documents(), BENCH_README, CLIENT_README],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_dotted_name_exists(document: Path) -> None:
    missing = missing_names(document.read_text())
    assert not missing, f"{document.relative_to(ROOT)} names what is not there: {missing}"


@pytest.mark.parametrize(
    "document",
    [*documents(), BENCH_README, CLIENT_README],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_relative_link_resolves(document: Path) -> None:
    broken = broken_links(document)
    assert not broken, f"{document.relative_to(ROOT)} links to what is not there: {broken}"


def test_the_benchmark_tables_are_the_results_figures() -> None:
    """Every row of docs/benchmarks.md's tables is its result file's, in the generator's
    order; a run added to bench/results since is not required (the next
    ``python -m bench.results_table --write`` adds it)."""
    doc = results_table.DOC.read_text()
    begin, end = results_table.BEGIN, results_table.END
    shown = doc[doc.index(begin) + len(begin) : doc.index(end)].splitlines()
    made = results_table.tables().splitlines()
    rows = [line for line in shown if line.startswith("| `")]
    assert rows, "docs/benchmarks.md shows no run"
    stale = [line for line in rows if line not in made]
    assert not stale, (
        "these rows of docs/benchmarks.md differ from bench/results (run "
        f"`python -m bench.results_table --write`): {stale}"
    )
    assert [line for line in shown if not line.startswith("| `")] == [
        line for line in made if not line.startswith("| `")
    ]
    assert rows == [line for line in made if line in rows], "rows out of the generator's order"


def test_the_checks_see_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "here.py").write_text("")
    text = (
        "`service/here.py`, service/gone.py, `bench/results/<date>.json`, "
        "https://example.org/service/x.py, `tests/artifacts/console/`"
    )
    assert missing_paths(text, root=tmp_path) == ["service/gone.py"]
    assert missing_names("`service.core.settle` and `python -m bench.metrics_cost`") == []
    assert missing_names("`service.core.nothing`, `tools.metrics_cost`, `bench.gone`") == [
        "service.core.nothing",
        "bench.gone",
    ]
    assert missing_names("`service.config.Settings.from_env`, plain service.gone.x") == []
    doc = tmp_path / "docs" / "a.md"
    doc.parent.mkdir()
    (tmp_path / "docs" / "b.md").write_text("")
    doc.write_text("[b](b.md#x) [c](c.md) [web](https://example.org) [here](#top) [up](../x.md)")
    assert broken_links(doc) == ["c.md", "../x.md"]


def test_defined_names_reads_imports_and_members() -> None:
    source = (
        "from x import a, b as c\nimport y.z\nclass K:\n    n: int\n    def m(self): ...\n"
        "if True:\n    from w import v\n"
    )
    assert defined_names(source) == {"a", "c", "y", "K", "K.n", "K.m", "v"}
