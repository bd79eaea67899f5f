"""No module of the service grows past what a reader takes in at one sitting: 450 lines."""

from __future__ import annotations

from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
# the most lines a module of service/ may have
MOST_LINES = 450


def test_no_service_module_is_longer_than_450_lines() -> None:
    modules = sorted(SERVICE.rglob("*.py"))
    assert modules
    long = [
        f"{path.relative_to(SERVICE.parent)}: {lines} lines"
        for path in modules
        if (lines := len(path.read_text().splitlines())) > MOST_LINES
    ]
    assert not long, "split these modules:\n" + "\n".join(long)
