"""Run the provider simulator under uvicorn."""

from __future__ import annotations

from pathlib import Path

import uvicorn

from devstack.provider.app import create_provider_app

__all__ = ["GRACEFUL_SHUTDOWN", "serve"]

# In-flight requests get this long on SIGTERM; a delayed commit is still awaited by the
# lifespan after it (at most MAX_DELAY_MS more), so no accepted payment is lost to a shutdown.
GRACEFUL_SHUTDOWN = 10


def serve(*, host: str, port: int, secret: str, db_path: Path) -> None:
    """Serve the simulator until SIGINT/SIGTERM; ``secret`` signs every piece of evidence."""
    app = create_provider_app(secret, db_path)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )
