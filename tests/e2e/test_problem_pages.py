"""GET /problems/<slug>: every problem type the server can send links to a page that says
what happened, whether retrying with the same key is the next step, and what to do."""

from __future__ import annotations

import ast
import html
from pathlib import Path

import httpx
import pytest

from service.errors import SettlementError
from service.http.pages import PAGES
from service.problem_types import PROBLEM_TYPES, business_failures
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

SERVICE = Path(__file__).resolve().parents[2] / "service"
# calls whose first argument is a problem slug
SLUG_TAKERS = {
    "problem_response",
    "Problem",
    "ProblemError",
    "AuthError",
    "IdempotencyKeyError",
    "BusinessFailure",
}


def slugs_in_source() -> set[str]:
    """Every string literal passed as the slug of a problem anywhere in service/."""
    found: set[str] = set()
    for path in SERVICE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            first = node.args[0]
            if name in SLUG_TAKERS and isinstance(first, ast.Constant):
                found.add(str(first.value))
    return found


def errors_below(root: type[SettlementError]) -> set[type[SettlementError]]:
    """Every error class of the server's tree under ``root``."""
    import service.http.app  # noqa: F401 - every layer's errors, imported

    found = set(root.__subclasses__())
    for error in list(found):
        found |= errors_below(error)
    return found


def test_every_slug_the_server_can_send_has_a_page() -> None:
    sent = slugs_in_source() | set(PROBLEM_TYPES)
    sent |= {error.problem for error in errors_below(SettlementError)}
    assert len(sent) > 25  # the scan found the calls
    assert sent <= set(PAGES), f"no page for {sorted(sent - set(PAGES))}"


def test_each_page_is_html_by_default_and_json_on_request(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url) as client:
        for slug, page in PAGES.items():
            shown = client.get(f"/problems/{slug}")
            assert shown.status_code == 200, slug
            assert shown.headers["content-type"].startswith("text/html")
            # the page is HTML: its title is there as HTML writes it (an apostrophe escaped)
            assert html.escape(page.title) in shown.text and "What to do" in shown.text
            data = client.get(f"/problems/{slug}", headers={"Accept": "application/json"})
            assert data.status_code == 200
            assert data.headers["content-type"] == "application/json"
            body = data.json()
            assert set(body) == {
                "slug",
                "status",
                "title",
                "what_happened",
                "retry_with_same_key_safe",
                "what_to_do",
            }
            assert (body["slug"], body["status"]) == (slug, page.status)
            assert body["what_happened"] and body["what_to_do"]


def test_the_type_link_of_a_problem_answered_leads_to_its_page(server: ServerProcess) -> None:
    refused = httpx.post(f"{server.base_url}/v1/transfers", json={})
    assert refused.status_code == 401
    page = httpx.get(
        server.base_url + refused.json()["type"], headers={"Accept": "application/json"}
    )
    assert page.status_code == 200
    assert page.json()["slug"] == "unauthenticated"
    assert page.json()["retry_with_same_key_safe"] is False


def test_retry_advice_matches_what_the_server_does() -> None:
    retry = {slug for slug, page in PAGES.items() if page.retry_with_same_key_safe}
    assert {"operation-in-progress", "operation-outcome-unknown", "lease-unavailable"} <= retry
    assert "fingerprint-mismatch" not in retry
    assert not retry & set(business_failures())  # stored and replayed: the same answer again


def test_an_unknown_slug_is_a_404_problem(server: ServerProcess) -> None:
    missing = httpx.get(f"{server.base_url}/problems/no-such-thing")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["type"] == "/problems/not-found"
