"""The committed OpenAPI documents are what the app serves (regenerate: make openapi)."""

from pathlib import Path

import pytest

from service.http.openapi import render

RENDERED = render()


@pytest.mark.parametrize("path", sorted(RENDERED), ids=lambda p: Path(p).name)
def test_committed_openapi_matches_the_app(path: Path) -> None:
    assert path.exists() and path.read_bytes() == RENDERED[path], (
        f"{path.relative_to(path.parents[1])} is stale: run `make openapi`"
    )
