"""The alert rules and the dashboard, checked by a real Prometheus: ``promtool`` checks the
rules and runs their unit tests (deploy/prometheus/rules_test.yml); then Prometheus, with the
example configuration (deploy/prometheus/prometheus.yml) pointed at a real server of two
workers, scrapes it under a short load (transfers, a refused one and its replay, a replay, a
fingerprint mismatch, a payout the provider declined and its replay), and every expression
returns data: each dashboard panel's, each recording rule's (its recorded series), and each
alert's measured side (the expression left of its threshold: a healthy server fires none of
them, which is checked too). Both stored refusals count twice by their slug.

Prometheus and promtool are Debian's ``prometheus`` package (``.ci/run`` installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import Services
from tests.e2e.client import (
    ADMIN_KEY,
    PATIENCE,
    auth,
    execute,
    new_account,
    new_principal,
    transfer,
)
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess, free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "settlement.json"
INSTALL = (
    "prometheus and promtool are not installed: apt-get install prometheus "
    "(Debian's package; .ci/run installs it)"
)
# Prometheus scrapes and evaluates the rules this often here, so two samples (what rate()
# needs) are there within seconds.
INTERVAL = "500ms"
# An alert's condition: the measured expression, a comparison, a number.
THRESHOLD = re.compile(r"(?s)(.*\S)\s*(?:>=|<=|==|!=|>|<)\s*[0-9.]+\s*")


def binaries() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.fail(INSTALL, pytrace=False)
    return prometheus, promtool


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((RULES / "rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def panel_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    _, promtool = binaries()
    for command in (["check", "rules", "rules.yml"], ["test", "rules", "rules_test.yml"]):
        done = subprocess.run(
            [promtool, *command], cwd=RULES, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


class Prometheus:
    """A Prometheus of its own (a temporary directory, a free port) that scrapes ``target``
    with the example configuration and evaluates rules.yml."""

    def __init__(self, binary: str, home: Path, target: str, key: str) -> None:
        config = yaml.safe_load((RULES / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL}
        (job,) = config["scrape_configs"]
        (home / "key").write_text(key)
        job["authorization"]["credentials_file"] = str(home / "key")
        job["static_configs"] = [{"targets": [target]}]
        shutil.copy(RULES / "rules.yml", home / "rules.yml")
        (home / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (home / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._home = home

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (raises on a bad expression)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets_up(self) -> bool:
        try:
            answer = httpx.get(f"{self.url}/api/v1/targets", timeout=5)
        except httpx.TransportError:  # not listening yet
            return False
        if answer.status_code != 200:  # 503 in plain text until its storage is ready
            return False
        active = answer.json()["data"]["activeTargets"]
        return bool(active) and all(target["health"] == "up" for target in active)

    def log(self) -> str:
        return (self._home / "prometheus.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def prometheus_binary() -> str:
    return binaries()[0]


@pytest.fixture
def loaded_server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    """A server of two workers under a short load (a declined payout among it), with a
    feed's checkpoint and receipts (what the feed panels show), its background figures read
    often."""
    execute(
        app_database,
        "INSERT INTO feed_checkpoints (name, kind, caught_up_at) VALUES ('payments', 'cursor', "
        "now()) ON CONFLICT (name) DO UPDATE SET caught_up_at = now()",
    )
    execute(
        app_database,
        "INSERT INTO feed_receipts (feed, event_id, event_order, operation_id, state, reason, "
        "first_seen_at, decided_at) VALUES ('payments', :event, 1, gen_random_uuid(), 'held', "
        "'bad-signature', now(), now())",
        event=f"held-{uuid.uuid4().hex[:8]}",
    )
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_FEED_FIGURES_INTERVAL": "0.2",
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
    }
    with ServerProcess(app_database, services.redis_url, env=env, workers=2) as server:
        base = server.base_url
        key = new_principal(base)["api_key"]
        source, destination = new_account(base, key, 100), new_account(base, key, 0)
        for amount in (10, 20, 30):
            assert transfer(base, key, uuid.uuid4().hex, source, destination, amount).is_success
        replayed = uuid.uuid4().hex
        for _ in range(2):  # a transfer and its replay
            assert transfer(base, key, replayed, source, destination, 5).status_code == 201
        assert transfer(base, key, replayed, source, destination, 6).status_code == 422
        refused = uuid.uuid4().hex
        for _ in range(2):  # a business refusal, stored, and its replay
            answer = transfer(base, key, refused, source, destination, 1_000)
            assert answer.status_code == 402, answer.text
        provider.arm("decline")
        declined = uuid.uuid4().hex
        for _ in range(2):  # a payout the provider declined, stored, and its replay
            answer = httpx.post(
                f"{base}/v1/payouts",
                json={"beneficiary": "ACME Supplies", "amount": 500, "currency": "EUR"},
                headers={**auth(key), "Idempotency-Key": declined},
                timeout=30,
            )
            assert answer.status_code == 402, answer.text
        yield server


def poll(prometheus: Prometheus, expr: str, *, deadline: float) -> list[dict[str, Any]]:
    """``expr``'s samples once it has some (a rate needs two scrapes, a recorded series
    one evaluation after them); [] at the deadline."""
    while not (found := prometheus.query(expr)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def test_every_panel_and_rule_expression_has_data_from_a_real_server(
    prometheus_binary: str, loaded_server: ServerProcess, tmp_path: Path
) -> None:
    target = loaded_server.base_url.removeprefix("http://")
    prometheus = Prometheus(prometheus_binary, tmp_path, target, ADMIN_KEY)
    try:
        deadline = time.monotonic() + PATIENCE
        while not prometheus.targets_up():
            assert time.monotonic() < deadline, "the server was never scraped\n" + (
                prometheus.log()
            )
            time.sleep(0.2)
        deadline = time.monotonic() + PATIENCE
        wanted: dict[str, str] = {}  # expression -> where it comes from
        for expr in panel_expressions():
            wanted[expr] = "dashboard panel"
        alerts = []
        for rule in rules():
            if "record" in rule:
                wanted[rule["record"]] = "recorded series"
                wanted[rule["expr"]] = f"recording rule {rule['record']}"
            else:
                measured = THRESHOLD.fullmatch(rule["expr"])
                assert measured is not None, f"{rule['alert']}: no threshold in {rule['expr']}"
                wanted[measured[1]] = f"alert {rule['alert']}, left of its threshold"
                alerts.append(rule)
        empty = [
            f"{where}: {expr}"
            for expr, where in wanted.items()
            if not poll(prometheus, expr, deadline=deadline)
        ]
        assert not empty, "no data:\n" + "\n".join(empty)
        for slug in ("insufficient-funds", "payout-declined"):  # each refusal and its replay
            problems = prometheus.query(f'settlement_http_problems_total{{slug="{slug}"}}')
            assert [(p["metric"]["status"], float(p["value"][1])) for p in problems] == [
                ("402", 2.0)
            ], slug
        workers = prometheus.query('count(process_cpu_seconds_total{job="settlement"})')
        assert float(workers[0]["value"][1]) == 2.0  # each worker, by pid
        firing = {rule["alert"]: prometheus.query(rule["expr"]) for rule in alerts}
        assert not any(firing.values()), firing  # a healthy server fires none
    finally:
        prometheus.stop()
