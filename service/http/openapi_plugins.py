"""Serve the completed OpenAPI document: /schema/openapi.json, /schema/openapi.yaml, and at
/schema a page: by default a plain one of links, without any script; with
``SETTLEMENT_API_REFERENCE`` on, Scalar's interactive reference, one pinned release checked by
the browser (Subresource Integrity), under a Content-Security-Policy that lets nothing else
run or load.

/schema shares its origin with the console, so a script that ran there could read a console
page (and its form token) with the operator's cookie: nothing runs there unless it is turned
on, and then only the exact bytes pinned below.

Litestar builds the document from the handlers; :func:`service.http.contract.complete` adds
what the handlers do not show it (bodies, header parameters, problems, security).
"""

from __future__ import annotations

import html
from typing import Any

import msgspec
import yaml
from litestar import Request, Router
from litestar.datastructures import ResponseHeader
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, OpenAPIRenderPlugin, YamlRenderPlugin

from service import package_version
from service.http.contract import complete

__all__ = ["REFERENCE_SCRIPT", "as_json", "as_yaml", "openapi_config"]

TITLE = "Settlement server"
SCHEMA_PATH = "/schema"
# Scalar's standalone bundle, one release: never "latest", so a new (or hijacked) release
# never runs here. The integrity is the SHA-384 of dist/browser/standalone.js in the npm
# package @scalar/api-reference@1.76.4, which the CDN serves byte for byte; a browser runs
# the file only if it hashes to it. To move to another release: take that file from the
# package (npm pack), read it, and put its version and hash here.
SCALAR_VERSION = "1.76.4"
REFERENCE_SCRIPT = (
    f"https://cdn.jsdelivr.net/npm/@scalar/api-reference@{SCALAR_VERSION}"
    "/dist/browser/standalone.js"
)
REFERENCE_INTEGRITY = "sha384-hwB9WroDTpZaI38gr+u9CXA6ksz5gUYgD2GxXazKl/agT1L2GWUiRFWGJYNiFu4Q"
# Every answer under /schema: nothing runs, loads or frames it but what the page needs.
_COMMON = "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
# The page of links: no script, no style, no request at all.
LINKS_POLICY = f"default-src 'none'; {_COMMON}"
# The reference: that one script; its own styles (it writes them inline) and images; the
# document and "try it" requests to this server only (no font, telemetry or proxy elsewhere).
REFERENCE_POLICY = (
    f"default-src 'none'; script-src {REFERENCE_SCRIPT}; style-src 'unsafe-inline'; "
    f"img-src 'self' data:; font-src 'self' data:; connect-src 'self'; {_COMMON}"
)
# Scalar's options (HTML-escaped JSON, read from the element): no fonts from its own host,
# which the policy would refuse anyway.
_REFERENCE_OPTIONS = html.escape(msgspec.json.encode({"withDefaultFonts": False}).decode())
_HEADERS = (
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
)


def as_json(document: dict[str, Any]) -> bytes:
    """Stable, indented JSON (the committed openapi/openapi.json)."""
    return msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n"


def as_yaml(document: dict[str, Any]) -> bytes:
    """The same document as YAML, keys in the JSON's order (openapi/openapi.yaml)."""
    text: str = yaml.safe_dump(
        msgspec.json.decode(msgspec.json.encode(document)),
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    return text.encode()


class _Completed:
    """The completed document, made once from Litestar's (which Litestar caches itself)."""

    def __init__(self) -> None:
        self._done: dict[str, Any] | None = None

    def __call__(self, litestar_schema: dict[str, Any]) -> dict[str, Any]:
        if self._done is None:
            self._done = complete(litestar_schema)
        return self._done


class _Json(JsonRenderPlugin):
    def __init__(self, completed: _Completed) -> None:
        super().__init__()
        self._completed = completed

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return as_json(self._completed(openapi_schema))


class _Yaml(YamlRenderPlugin):
    def __init__(self, completed: _Completed) -> None:
        super().__init__()
        self._completed = completed

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return as_yaml(self._completed(openapi_schema))


class _Links(OpenAPIRenderPlugin):
    """/schema when the interactive reference is off: where the document is, no script."""

    def __init__(self) -> None:
        super().__init__(path="/", favicon="", style="")

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        title = html.escape(str(openapi_schema["info"]["title"]))
        return (
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{title}: API</title></head><body><h1>{title}: API</h1>"
            f'<ul><li><a href="{SCHEMA_PATH}/openapi.json">openapi.json</a></li>'
            f'<li><a href="{SCHEMA_PATH}/openapi.yaml">openapi.yaml</a></li></ul>'
            "<p>The interactive reference is off on this server "
            "(SETTLEMENT_API_REFERENCE).</p></body></html>\n"
        ).encode()


class _Reference(OpenAPIRenderPlugin):
    """/schema with the interactive reference on: Scalar's pinned script, reading
    /schema/openapi.json; no inline script, no stylesheet or icon from elsewhere."""

    def __init__(self) -> None:
        super().__init__(path="/", favicon="", style="")

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        title = html.escape(str(openapi_schema["info"]["title"]))
        return (
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}: API reference</title></head><body>"
            "<noscript>The API reference needs JavaScript; the document itself is "
            f'<a href="{SCHEMA_PATH}/openapi.json">openapi.json</a>.</noscript>'
            f'<div id="api-reference" data-url="{SCHEMA_PATH}/openapi.json" '
            f'data-configuration="{_REFERENCE_OPTIONS}"></div>'
            f'<script src="{REFERENCE_SCRIPT}" integrity="{REFERENCE_INTEGRITY}" '
            'crossorigin="anonymous" referrerpolicy="no-referrer"></script>'
            "</body></html>\n"
        ).encode()


def openapi_config(*, reference: bool = False) -> OpenAPIConfig:
    """``reference``: /schema is Scalar's interactive reference, else a page of links."""
    completed = _Completed()
    policy = REFERENCE_POLICY if reference else LINKS_POLICY
    headers = [ResponseHeader(name="Content-Security-Policy", value=policy)]
    headers += [ResponseHeader(name=name, value=value) for name, value in _HEADERS]
    return OpenAPIConfig(
        title=TITLE,
        version=package_version(),  # the package's (pyproject.toml)
        path=SCHEMA_PATH,
        openapi_router=Router(
            SCHEMA_PATH,
            route_handlers=[],
            include_in_schema=False,
            dto=None,
            return_dto=None,
            response_headers=headers,
        ),
        render_plugins=[
            _Reference() if reference else _Links(),
            _Json(completed),
            _Yaml(completed),
        ],
    )
