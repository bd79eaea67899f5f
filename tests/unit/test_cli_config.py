"""`settlement --version` and `settlement config`: what users expect of a command."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from service.cli import main
from service.config import Settings
from service.store.principals import new_key

ADMIN_KEY = new_key()


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"settlement {version('settlement')}"


def test_config_prints_every_setting_with_its_reason_and_masks_secrets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SETTLEMENT_DATABASE_URL", "postgresql://app:hunter2@db:5432/s")
    monkeypatch.setenv("SETTLEMENT_REDIS_URL", "redis://:redispw@cache:6379/0")
    monkeypatch.setenv("SETTLEMENT_BOOTSTRAP_ADMIN_KEY", ADMIN_KEY)
    monkeypatch.setenv("SETTLEMENT_PROVIDER_SECRET", "provider-secret")
    monkeypatch.setenv("SETTLEMENT_LEASE_TTL", "7.5")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    for secret in ("hunter2", "redispw", ADMIN_KEY, "provider-secret"):
        assert secret not in out
    lines = {line.split("=", 1)[0]: line for line in out.splitlines()}
    assert set(lines) == {name for name, _, _ in Settings().described()}
    assert "postgresql://app:***@db:5432/s" in lines["SETTLEMENT_DATABASE_URL"]
    assert "SETTLEMENT_LEASE_TTL=7.5 " in lines["SETTLEMENT_LEASE_TTL"]
    assert "# a crashed worker's operation is retryable" in lines["SETTLEMENT_LEASE_TTL"]
    assert lines["SETTLEMENT_SIM_TOKEN"].startswith("SETTLEMENT_SIM_TOKEN=unset ")
