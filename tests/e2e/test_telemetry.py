"""Request ids, JSON logs, traces and /metrics of a real server process over HTTP."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, PATIENCE, auth, new_account, new_principal, transfer
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRANSFERS = "POST /v1/transfers"
# How often the test scrapes: with two workers, both answer some of them.
SCRAPES = 8


def _env(**more: str) -> dict[str, str]:
    return {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, **more}


def _outcome(response: httpx.Response) -> str:
    if response.headers.get("content-type") == "application/problem+json":
        return str(response.json()["type"]).removeprefix("/problems/")
    return "replayed" if response.headers.get("idempotent-replayed") == "true" else "ok"


def _series(text: str, name: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, value = line.rsplit(" ", 1)
            found[labels] = float(value)
    return found


def test_metrics_count_every_workers_answers_whichever_worker_is_scraped(
    services: Services, migrated_url: str, tmp_path: Path
) -> None:
    with ServerProcess(
        migrated_url,
        services.redis_url,
        workers=2,
        env=_env(SETTLEMENT_METRICS_DIR=str(tmp_path)),
    ) as server:
        base = server.base_url
        key = new_principal(base)["api_key"]
        source, destination = new_account(base, key, 1000), new_account(base, key, 0)
        answers: list[httpx.Response] = []
        for _ in range(6):  # new operations, then a replay of each
            idem = uuid.uuid4().hex
            answers.append(transfer(base, key, idem, source, destination, 1))
            answers.append(transfer(base, key, idem, source, destination, 1))
            answers.append(transfer(base, key, idem, source, destination, 2))  # 422
        shared = uuid.uuid4().hex  # one key at once from many clients: 201, 409s, replays
        with ThreadPoolExecutor(8) as pool:
            answers += pool.map(
                lambda _: transfer(base, key, shared, source, destination, 1), range(8)
            )
        expected = Counter((f"{r.status_code // 100}xx", _outcome(r)) for r in answers)
        assert expected[("2xx", "ok")] == 7 and expected[("4xx", "fingerprint-mismatch")] == 6
        scrapes = [
            httpx.get(f"{base}/metrics", headers=auth(ADMIN_KEY)).text for _ in range(SCRAPES)
        ]
        writers = _worker_pids(tmp_path)
    assert len(writers) == 2, writers  # both workers write their figures there
    for text in scrapes:
        requests = _series(text, "settlement_http_requests_total")
        counted = Counter[tuple[str, str]]()
        for labels, value in requests.items():
            if f'route="{TRANSFERS}"' in labels:
                status_class = re.search(r'status_class="(\w+)"', labels)
                outcome = re.search(r'outcome="([\w-]+)"', labels)
                assert status_class and outcome
                counted[(status_class[1], outcome[1])] += int(value)
        assert counted == expected
        assert sum(counted.values()) == len(answers)
        replays = _series(text, "settlement_http_replays_total")
        assert (
            replays[f'settlement_http_replays_total{{route="{TRANSFERS}"}}']
            == expected[("2xx", "replayed")]
        )
        problems = _series(text, "settlement_http_problems_total")
        mismatch = 'settlement_http_problems_total{slug="fingerprint-mismatch",status="422"}'
        assert problems[mismatch] == 6
        busy = 'settlement_http_problems_total{slug="operation-in-progress",status="409"}'
        assert problems.get(busy, 0) == expected[("4xx", "operation-in-progress")]
        durations = _series(text, "settlement_http_request_duration_seconds_count")
        assert sum(v for k, v in durations.items() if TRANSFERS in k) == len(answers)
        claims = _series(text, "settlement_claims_total")
        assert claims['settlement_claims_total{kind="new"}'] == 7 + 2  # and the two accounts
        # each new operation was claimed, run and settled in one statement, with no lease;
        # the concurrent duplicates waited for its commit and replayed it
        leases = _series(text, "settlement_leases_acquired_total")
        assert leases.get("settlement_leases_acquired_total", 0) == 0


def _worker_pids(shared: Path) -> set[int]:
    """The processes that write figures into a server's metrics directory: its workers
    (prometheus_client names each file after its process)."""
    return {int(path.stem.rsplit("_", 1)[1]) for path in shared.glob("counter_*.db")}


def _wait_for_workers(shared: Path, count: int) -> set[int]:
    deadline = time.monotonic() + PATIENCE
    while len(pids := _worker_pids(shared)) < count:
        assert time.monotonic() < deadline, pids
        time.sleep(0.05)
    return pids


def _transfers_counted(shared: Path, pid: int, scratch: Path) -> float:
    """The transfers one worker has counted: its own files, summed alone."""
    scratch.mkdir()
    for path in shared.glob(f"*_{pid}.db"):
        shutil.copy(path, scratch / path.name)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(scratch))
    return sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "settlement_http_requests_total" and sample.labels["route"] == TRANSFERS
    )


def _kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, f"worker {pid} still runs"
        time.sleep(0.05)


def _scrape(base: str) -> str:
    """/metrics, from whichever worker answers (a killed one's connection is retried)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return httpx.get(f"{base}/metrics", headers=auth(ADMIN_KEY)).raise_for_status().text
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def _transfers_in(text: str) -> float:
    requests = _series(text, "settlement_http_requests_total")
    return sum(v for labels, v in requests.items() if f'route="{TRANSFERS}"' in labels)


def test_a_sigkilled_workers_counts_stay_in_the_totals(
    services: Services, migrated_url: str, tmp_path: Path
) -> None:
    shared = tmp_path / "metrics"
    with ServerProcess(
        migrated_url,
        services.redis_url,
        workers=2,
        env=_env(SETTLEMENT_METRICS_DIR=str(shared)),
    ) as server:
        base = server.base_url
        key = new_principal(base)["api_key"]
        source, destination = new_account(base, key, 1000), new_account(base, key, 0)
        sent = 12
        for _ in range(sent):
            assert transfer(base, key, uuid.uuid4().hex, source, destination, 1).status_code == 201
        workers = _wait_for_workers(shared, 2)
        counted = {pid: _transfers_counted(shared, pid, tmp_path / str(pid)) for pid in workers}
        assert sum(counted.values()) == sent, counted
        victim = max(counted, key=lambda pid: counted[pid])  # it answered some of them
        _kill_and_wait(victim)
        assert _transfers_in(_scrape(base)) == sent
        assert transfer(base, key, uuid.uuid4().hex, source, destination, 1).status_code == 201
        assert _transfers_in(_scrape(base)) == sent + 1


def test_the_metrics_directory_is_gone_after_the_server_stops(
    services: Services, migrated_url: str
) -> None:
    server = ServerProcess(migrated_url, services.redis_url, workers=2, env=_env())
    with server:
        assert server.proc is not None
        [shared] = Path(tempfile.gettempdir()).glob(f"settlement-metrics-{server.proc.pid}-*")
        first, _ = sorted(_wait_for_workers(shared, 2))
        _kill_and_wait(first)  # a worker killed leaves its files; the server removes them
        assert _scrape(server.base_url)
    assert not shared.exists()


def test_every_answer_carries_a_request_id(server_with_logs: ServerProcess) -> None:
    base = server_with_logs.base_url
    key = new_principal(base)["api_key"]
    account = new_account(base, key, 10)
    ok = httpx.get(f"{base}/v1/accounts/{account}", headers=auth(key))
    problem = httpx.get(f"{base}/v1/accounts/{account}")  # 401
    missing = httpx.get(f"{base}/v1/nothing-here")
    health = httpx.get(f"{base}/health")
    assert (ok.status_code, problem.status_code, missing.status_code) == (200, 401, 404)
    ids = [r.headers.get("request-id") for r in (ok, problem, missing, health)]
    assert all(i and re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids
    assert len(set(ids)) == 4


def test_a_valid_traceparent_gives_the_request_id(server_with_logs: ServerProcess) -> None:
    base = server_with_logs.base_url
    traced = httpx.get(f"{base}/health", headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    invalid = httpx.get(f"{base}/health", headers={"traceparent": f"00-{TRACE}-bad-01"})
    assert traced.headers["request-id"] == TRACE
    assert invalid.headers["request-id"] != TRACE


def test_a_sane_request_id_is_kept_and_a_hostile_one_replaced(
    server_with_logs: ServerProcess,
) -> None:
    base = server_with_logs.base_url
    kept = httpx.get(f"{base}/health", headers={"Request-Id": "client-req-42"})
    assert kept.headers["request-id"] == "client-req-42"
    for hostile in ("x" * 129, "a\tb", "a b", '"><script>', "caf\u00e9"):
        answer = httpx.get(f"{base}/health", headers={"Request-Id": hostile.encode()})
        replaced = answer.headers["request-id"]
        assert replaced != hostile and re.fullmatch(r"[0-9a-f]{32}", replaced), hostile


def test_log_lines_are_json_with_the_request_fields(server_with_logs: ServerProcess) -> None:
    base = server_with_logs.base_url
    key = new_principal(base)["api_key"]
    source, destination = new_account(base, key, 100), new_account(base, key, 0)
    made = transfer(base, key, uuid.uuid4().hex, source, destination, 5)
    assert made.status_code == 201
    request_id, operation_id = made.headers["request-id"], made.headers["operation-id"]
    lines = [line for line in server_with_logs.output().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    for entry in parsed:
        assert datetime.fromisoformat(entry["ts"]).utcoffset() is not None
        assert {"level", "logger", "msg"} <= entry.keys()
        assert "color_message" not in entry
    access = [e for e in parsed if e["logger"] == "settlement.access"]
    mine = [e for e in access if e.get("request_id") == request_id]
    assert len(mine) == 1, access[-3:]
    assert mine[0]["operation_id"] == operation_id and mine[0]["attempt"] == 1
    assert mine[0]["route"] == TRANSFERS and mine[0]["status"] == 201


def test_the_request_span_joins_the_callers_trace_with_its_tracestate(
    services: Services, migrated_url: str
) -> None:
    # an armed claim failpoint puts the new transfer on the locked path (claimed under the
    # scope's lease, then settled under the row's lock), so every stage has its span; a new
    # local operation's one statement takes no lease
    env = _env(
        SETTLEMENT_OTEL_EXPORTER="console",
        SETTLEMENT_ENABLE_FAILPOINTS="1",
        SETTLEMENT_FAILPOINTS="claim.after=sleep:0",
    )
    server = ServerProcess(migrated_url, services.redis_url, env=env)
    with server:
        traced = httpx.get(
            f"{server.base_url}/livez",
            headers={
                "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01",
                "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
            },
        )
        assert traced.headers["request-id"] == TRACE
        server.stop()  # the span processor flushes at exit
        output = server.output()
    assert f'"trace_id": "0x{TRACE}"' in output
    assert '"parent_id": "0x00f067aa0ba902b7"' in output
    state = "['{key=congo, value=t61rcWkgMzE}', '{key=rojo, value=00f067aa0ba902b7}']"
    assert f'"trace_state": "{state}"' in output


def test_console_exporter_prints_the_stages_of_a_retried_transfer(
    services: Services, migrated_url: str
) -> None:
    # an armed claim failpoint puts the new transfer on the locked path (claimed under the
    # scope's lease, then settled under the row's lock), so every stage has its span; a new
    # local operation's one statement takes no lease
    env = _env(
        SETTLEMENT_OTEL_EXPORTER="console",
        SETTLEMENT_ENABLE_FAILPOINTS="1",
        SETTLEMENT_FAILPOINTS="claim.after=sleep:0",
    )
    server = ServerProcess(migrated_url, services.redis_url, env=env)
    with server:
        base = server.base_url
        key = new_principal(base)["api_key"]
        source, destination = new_account(base, key, 100), new_account(base, key, 0)
        idem = uuid.uuid4().hex
        first = transfer(base, key, idem, source, destination, 5)
        again = transfer(base, key, idem, source, destination, 5)
        assert again.headers["idempotent-replayed"] == "true"
        server.stop()  # the span processor flushes at exit
        output = server.output()
    operation_id = first.headers["operation-id"]
    for name in ("settlement.lease", "settlement.claim", "settlement.effect", "settlement.settle"):
        assert f'"name": "{name}"' in output, name
    # the lease's commands are Redis client spans: its SET NX PX, its release script
    for name in ("SET", "EVALSHA"):
        assert f'"name": "{name}"' in output, name
    assert '"db.system": "redis"' in output
    assert f'"name": "{TRANSFERS}"' in output
    assert f'"operation.id": "{operation_id}"' in output
    assert '"settlement.stage": "C"' in output and '"settlement.disposition": "applied"' in output
    assert '"replayed": true' in output
    assert first.headers["request-id"] in output  # the request span's trace id


@pytest.fixture(scope="module")
def server_with_logs(services: Services, migrated_url: str) -> Iterator[ServerProcess]:
    with ServerProcess(
        migrated_url, services.redis_url, env=_env(SETTLEMENT_ACCESS_LOG="1")
    ) as server:
        yield server
