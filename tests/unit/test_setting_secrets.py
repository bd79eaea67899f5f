"""Review findings 7 and 11: a weak bootstrap admin key is refused at start, and no URL's
password is printed by `settlement config` or an error about a setting."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest

from service.cli import main
from service.config import ConfigError, Settings
from service.setting import estimated_bits, masked
from service.store.principals import new_key

PASSWORD = "pa55-w0rd"


@pytest.mark.parametrize(
    "key",
    [
        "admin",
        "changeme-please-this-is-the-admin-key",
        "test-admin-key-65dd1d2cf981644621db53fbe97ce1e8",  # not the key format
        "sk_" + "a" * 43,  # the format, no entropy
        "sk_" + "admin" * 9,  # repeats
        "sk_" + "0123456789abcdef" * 3,  # repeats of a pattern
        "sk_JJHplDWvURD0GvU8_TPkKQ",  # too short: 22 characters
        " sk_fzqMvOZ9x3IDk1YNoQeSMkHYyi6pYPn1y4Puxw-V9yI",  # not exactly the key
    ],  # fixed values: every xdist worker must collect the same ids
)
def test_a_weak_or_malformed_bootstrap_admin_key_is_refused_at_start(key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": key})
    message = str(refused.value)
    assert message.startswith("SETTLEMENT_BOOTSTRAP_ADMIN_KEY must be an API key")
    assert "\n" not in message
    assert key.strip() not in message  # the refused key is not echoed


def test_the_cli_refuses_a_weak_bootstrap_key_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SETTLEMENT_BOOTSTRAP_ADMIN_KEY", "admin")
    with pytest.raises(SystemExit) as exit_:
        main(["config"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("settlement: configuration error: SETTLEMENT_BOOTSTRAP_ADMIN_KEY must")


@pytest.mark.parametrize(
    "make",
    [new_key, lambda: "sk_" + secrets.token_hex(32), lambda: "sk_" + secrets.token_urlsafe(48)],
    ids=[
        "new_key",
        "token_hex",
        "token_urlsafe",
    ],  # made in the test: xdist's workers collect alike
)
def test_a_random_api_key_is_accepted_as_bootstrap_admin_key(make: Callable[[], str]) -> None:
    key = make()
    assert Settings.from_env({"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": key}).bootstrap_admin_key == key


def test_every_generated_key_is_far_above_128_bits() -> None:
    """The keys the server makes (and `serve --embedded` keeps as its local admin key) always
    pass the bootstrap rule: the least of many scores is far above the bound."""
    assert min(estimated_bits(new_key()[3:]) for _ in range(20_000)) > 160


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://app:pa55-w0rd@db:5432/s", "postgresql://app:***@db:5432/s"),
        ("redis://:pa55-w0rd@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis+cluster://:pa55-w0rd@h1:7000,h2:7001", "redis+cluster://:***@h1:7000,h2:7001"),
        ("https://u:pa55@w0rd@provider/x", "https://u:***@provider/x"),  # a raw @
        ("https://u:pa55/w0rd#x@provider/x", "https://u:***@provider/x"),  # a raw / and #
        (
            "postgresql://db/s?password=pa55-w0rd&sslmode=require",
            "postgresql://db/s?password=***&sslmode=require",
        ),
        (
            "a=cursor:https://u:pa55-w0rd@h/c,b=timestamp:http://h2:80/t,c=cursor:http://:pa55-w0rd@h3",
            "a=cursor:https://u:***@h/c,b=timestamp:http://h2:80/t,c=cursor:http://:***@h3",
        ),
        ("http://h:8080/x@y", "http://h:***@y"),  # not a password, masked all the same
        ("redis://cache:6379/0", "redis://cache:6379/0"),
    ],
)
def test_masked_hides_the_password_of_every_url(text: str, shown: str) -> None:
    assert masked(text) == shown


def test_config_masks_the_password_of_every_url_valued_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SETTLEMENT_DATABASE_URL", f"postgresql://app:{PASSWORD}@db:5432/s")
    monkeypatch.setenv("SETTLEMENT_REDIS_URL", f"redis+cluster://:{PASSWORD}@h1:7000,h2:7001")
    monkeypatch.setenv("SETTLEMENT_PROVIDER_URL", f"https://payer:{PASSWORD}@provider.test/v1")
    monkeypatch.setenv(
        "SETTLEMENT_FEEDS",
        f"payments=cursor:https://feed:{PASSWORD}@provider.test/feeds/cursor,"
        f"payments-ts=timestamp:https://provider.test/feeds/timestamp?password={PASSWORD}",
    )
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert PASSWORD not in out
    lines = {line.split("=", 1)[0]: line for line in out.splitlines()}
    assert "redis+cluster://:***@h1:7000,h2:7001 " in lines["SETTLEMENT_REDIS_URL"]
    assert "https://payer:***@provider.test/v1 " in lines["SETTLEMENT_PROVIDER_URL"]
    assert (
        "payments=cursor:https://feed:***@provider.test/feeds/cursor,payments-ts=timestamp:"
        "https://provider.test/feeds/timestamp?password=*** " in lines["SETTLEMENT_FEEDS"]
    )


def test_the_url_valued_settings_are_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "--markdown"]) == 0
    rows = {row.split(" | ")[0].strip("| `"): row for row in capsys.readouterr().out.splitlines()}
    for name in ("DATABASE_URL", "REDIS_URL", "PROVIDER_URL", "FEEDS"):
        assert "secret |" in rows[f"SETTLEMENT_{name}"]


def test_a_bad_feed_url_is_refused_without_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SETTLEMENT_FEEDS": f"p=cursor:ftp://u:{PASSWORD}@h/x"})
    assert PASSWORD not in str(refused.value)
    assert "ftp://u:***@h/x" in str(refused.value)
