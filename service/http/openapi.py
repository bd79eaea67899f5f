"""Export the OpenAPI document the app serves at /schema/openapi.json (and .yaml)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from service.config import Settings
from service.http.app import create_app
from service.http.contract import complete
from service.http.openapi_plugins import as_json, as_yaml

__all__ = ["OPENAPI_DIR", "OPENAPI_JSON", "OPENAPI_YAML", "document", "render"]

OPENAPI_DIR = Path(__file__).resolve().parents[2] / "openapi"
OPENAPI_JSON = OPENAPI_DIR / "openapi.json"
OPENAPI_YAML = OPENAPI_DIR / "openapi.yaml"


def document() -> dict[str, Any]:
    """The completed document (no connection is made to build it)."""
    settings = Settings.from_env(
        {}, database_url="postgresql://unused/unused", redis_url="redis://unused:1/0"
    )
    return complete(create_app(settings).openapi_schema.to_schema())


def render() -> dict[Path, bytes]:
    """Each exported file and its content."""
    done = document()
    return {OPENAPI_JSON: as_json(done), OPENAPI_YAML: as_yaml(done)}


if __name__ == "__main__":
    for path, content in render().items():
        path.write_bytes(content)
        sys.stdout.write(f"wrote {path}\n")
