"""Settings refuse combinations that would break a guarantee, naming the variables."""

from __future__ import annotations

import pytest

from service.config import ConfigError, Settings


def test_the_defaults_are_valid() -> None:
    settings = Settings.from_env({})
    assert settings.db_hot_lock_timeout < settings.db_lock_timeout
    assert settings.db_connect_timeout < settings.lease_ttl


@pytest.mark.parametrize(("connect", "ttl"), [("10", "10"), ("12", "10"), ("5", "2")])
def test_a_slot_or_connection_wait_may_not_outlast_the_lease(connect: str, ttl: str) -> None:
    env = {"SETTLEMENT_DB_CONNECT_TIMEOUT": connect, "SETTLEMENT_LEASE_TTL": ttl}
    with pytest.raises(ConfigError, match="SETTLEMENT_DB_CONNECT_TIMEOUT must be below"):
        Settings.from_env(env)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_hot_lock_timeout_must_be_positive(value: str) -> None:
    with pytest.raises(ConfigError, match="SETTLEMENT_DB_HOT_LOCK_TIMEOUT must be > 0"):
        Settings.from_env({"SETTLEMENT_DB_HOT_LOCK_TIMEOUT": value})
