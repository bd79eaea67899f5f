"""The tests' in-process ASGI driver (devstack.asgi, which bench uses too)."""

from devstack.asgi import Asgi

__all__ = ["Asgi"]
