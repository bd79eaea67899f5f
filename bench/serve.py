"""How the bench's own apps are served: as ``settlement serve`` serves the production app.

``bench.bare_app`` and ``bench.peer_app`` both start here, so a change to the production
server or its limits (``service.serving``) reaches the baselines and the peers in the same run.
"""

from __future__ import annotations

import argparse

__all__ = ["main"]


def main(factory: str, prog: str, argv: list[str] | None = None) -> None:
    """``python -m <prog> --host H --port P --workers N``: ``factory`` (``module:function``,
    an ASGI app factory) under granian, as ``service.cli`` serves the production app."""
    from service.config import Settings
    from service.serving import serve

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    serve(factory, Settings.from_env(), host=args.host, port=args.port, workers=args.workers)
