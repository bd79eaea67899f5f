"""Settings hold passwords (in the URLs) and keys; their repr must not show them."""

from __future__ import annotations

from service.config import Settings

SECRET = "s3cret-do-not-print"


def test_settings_repr_leaves_out_urls_and_secrets() -> None:
    settings = Settings.from_env(
        {},
        database_url=f"postgresql://postgres:{SECRET}@127.0.0.1:5432/settlement",
        redis_url=f"redis://:{SECRET}@127.0.0.1:6379/0",
        provider_secret=SECRET,
        bootstrap_admin_key=SECRET,
    )
    shown = repr(settings)
    assert SECRET not in shown
    assert "lease_ttl=10.0" in shown  # the rest is still shown
