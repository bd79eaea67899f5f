"""/schema against a real server: by default a page of links with no script at all, under a
Content-Security-Policy that lets nothing run; with SETTLEMENT_API_REFERENCE on, Scalar's
reference from one pinned release whose integrity the browser checks, under a policy that
lets only that script run and connects only to this server. The document itself
(/schema/openapi.json and .yaml) is served either way."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
import yaml

from service.http.openapi_plugins import REFERENCE_INTEGRITY, REFERENCE_SCRIPT
from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def policy_of(answer: httpx.Response) -> dict[str, list[str]]:
    """The Content-Security-Policy header as {directive: sources}."""
    found: dict[str, list[str]] = {}
    for part in answer.headers["content-security-policy"].split(";"):
        name, *sources = part.split()
        found[name] = sources
    return found


def assert_the_document_is_served(base: str) -> None:
    as_json = httpx.get(f"{base}/schema/openapi.json")
    assert as_json.status_code == 200 and as_json.json()["openapi"].startswith("3."), as_json.text
    as_yaml = httpx.get(f"{base}/schema/openapi.yaml")
    assert as_yaml.status_code == 200
    assert yaml.safe_load(as_yaml.text)["paths"] == as_json.json()["paths"]


def test_by_default_schema_is_a_page_of_links_where_nothing_runs(server: ServerProcess) -> None:
    base = server.base_url
    page = httpx.get(f"{base}/schema")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert "<script" not in page.text.lower() and "http" not in page.text, page.text
    assert 'href="/schema/openapi.json"' in page.text
    policy = policy_of(page)
    assert policy["default-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert "script-src" not in policy, policy
    assert page.headers["x-frame-options"] == "DENY"
    # Litestar's own Scalar page is not served either
    assert httpx.get(f"{base}/schema/scalar").status_code == 404
    assert_the_document_is_served(base)


@pytest.fixture(scope="module")
def reference_server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_API_REFERENCE": "true"}
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


def test_the_reference_runs_only_the_pinned_script_it_checks(
    reference_server: ServerProcess,
) -> None:
    base = reference_server.base_url
    page = httpx.get(f"{base}/schema")
    assert page.status_code == 200, page.text
    scripts = re.findall(r"<script[^>]*>", page.text)
    assert len(scripts) == 1, scripts  # no inline script: one tag, with a src
    (tag,) = scripts
    assert f'src="{REFERENCE_SCRIPT}"' in tag and f'integrity="{REFERENCE_INTEGRITY}"' in tag
    assert 'crossorigin="anonymous"' in tag
    assert "@latest" not in page.text and re.search(r"@\d+\.\d+\.\d+/", REFERENCE_SCRIPT)
    assert REFERENCE_INTEGRITY.startswith("sha384-")
    # every URL of the page is the script's or this server's
    urls = set(re.findall(r'(?:src|href)="([^"]+)"', page.text))
    assert urls <= {REFERENCE_SCRIPT, "/schema/openapi.json"}, urls
    policy = policy_of(page)
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == [REFERENCE_SCRIPT], policy  # no inline, no eval, no host
    assert policy["connect-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert_the_document_is_served(base)
