"""Development tooling, installed with the ``devstack`` extra.

PostgreSQL and redis-server from pip wheels as supervised child processes (for
``settlement serve --embedded`` and the test suite; a local Redis Cluster of them for the
tests of the leases on a cluster), and the downstream provider simulator
(``devstack.provider``). The server never imports it: only the ``settlement`` commands that
start these tools do, inside the command.
"""

from devstack.ownership import ServerInUseError
from devstack.postgres import SYSTEM_USER, EmbeddedPostgres
from devstack.redis import EmbeddedRedis
from devstack.redis_cluster import EmbeddedRedisCluster
from devstack.services import EmbeddedServices, ServiceEndpoints
from devstack.supervise import EmbeddedServiceError, die_with_parent, missing_extra

__all__ = [
    "SYSTEM_USER",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedRedisCluster",
    "EmbeddedServiceError",
    "EmbeddedServices",
    "ServerInUseError",
    "ServiceEndpoints",
    "die_with_parent",
    "missing_extra",
]
