"""Redis: leases, heartbeats and fencing live here. Redis is liveness, never authority."""

from service.leases.client import make_redis, ping
from service.leases.lease import Heartbeat, Lease, LeaseManager, LeaseUnavailable

__all__ = ["Heartbeat", "Lease", "LeaseManager", "LeaseUnavailable", "make_redis", "ping"]
