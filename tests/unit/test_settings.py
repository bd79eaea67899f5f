"""Settings: the hot path's own lock timeout."""

from __future__ import annotations

import pytest

from service.config import ConfigError, Settings


def test_the_defaults_are_valid() -> None:
    settings = Settings.from_env({})
    assert settings.db_hot_lock_timeout < settings.db_lock_timeout


@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_hot_lock_timeout_must_be_positive(value: str) -> None:
    with pytest.raises(ConfigError, match="SETTLEMENT_DB_HOT_LOCK_TIMEOUT must be > 0"):
        Settings.from_env({"SETTLEMENT_DB_HOT_LOCK_TIMEOUT": value})
