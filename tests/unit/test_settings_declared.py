"""Each setting is declared once; reading, checking, `settlement config` and the settings
table of docs/operations.md all come from that declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main
from service.config import SETTINGS, ConfigError, Settings
from service.core import TerminalPolicy
from service.setting import markdown_table

TABLE_DOC = Path(__file__).parents[2] / "docs" / "operations.md"
BEGIN = "<!-- settings table: settlement config --markdown -->\n"
END = "<!-- end of settings table -->\n"


def test_the_readme_table_is_the_declared_list() -> None:
    text = TABLE_DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert table == markdown_table(SETTINGS) + "\n", (
        "docs/operations.md's settings table differs from service/config.py: paste the output of "
        "`settlement config --markdown` between its markers"
    )


def test_config_markdown_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table(SETTINGS) + "\n"


def test_every_setting_is_read_from_its_variable_and_has_a_reason() -> None:
    assert [one.name for one in SETTINGS] == list(Settings.__dataclass_fields__)
    assert all(one.why and one.variable == f"SETTLEMENT_{one.name.upper()}" for one in SETTINGS)


def test_values_are_read_by_the_type_declared() -> None:
    settings = Settings.from_env(
        {
            "SETTLEMENT_LEASE_TTL": " 2.5 ",
            "SETTLEMENT_DB_POOL_SIZE": "3",
            "SETTLEMENT_ACCESS_LOG": "yes",
            "SETTLEMENT_ENABLE_FAILPOINTS": "off",
            "SETTLEMENT_TERMINAL_POLICY": "completed_wins",
            "SETTLEMENT_LOG_FORMAT": "text",
            "SETTLEMENT_SIM_TOKEN": "",  # empty is unset
        }
    )
    assert settings.lease_ttl == 2.5
    assert settings.db_pool_size == 3
    assert settings.access_log is True
    assert settings.enable_failpoints is False
    assert settings.terminal_policy is TerminalPolicy.COMPLETED_WINS
    assert settings.log_format == "text"
    assert settings.sim_token is None


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("SETTLEMENT_LEASE_TTL", "soon", "SETTLEMENT_LEASE_TTL must be a number of seconds"),
        ("SETTLEMENT_LEASE_TTL", "inf", "SETTLEMENT_LEASE_TTL must be a finite number"),
        ("SETTLEMENT_LEASE_TTL", "0", "SETTLEMENT_LEASE_TTL must be > 0"),
        ("SETTLEMENT_MAX_WAIT", "-1", "SETTLEMENT_MAX_WAIT must be >= 0"),
        ("SETTLEMENT_BODY_LIMIT", "1.5", "SETTLEMENT_BODY_LIMIT must be an integer"),
        ("SETTLEMENT_BODY_LIMIT", "0", "SETTLEMENT_BODY_LIMIT must be >= 1"),
        ("SETTLEMENT_FEED_PAGE_SIZE", "501", "SETTLEMENT_FEED_PAGE_SIZE must be 1-500"),
        ("SETTLEMENT_ACCESS_LOG", "maybe", "SETTLEMENT_ACCESS_LOG must be 1 or 0"),
        ("SETTLEMENT_TERMINAL_POLICY", "last", "SETTLEMENT_TERMINAL_POLICY must be conflict or"),
        ("SETTLEMENT_LOG_FORMAT", "xml", "SETTLEMENT_LOG_FORMAT must be json or text"),
        ("SETTLEMENT_METRICS_ROLE", "x", "SETTLEMENT_METRICS_ROLE must be none, admin, obs"),
        ("SETTLEMENT_OTEL_EXPORTER", "x", "SETTLEMENT_OTEL_EXPORTER must be none, console or"),
        ("SETTLEMENT_REDIS_URL", "cache:6379", r"SETTLEMENT_REDIS_URL must be a URL \(scheme"),
        ("SETTLEMENT_FEEDS", "bad", "SETTLEMENT_FEEDS: 'bad' is not name=kind:url"),
    ],
)
def test_a_bad_value_names_its_variable(variable: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Settings.from_env({variable: value})


def test_an_override_is_checked_like_a_variable() -> None:
    with pytest.raises(ConfigError, match="SETTLEMENT_LOG_FORMAT must be json or text"):
        Settings.from_env({}, log_format="xml")
