"""The telemetry package without a server: request ids, traceparent, log lines, spans and
the metrics summed over several worker processes."""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import get_current_span

from service.config import ConfigError
from service.logs import JsonFormatter, TextFormatter
from service.telemetry import Metrics, annotate, span, tracing_enabled
from service.telemetry import context as request_context
from service.telemetry.metrics import LATENCY_BUCKETS
from service.telemetry.tracing import require_exporter

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-00f067aa0ba902b7-01".encode(), TRACE),
        (f"01-{TRACE}-00f067aa0ba902b7-01-future".encode(), TRACE),
        (f"00-{TRACE}-00f067aa0ba902b7-01-extra".encode(), None),  # version 00 has 4 fields
        (f"ff-{TRACE}-00f067aa0ba902b7-01".encode(), None),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01".encode(), None),
        (f"00-{TRACE}-{'0' * 16}-01".encode(), None),
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01".encode(), None),
        (b"garbage", None),
        (None, None),
    ],
)
def test_traceparent_gives_its_trace_id_only_when_valid(
    header: bytes | None, expected: str | None
) -> None:
    assert request_context.trace_id_of(header) == expected


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (b"req-42", True),
        (b"a.b:c/d+e=f@g_h", True),
        (b"x" * request_context.REQUEST_ID_MAX, True),
        (b"x" * (request_context.REQUEST_ID_MAX + 1), False),
        (b"", False),
        (b"a\tb", False),
        (b"a b", False),
        (b'"quoted"', False),
        (b"caf\xc3\xa9", False),
        (b"line\nbreak", False),
    ],
)
def test_incoming_request_id_is_kept_only_when_sane(value: bytes, kept: bool) -> None:
    assert (request_context.sane_request_id(value) is not None) == kept


def test_a_new_request_id_is_128_random_bits_in_hex() -> None:
    one, two = request_context.new_request_id(), request_context.new_request_id()
    assert len(one) == 32 and int(one, 16) >= 0 and one != two


