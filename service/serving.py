"""How ``settlement serve`` runs the app: granian, with limits on what one client may hold.

granian's HTTP/1.1 server (hyper) enforces, before the app sees a byte:

* **the header block's size**: at most ``SETTLEMENT_HEADER_LIMIT`` bytes (its read buffer,
  ``http1_settings.max_buffer_size``), a larger block answered 431 and the connection closed,
  at a cost bounded by the limit (no quadratic growth of one header's value);
* **the number of headers**: at most 100 (hyper's fixed cap), more answered 431;
* **a deadline for the header block**: ``SETTLEMENT_HEADER_TIMEOUT`` from connection open, or
  from the last answer on a kept-alive connection; a silent, half-sent or trickled header
  block is closed then;
* **connections per worker**: ``SETTLEMENT_CONNECTION_LIMIT`` (granian's ``backpressure``,
  taken per accepted connection): more wait in the kernel's listen queue, holding no
  descriptor of ours, and are served as others close.

The body's deadline is the app's (``service.http.limits.BodyDeadline``): the server has none.
uvicorn, the server before, has none of the four (its httptools parser grows a header value
by concatenation, and it never times a connection out before its first request).
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
from typing import Any

from service.config import Settings

__all__ = ["connection_limit", "die_with_server", "serve", "serving_pid"]

log = logging.getLogger("settlement.serve")

# Descriptors a worker needs beside its client connections: the database and Redis pools, the
# metrics files, logs, the event loop's own; a connection past the limit less this would leave
# the worker unable to reach its database.
FD_RESERVE = 128
# In-flight requests get this long to finish on SIGINT/SIGTERM before their workers are killed.
GRACEFUL_SHUTDOWN = 10
# A worker that died (a crash, the OOM killer) is replaced after this long: soon enough that
# the others do not carry its share for long, late enough that a worker dying at start does
# not spin.
RESPAWN_INTERVAL = 1.0
# Connections the kernel holds for us beyond those open (the listen backlog): past it a client
# is refused at once rather than queued; granian's own default.
BACKLOG = 1024


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

# The serving process's pid, set before granian forks its workers (which inherit it): a worker
# that finds another parent was orphaned before it could ask to die with this one.
_server_pid: int | None = None


def serving_pid() -> int | None:
    """In a worker forked by :func:`serve`, the serving process's pid; else None."""
    if _server_pid is None or os.getpid() == _server_pid:
        return None
    return _server_pid


def die_with_server() -> None:
    """In a worker forked by :func:`serve`: be killed with the serving process.

    The kernel sends SIGKILL when the process that forked us dies (``PR_SET_PDEATHSIG``), so a
    SIGKILLed server leaves no worker serving on its port; elsewhere (an app built in a test,
    under another server) it does nothing."""
    server = serving_pid()
    if server is None:
        return
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != server:  # the server died before we asked: nobody will signal
        os._exit(1)


def connection_limit(settings: Settings) -> int:
    """``SETTLEMENT_CONNECTION_LIMIT``, lowered to what the process's descriptor limit allows.

    The soft limit is first raised to the hard one (the kernel's default soft limit, 1,024,
    is a compatibility default for ``select``, which nothing here uses)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):  # a hard limit the kernel caps lower: keep the soft one
            pass
    allowed = max(1, soft - FD_RESERVE)
    if settings.connection_limit > allowed:
        log.warning(
            "connection limit lowered to the descriptor limit",
            extra={"configured": settings.connection_limit, "limit": allowed, "nofile": soft},
        )
        return allowed
    return settings.connection_limit


def serve(target: str, settings: Settings, *, host: str, port: int, workers: int) -> None:
    """Serve the ASGI app factory ``target`` (``module:function``) until SIGINT or SIGTERM."""
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server import Server

    global _server_pid
    _server_pid = os.getpid()
    server = Server(
        target,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=workers,
        # measured in make bench: 0.20 -> 0.09 ms CPU per bare request against asyncio's loop
        loop=Loops.uvloop,
        http=HTTPModes.http1,
        websockets=False,
        backlog=BACKLOG,
        backpressure=connection_limit(settings),
        http1_settings=HTTP1Settings(
            header_read_timeout=round(settings.header_timeout * 1000),
            keep_alive=True,
            max_buffer_size=settings.header_limit,
        ),
        # granian's own lines (a worker that died, a bind that failed) go to our log as
        # warnings and errors; the access line is the app's (service.telemetry.asgi)
        log_enabled=True,
        log_level=LogLevels.warning,
        log_dictconfig=_granian_logging(),
        log_access=False,
        workers_kill_timeout=GRACEFUL_SHUTDOWN,
        respawn_failed_workers=True,
        respawn_interval=RESPAWN_INTERVAL,
        factory=True,
    )
    server.serve()


def _granian_logging() -> dict[str, Any]:
    """granian's loggers propagate to ours (service.logs): one format, one stream."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {
            "_granian": {"handlers": [], "level": "WARNING", "propagate": True},
            "granian.access": {"handlers": [], "level": "WARNING", "propagate": True},
        },
    }
