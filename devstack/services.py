"""Both embedded servers together: PostgreSQL started first, Redis stopped first; and a
watcher that tells when one we run dies under us."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from devstack.ownership import OwnedServer
from devstack.postgres import EmbeddedPostgres
from devstack.redis import EmbeddedRedis
from devstack.supervise import EmbeddedServiceError

__all__ = ["EmbeddedServices", "ServiceEndpoints"]

# How often the watcher looks at the servers: a death is told within this.
WATCH_INTERVAL = 0.25


@dataclass(frozen=True)
class ServiceEndpoints:
    """Where the server finds PostgreSQL (SQLAlchemy async URL) and Redis."""

    database_url: str
    redis_url: str


class EmbeddedServices:
    """Starts the wanted servers on enter (PostgreSQL first), stops them on exit.

    Start it from the main thread: the servers are tied to the thread that started them.
    A server another live process already runs on ``data_dir`` is used, not started
    (``share``), or refused with :class:`devstack.ServerInUseError` (``share=False``: for a
    process that must run its servers itself, as ``settlement serve`` does).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        want_postgres: bool = True,
        want_redis: bool = True,
        durable: bool = True,
        share: bool = True,
    ) -> None:
        self.postgres = EmbeddedPostgres(data_dir, durable=durable) if want_postgres else None
        self.redis = EmbeddedRedis(data_dir) if want_redis else None
        self._share = share
        self._watcher: threading.Thread | None = None
        self._unwatch = threading.Event()

    @property
    def servers(self) -> list[OwnedServer]:
        """The wanted servers, PostgreSQL first."""
        return [s for s in (self.postgres, self.redis) if s is not None]

    @property
    def database_url(self) -> str:
        if self.postgres is None:
            raise EmbeddedServiceError("embedded PostgreSQL was not wanted")
        return self.postgres.url

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise EmbeddedServiceError("embedded Redis was not wanted")
        return self.redis.url

    def endpoints(
        self, *, database_url: str | None = None, redis_url: str | None = None
    ) -> ServiceEndpoints:
        """The given URLs, each falling back to the embedded server's."""
        return ServiceEndpoints(
            database_url=database_url or self.database_url,
            redis_url=redis_url or self.redis_url,
        )

    def start(self) -> None:
        try:
            for server in self.servers:
                server.start(share=self._share)
        except BaseException:
            self.stop()
            raise

    def watch(self, on_exit: Callable[[OwnedServer, int], None]) -> None:
        """From now until :meth:`stop`, call ``on_exit(server, exit_code)`` (once, from a
        thread of its own) if a server we run ends without being stopped."""
        if self._watcher is not None:
            return
        ours = [server for server in self.servers if server.owned]
        self._unwatch.clear()
        self._watcher = threading.Thread(
            target=self._watch, args=(ours, on_exit), name="embedded-watcher", daemon=True
        )
        self._watcher.start()

    def _watch(
        self, servers: list[OwnedServer], on_exit: Callable[[OwnedServer, int], None]
    ) -> None:
        while not self._unwatch.wait(WATCH_INTERVAL):
            for server in servers:
                code = server.exited()
                if code is not None:
                    on_exit(server, code)
                    return

    def stop(self) -> None:
        """Stop Redis, then PostgreSQL (the watcher first); safe to call twice."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            self._unwatch.set()
            watcher.join()
        try:
            if self.redis is not None:
                self.redis.stop()
        finally:
            if self.postgres is not None:
                self.postgres.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
