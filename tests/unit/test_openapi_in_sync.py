"""The committed OpenAPI document is what the app serves (regenerate: make openapi)."""

from service.http.openapi import OPENAPI_PATH, render


def test_committed_openapi_matches_the_app() -> None:
    assert OPENAPI_PATH.read_bytes() == render(), "openapi/ is stale: run `make openapi`"
