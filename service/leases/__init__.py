"""Redis: leases, heartbeats and fencing live here. Redis is liveness, never authority."""

from service.leases.client import make_redis, ping

__all__ = ["make_redis", "ping"]
