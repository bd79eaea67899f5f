"""Run the provider simulator under uvicorn: on loopback, unless a token locks its controls."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import uvicorn

from devstack.provider.app import create_provider_app

__all__ = ["GRACEFUL_SHUTDOWN", "UnsafeBind", "check_bind", "serve"]

# In-flight requests get this long on SIGTERM; a delayed commit is still awaited by the
# lifespan after it (at most MAX_DELAY_MS more), so no accepted payment is lost to a shutdown.
GRACEFUL_SHUTDOWN = 10


class UnsafeBind(ValueError):
    """The simulator would listen beyond this machine with its controls open."""


def check_bind(host: str, sim_token: str | None) -> None:
    """Refuse a non-loopback ``host`` without a control token: anyone who could reach it
    could arm faults (decline or drop every payment) and read every sink key's payments."""
    if sim_token or _is_loopback(host):
        return
    raise UnsafeBind(
        f"refusing to listen on {host!r} with open /_sim controls: set SETTLEMENT_SIM_TOKEN "
        "(the bearer token /_sim then requires) or bind a loopback address such as 127.0.0.1"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # any other host name may resolve beyond this machine
        return False


def serve(
    *, host: str, port: int, secret: str, db_path: Path, sim_token: str | None = None
) -> None:
    """Serve the simulator until SIGINT/SIGTERM; ``secret`` signs every piece of evidence and
    authenticates every payment call, ``sim_token`` (if any) guards ``/_sim``.

    Raises :class:`UnsafeBind` before listening on a non-loopback ``host`` without a token.
    """
    check_bind(host, sim_token)
    app = create_provider_app(secret, db_path, sim_token=sim_token)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )
