"""The plain `alembic` command works from the repository root with SETTLEMENT_DATABASE_URL
(alembic.ini), as `settlement migrate` does from code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.store.migrate import head_revision
from tests.conftest import Services, fresh_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = str(Path(sys.executable).parent / "alembic")


def alembic(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SETTLEMENT_DATABASE_URL"}
    if url is not None:
        env["SETTLEMENT_DATABASE_URL"] = url
    return subprocess.run(
        [ALEMBIC, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_alembic_upgrade_head_migrates_the_database_named_by_the_setting(
    services: Services,
) -> None:
    url = fresh_database(services, "alembic_cli")
    upgraded = alembic("upgrade", "head", url=url)
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    current = alembic("current", url=url)
    assert current.returncode == 0, current.stderr
    assert head_revision() in current.stdout


def test_alembic_without_the_setting_says_what_to_set() -> None:
    refused = alembic("current", url=None)
    assert refused.returncode != 0
    assert "SETTLEMENT_DATABASE_URL" in refused.stdout + refused.stderr
