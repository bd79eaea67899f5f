"""How the bench's own apps are served: uvicorn with the options of ``settlement serve``.

``bench.bare_app`` and ``bench.peer_app`` both start here, so a change to the production
server's uvicorn options (``service.cli.uvicorn_options``) reaches the baselines and the
peers in the same run.
"""

from __future__ import annotations

import argparse

__all__ = ["main"]


def main(factory: str, prog: str, argv: list[str] | None = None) -> None:
    """``python -m <prog> --host H --port P --workers N``: ``factory`` (``module:function``,
    an ASGI app factory) under uvicorn, as ``service.cli`` serves the production app."""
    import uvicorn

    from service.cli import uvicorn_options
    from service.config import Settings

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    uvicorn.run(
        factory,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        **uvicorn_options(Settings.from_env()),
    )
