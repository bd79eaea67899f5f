"""Settings hold passwords (in the URLs) and keys; their repr must not show them."""

from __future__ import annotations

from service.config import Settings
from service.store.principals import new_key

SECRET = "s3cret-do-not-print"
ADMIN_KEY = new_key()  # the bootstrap admin's key must be an API key of 128 random bits


def test_settings_repr_leaves_out_urls_and_secrets() -> None:
    settings = Settings.from_env(
        {},
        database_url=f"postgresql://postgres:{SECRET}@127.0.0.1:5432/settlement",
        redis_url=f"redis://:{SECRET}@127.0.0.1:6379/0",
        provider_secret=SECRET,
        bootstrap_admin_key=ADMIN_KEY,
        provider_url=f"https://payer:{SECRET}@provider.example/v1",
        feeds=f"payments=cursor:https://feed:{SECRET}@provider.example/feeds/cursor",
    )
    shown = repr(settings)
    assert SECRET not in shown
    assert ADMIN_KEY not in shown
    assert "lease_ttl=10.0" in shown  # the rest is still shown
