"""Both embedded servers together: PostgreSQL started first, Redis stopped first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from devstack.postgres import EmbeddedPostgres
from devstack.redis import EmbeddedRedis
from devstack.supervise import EmbeddedServiceError

__all__ = ["EmbeddedServices", "ServiceEndpoints"]


@dataclass(frozen=True)
class ServiceEndpoints:
    """Where the server finds PostgreSQL (SQLAlchemy async URL) and Redis."""

    database_url: str
    redis_url: str


class EmbeddedServices:
    """Starts the wanted servers on enter (PostgreSQL first), stops them on exit.

    Start it from the main thread: the servers are tied to the thread that started them.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        want_postgres: bool = True,
        want_redis: bool = True,
        durable: bool = True,
    ) -> None:
        self.postgres = EmbeddedPostgres(data_dir, durable=durable) if want_postgres else None
        self.redis = EmbeddedRedis(data_dir) if want_redis else None

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
            if self.postgres is not None:
                self.postgres.start()
            if self.redis is not None:
                self.redis.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop Redis, then PostgreSQL; safe to call twice."""
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
