"""Every section of the design that the code cites exists: each ``§n`` under ``service/``
(and in the tests and the other documents) is written ``docs/design.md §n`` and names a
numbered heading (``## n. Title``) of ``docs/design.md``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SECTION = "\N{SECTION SIGN}"

# a numbered section heading of the design: "## 5. The idempotent request"
_HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)
# a citation: the section sign and its number, and what names the document before it (a
# line break may sit between the two)
_CITATION = re.compile(rf"(docs/design\.md\s+)?{SECTION}(\d+)")


def sections(design: str) -> set[int]:
    """The numbers of the design's numbered headings."""
    return {int(number) for number in _HEADING.findall(design)}


def citations(text: str) -> list[tuple[int, int, bool]]:
    """Each citation in ``text``: (line of its section sign, section, whether it names
    docs/design.md)."""
    return [
        (text.count("\n", 0, match.start(2)) + 1, int(match.group(2)), match.group(1) is not None)
        for match in _CITATION.finditer(text)
    ]


def wrong_citations(files: list[Path], design: str, base: Path = ROOT) -> list[str]:
    """The citations that name no document, or a section the design does not have (each
    as ``path:line: why``, the path relative to ``base``)."""
    known = sections(design)
    wrong = []
    for path in files:
        for line, section, named in citations(path.read_text()):
            where = f"{path.relative_to(base)}:{line}"
            if not named:
                wrong.append(f"{where}: {SECTION}{section} does not name docs/design.md")
            elif section not in known:
                wrong.append(f"{where}: docs/design.md has no section {section}")
    return wrong


def cited_files() -> list[Path]:
    files = sorted((ROOT / "service").rglob("*.py"))
    files += sorted(p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve())
    files += sorted(p for p in (ROOT / "docs").glob("*.md") if p != DESIGN)
    return [*files, ROOT / "README.md"]


def test_the_service_cites_the_design() -> None:
    service = sorted((ROOT / "service").rglob("*.py"))
    assert any(citations(path.read_text()) for path in service), "no citation under service/"


def test_every_cited_section_of_the_design_exists() -> None:
    wrong = wrong_citations(cited_files(), DESIGN.read_text())
    assert not wrong, "\n".join(wrong)


def test_the_sections_are_numbered_in_order() -> None:
    numbers = [int(n) for n in _HEADING.findall(DESIGN.read_text())]
    assert numbers == list(range(1, len(numbers) + 1))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (f'"""Rules (docs/design.md {SECTION}4), in order."""\n', []),
        (
            f"# the feeds (docs/design.md {SECTION}8)\n# rules (docs/design.md {SECTION}12)\n",
            ["m.py:2: docs/design.md has no section 12"],
        ),
        (
            f"# rules (DESIGN {SECTION}4)\n",
            [f"m.py:1: {SECTION}4 does not name docs/design.md"],
        ),
        (f'"""The rules (docs/design.md\n{SECTION}5 steps 2 and 4)."""\n', []),
        (
            f'"""The rules (docs/design.md\n{SECTION}9)."""\n',
            ["m.py:2: docs/design.md has no section 9"],
        ),
    ],
)
def test_the_check_sees_a_missing_section_and_an_unnamed_document(
    tmp_path: Path, source: str, expected: list[str]
) -> None:
    design = "# Design\n\n## 4. The merge\n\n## 5. The request\n\ntext\n\n## 8. Feeds\n"
    module = tmp_path / "m.py"
    module.write_text(source)
    assert wrong_citations([module], design, base=tmp_path) == expected


def test_the_check_reads_numbered_headings_only() -> None:
    design = "## 1. One\n### 2. Not a section\n## Three\n##4. No space\n## 5. Five\n"
    assert sections(design) == {1, 5}
