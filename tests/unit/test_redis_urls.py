"""Which redis-py client a SETTLEMENT_REDIS_URL makes (nothing connects here)."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from service.config import Settings
from service.leases import make_redis


def test_a_redis_url_makes_a_client_of_one_redis() -> None:
    assert type(make_redis(Settings.from_env({}), "redis://:pw@127.0.0.1:6379/2")) is Redis


def test_a_cluster_url_makes_a_cluster_client_seeded_with_every_node_it_names() -> None:
    url = "redis+cluster://:p%40ss@127.0.0.1:7001,127.0.0.1:7002,[::1]:7003"
    client = make_redis(Settings.from_env({}), url)
    assert isinstance(client, RedisCluster)
    manager = client.nodes_manager
    assert sorted(manager.startup_nodes) == ["127.0.0.1:7001", "127.0.0.1:7002", "::1:7003"]
    assert manager.connection_kwargs["password"] == "p@ss"  # percent-decoded


def test_the_cluster_scheme_with_tls() -> None:
    client = make_redis(Settings.from_env({}), "rediss+cluster://127.0.0.1:7001")
    assert isinstance(client, RedisCluster)
    assert client.nodes_manager.connection_kwargs["connection_class"].__name__ == "SSLConnection"
