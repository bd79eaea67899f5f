"""Settings: the lock timeout, the rules joining settings."""

from __future__ import annotations

import pytest

from service.config import ConfigError, Settings


def test_the_defaults_are_valid() -> None:
    """One lock timeout for every path, short: a held row answers within a second."""
    settings = Settings.from_env({})
    assert settings.db_lock_timeout == 1.0


@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_lock_timeout_must_be_positive(value: str) -> None:
    with pytest.raises(ConfigError, match="SETTLEMENT_DB_LOCK_TIMEOUT must be > 0"):
        Settings.from_env({"SETTLEMENT_DB_LOCK_TIMEOUT": value})


@pytest.mark.parametrize(("retention", "window"), [("300", "300"), ("100", "300")])
def test_feed_receipts_are_kept_longer_than_the_audit_reads_back(
    retention: str, window: str
) -> None:
    """A receipt the audit may still read again must never be purged."""
    with pytest.raises(ConfigError, match="SETTLEMENT_FEED_RETENTION must be more than"):
        Settings.from_env(
            {"SETTLEMENT_FEED_RETENTION": retention, "SETTLEMENT_FEED_AUDIT_WINDOW": window}
        )
