"""Redis: leases, heartbeats and fencing live here. Redis is liveness, never authority."""

from service.leases.client import AnyRedis, LeaseRedis, make_lease_redis, make_redis, ping
from service.leases.lease import Heartbeat, Lease, LeaseManager, LeaseUnavailable
from service.leases.wakeups import Wakeups

__all__ = [
    "AnyRedis",
    "Heartbeat",
    "Lease",
    "LeaseManager",
    "LeaseRedis",
    "LeaseUnavailable",
    "Wakeups",
    "make_lease_redis",
    "make_redis",
    "ping",
]
