"""Helpers for the console's end-to-end tests: signing in over plain HTTP (httpx), reading
the forms' tokens out of the pages."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

__all__ = ["SECURITY_HEADERS", "form_token", "sign_in", "signed_in_client"]

# What every console answer carries (service/http/console/security.py).
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
_TOKEN = re.compile(r'name="csrf" value="([^"]*)"')


def form_token(html: str, form_id: str | None = None) -> str:
    """The first form token of the page, or of the form ``form_id``."""
    start = 0 if form_id is None else html.index(f'id="{form_id}"')
    found = _TOKEN.search(html, start)
    assert found is not None, html[:2000]
    return found.group(1)


def sign_in(client: httpx.Client, key: str, next_path: str | None = None) -> httpx.Response:
    """The sign-in form fetched, then posted with ``key``; the answer, not followed."""
    form = client.get("/console/sign-in")
    assert form.status_code == 200, form.text
    data = {"csrf": form_token(form.text, "sign-in-form"), "api_key": key}
    if next_path is not None:
        data["next"] = next_path
    return client.post("/console/sign-in", data=data)


@contextmanager
def signed_in_client(base_url: str, key: str) -> Iterator[httpx.Client]:
    """An HTTP client holding a console session of ``key``'s admin."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        answer = sign_in(client, key)
        assert answer.status_code == 303, answer.text
        yield client
