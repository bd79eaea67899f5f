"""The settlement server."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The installed package's version (pyproject.toml's, once installed): what
    ``settlement --version``, ``settlement_build_info`` and the OpenAPI document say."""
    try:
        return version("settlement")
    except PackageNotFoundError:
        return "unknown (not installed)"