def _record(msg: str = "hello", **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("settlement.test", logging.WARNING, __file__, 1, msg, (), None)
    record.__dict__.update(extra)
    return record


def test_json_log_line_has_iso_timestamp_and_the_request_fields() -> None:
    token = request_context.bind(request_context.RequestContext("req-1", TRACE))
    try:
        annotate(operation_id="op-1", attempt=2)
        line = JsonFormatter().format(_record(color_message="\x1b[1mhello\x1b[0m", why="x"))
    finally:
        request_context.unbind(token)
    out = json.loads(line)
    assert datetime.fromisoformat(out["ts"]).utcoffset() is not None
    assert out["level"] == "warning" and out["msg"] == "hello" and out["why"] == "x"
    assert out["request_id"] == "req-1" and out["trace_id"] == TRACE
    assert out["operation_id"] == "op-1" and out["attempt"] == 2
    assert "color_message" not in out


def test_explicit_extra_fields_win_over_the_request_context() -> None:
    token = request_context.bind(request_context.RequestContext("req-1"))
    try:
        annotate(operation_id="op-1")
        out = json.loads(JsonFormatter().format(_record(operation_id="op-2")))
        text = TextFormatter().format(_record())
    finally:
        request_context.unbind(token)
    assert out["operation_id"] == "op-2" and "trace_id" not in out
    assert "request_id=req-1" in text and "operation_id=op-1" in text


def test_outside_a_request_annotate_does_nothing() -> None:
    annotate(operation_id="op-1")
    assert request_context.log_fields() == {}
    assert "request_id" not in json.loads(JsonFormatter().format(_record()))


def test_span_is_a_shared_no_op_when_tracing_is_off() -> None:
    assert not tracing_enabled()
    with span("settlement.claim", operation_id="x") as one:
        one.set(attempt_number=1)
    assert span("a") is span("b")


def test_otlp_without_its_package_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_otlp(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry.exporter.otlp"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otlp)
    with pytest.raises(ConfigError, match="opentelemetry-exporter-otlp-proto-http"):
        require_exporter("otlp")
    require_exporter("console")
    require_exporter("none")


def _series_key(series: str) -> tuple[str, frozenset[str]]:
    """A series' name and its labels, in any order (the exposition's order is not ours)."""
    name, _, labels = series.partition("{")
    return name, frozenset(re.findall(r'\w+="(?:[^"\\]|\\.)*"', labels))


def _value(text: str, series: str) -> float:
    wanted = _series_key(series)
    for line in text.splitlines():
        if not line.startswith("#") and " " in line:
            name, value = line.rsplit(" ", 1)
            if _series_key(name) == wanted:
                return float(value)
    raise AssertionError(f"{series} not in\n{text}")


def test_requests_are_counted_by_route_status_class_and_outcome() -> None:
    metrics = Metrics()
    metrics.on_request("POST /v1/transfers", 201, None, False, 0.004)
    metrics.on_request("POST /v1/transfers", 201, None, True, 0.001)
    metrics.on_request("POST /v1/transfers", 409, "operation-in-progress", False, 0.002)
    metrics.on_request("unmatched", 404, "not-found", False, 0.0005)
    text = metrics.render()
    route = 'route="POST /v1/transfers"'
    assert (
        _value(text, f'settlement_http_requests_total{{outcome="ok",{route},status_class="2xx"}}')
        == 1
    )
    assert (
        _value(
            text, f'settlement_http_requests_total{{outcome="replayed",{route},status_class="2xx"}}'
        )
        == 1
    )
    assert _value(text, f"settlement_http_replays_total{{{route}}}") == 1
    problems = 'settlement_http_problems_total{slug="operation-in-progress",status="409"}'
    assert _value(text, problems) == 1
    histogram = "settlement_http_request_duration_seconds"
    assert _value(text, f'{histogram}_count{{{route},status_class="2xx"}}') == 2
    assert _value(text, f'{histogram}_bucket{{{route},status_class="2xx",le="0.001"}}') == 1
    assert _value(text, f'{histogram}_bucket{{{route},status_class="2xx",le="0.005"}}') == 2
    assert _value(text, f'{histogram}_bucket{{{route},status_class="2xx",le="+Inf"}}') == 2
    assert _value(text, "settlement_conflicts_total") == 0  # unlabelled counters show 0


def test_settlements_are_counted_by_source_stage_and_disposition() -> None:
    metrics = Metrics()
    metrics.on_settled("attempt", "C", "applied", 0.01)
    metrics.on_settled("evidence", "C", "conflict")
    text = metrics.render()
    assert (
        _value(
            text, 'settlement_observations_total{disposition="applied",source="attempt",stage="C"}'
        )
        == 1
    )
    assert _value(text, "settlement_conflicts_total") == 1
    assert _value(text, 'settlement_settle_duration_seconds_count{source="attempt"}') == 1
    assert metrics.value("settlement_conflicts_total") == 1


# A worker of a server: its own process, recording into the shared directory, then exiting.
_WORKER = """
import os
from service.telemetry import Metrics
metrics = Metrics(os.environ["PROMETHEUS_MULTIPROC_DIR"])
"""


def _worker(shared: Path, code: str) -> str:
    """Run ``code`` (with ``metrics``) in a new process that shares ``shared``; its stdout."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER + code], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_scrape_sums_every_workers_figures_an_exited_ones_too_and_the_latest_gauge(
    tmp_path: Path,
) -> None:
    _worker(
        tmp_path,
        "metrics.on_request('POST /v1/transfers', 201, None, False, 0.004)\n"
        "metrics.inc('settlement_claims_total', kind='new')\n"
        "metrics.set('settlement_oldest_open_operation_age_seconds', 7)\n",
    )
    text = _worker(
        tmp_path,
        "metrics.on_request('POST /v1/transfers', 201, None, False, 0.02)\n"
        "metrics.set('settlement_oldest_open_operation_age_seconds', 3)\n"
        "print(metrics.render())\n",
    )
    route = 'route="POST /v1/transfers"'
    assert (
        _value(text, f'settlement_http_requests_total{{outcome="ok",{route},status_class="2xx"}}')
        == 2
    )
    histogram = "settlement_http_request_duration_seconds"
    assert _value(text, f'{histogram}_count{{{route},status_class="2xx"}}') == 2
    assert _value(text, f'{histogram}_bucket{{{route},status_class="2xx",le="0.005"}}') == 1
    assert _value(text, f'{histogram}_bucket{{{route},status_class="2xx",le="0.025"}}') == 2
    assert _value(text, 'settlement_claims_total{kind="new"}') == 1
    assert _value(text, "settlement_oldest_open_operation_age_seconds") == 3  # the later one


def test_a_shared_directory_that_prometheus_client_does_not_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR"):
        Metrics(str(tmp_path))


def test_with_an_opentelemetry_reader_the_same_figures_reach_it() -> None:
    reader = InMemoryMetricReader()
    metrics = Metrics(otel_readers=[reader])
    metrics.on_request("POST /v1/transfers", 201, None, True, 0.004)
    metrics.on_settled("attempt", "C", "applied", 0.01)
    metrics.set("settlement_oldest_open_operation_age_seconds", 5)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    [requests] = points["settlement_http_requests_total"]
    assert dict(requests.attributes or {}) == {
        "outcome": "replayed",
        "route": "POST /v1/transfers",
        "status_class": "2xx",
    }
    assert requests.value == 1
    [duration] = points["settlement_http_request_duration_seconds"]
    assert duration.count == 1 and tuple(duration.explicit_bounds) == LATENCY_BUCKETS
    assert duration.bucket_counts[LATENCY_BUCKETS.index(0.005)] == 1
    [settled] = points["settlement_observations_total"]
    assert dict(settled.attributes or {}) == {
        "disposition": "applied",
        "source": "attempt",
        "stage": "C",
    }
    assert points["settlement_oldest_open_operation_age_seconds"][0].value == 5
    assert metrics.value("settlement_http_replays_total", route="POST /v1/transfers") == 1


def test_tracestate_travels_with_a_valid_traceparent() -> None:
    incoming = request_context.incoming_trace(
        f"00-{TRACE}-00f067aa0ba902b7-01".encode(),
        [b"congo=t61rcWkgMzE", b"rojo=00f067aa0ba902b7"],
    )
    assert incoming is not None and incoming.trace_id == TRACE
    parent = get_current_span(incoming.context).get_span_context()
    assert parent.span_id == 0x00F067AA0BA902B7 and parent.is_remote
    assert dict(parent.trace_state) == {"congo": "t61rcWkgMzE", "rojo": "00f067aa0ba902b7"}
    assert request_context.incoming_trace(b"garbage", [b"congo=t61rcWkgMzE"]) is None
