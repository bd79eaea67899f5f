"""``python -m devstack.provider --port P --db FILE [--secret S]``.

The secret defaults to ``SETTLEMENT_PROVIDER_SECRET``; logs follow ``SETTLEMENT_LOG_FORMAT``.
``SETTLEMENT_SIM_TOKEN``, when set, is the bearer token the ``/_sim`` controls require; without
it the simulator starts only on a loopback address.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devstack.provider.run import UnsafeBind, check_bind, serve
from service.config import ConfigError, Settings
from service.logs import configure_logging

DEFAULT_PORT = 8100
DEFAULT_DB = ".data/provider.sqlite3"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.provider", description="the downstream provider simulator"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--db", type=Path, default=Path(DEFAULT_DB), help="SQLite file")
    parser.add_argument(
        "--secret", default=None, help="HMAC key (default: SETTLEMENT_PROVIDER_SECRET)"
    )
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        parser.exit(2, f"provider: configuration error: {exc}\n")
    secret = args.secret or settings.provider_secret
    if not secret:
        parser.exit(2, "provider: pass --secret or set SETTLEMENT_PROVIDER_SECRET\n")
    try:
        check_bind(args.host, settings.sim_token)
    except UnsafeBind as exc:
        parser.exit(2, f"provider: {exc}\n")
    configure_logging(settings)
    serve(
        host=args.host,
        port=args.port,
        secret=secret,
        db_path=args.db,
        sim_token=settings.sim_token,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
