"""Serve the completed OpenAPI document: /schema/openapi.json, /schema/openapi.yaml, and the
Scalar page at /schema that reads the JSON one.

Litestar builds the document from the handlers; :func:`service.http.contract.complete` adds
what the handlers do not show it (bodies, header parameters, problems, security).
"""

from __future__ import annotations

from typing import Any

import msgspec
import yaml
from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, ScalarRenderPlugin, YamlRenderPlugin

from service.http.contract import complete

__all__ = ["as_json", "as_yaml", "openapi_config"]

TITLE = "Settlement server"
VERSION = "1.0.0"


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


def openapi_config() -> OpenAPIConfig:
    completed = _Completed()
    return OpenAPIConfig(
        title=TITLE,
        version=VERSION,
        path="/schema",
        render_plugins=[ScalarRenderPlugin(), _Json(completed), _Yaml(completed)],
    )
