"""Export the OpenAPI document the app serves at /schema/openapi.json."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from service.config import Settings
from service.http.app import create_app

__all__ = ["OPENAPI_PATH", "render"]

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def render() -> bytes:
    """The schema as stable, indented JSON (no connection is made to build it)."""
    settings = Settings.from_env(
        {}, database_url="postgresql://unused/unused", redis_url="redis://unused:1/0"
    )
    schema = create_app(settings).openapi_schema.to_schema()
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


if __name__ == "__main__":
    OPENAPI_PATH.write_bytes(render())
    sys.stdout.write(f"wrote {OPENAPI_PATH}\n")
