"""Metrics: OpenTelemetry instruments per process, summed over the server's workers at scrape.

**In a process.** Counters and the gauge are OpenTelemetry asynchronous instruments
(``ObservableCounter``, ``ObservableGauge``) of this process's ``MeterProvider``; what they
report is a tally that the hooks below add to (a dict increment, about 1.5 us). The SDK's
synchronous instruments were measured at 11 us per ``Counter.add`` with attributes and 17 us
per ``Histogram.record`` here, about 30 us per request: a quarter of a bare request's CPU.
Histograms have no asynchronous instrument in OpenTelemetry, so they are tallied here (sum,
count, explicit buckets :data:`LATENCY_BUCKETS`) and rendered beside what the SDK collects;
with ``SETTLEMENT_OTEL_EXPORTER=otlp`` the counters and the gauge are also pushed with the
OTLP exporter, the histograms are not.

**Across workers.** A server with several uvicorn workers answers ``GET /metrics`` from
whichever worker the kernel hands the connection, so one process's figures are not the
server's. ``settlement serve`` makes one directory per server (``SETTLEMENT_METRICS_DIR``, a
fresh temporary one unless set) and every worker writes its cumulative snapshot there as
``<pid>.snapshot`` (msgpack, written under a temporary name then renamed, so no reader sees
half a file): every :data:`FLUSH_INTERVAL` seconds when something was recorded since, else
it only touches the file to say "still current". A scrape takes its own process's figures
live and, for every other worker still alive, waits until that worker's file is newer than
the scrape's start (at most :data:`FRESH_WAIT` seconds): every request answered before the
scrape began is counted, whichever worker answers. A dead worker's last file keeps counting
(its counters are part of the server's totals; what it recorded after its last flush is
lost). Counters and histograms are summed; the gauge is the newest snapshot's value.

Why not the alternatives: prometheus_client's multiprocess mode would bypass the
OpenTelemetry instruments (and the OTLP export with them); pushing every increment to Redis
would put a round trip to a liveness store on every request and lose metrics whenever Redis
is down. The cost here: per worker one snapshot (collect, encode, write: about 0.2 ms) at
most twice a second while busy, a ``utime`` otherwise, and a scrape that waits up to one
flush interval for the other workers.

Without a directory (tests, ``settlement sweep``, an observer process) the figures are the
process's own.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, MetricReader, Sum
from opentelemetry.sdk.resources import Resource

__all__ = ["FLUSH_INTERVAL", "FRESH_WAIT", "Metrics"]

log = logging.getLogger("settlement.telemetry")

# How often a busy worker writes its snapshot: the longest a scrape waits for another worker.
FLUSH_INTERVAL = 0.5
# A scrape never waits longer than this for a worker's snapshot (one stuck on a long CPU
# burst): past it, that worker's last snapshot is used.
FRESH_WAIT = 2.0
# How often a waiting scrape looks at the other workers' files again.
_POLL = 0.02
_SUFFIX = ".snapshot"

# Request and settlement latencies, in seconds: a replay is a few ms, a provider call up to
# the provider timeout (2 s) plus settlement.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class _Declared:
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()


# name -> what it is. The Prometheus names are these, unchanged.
DECLARED: dict[str, _Declared] = {
    "settlement_http_requests_total": _Declared(
        "counter",
        "HTTP requests answered, by route (method and path template; unmatched: no route), "
        "status class and outcome (ok, replayed, or the problem slug).",
        ("route", "status_class", "outcome"),
    ),
    "settlement_http_replays_total": _Declared(
        "counter", "Idempotent requests answered by replaying a stored outcome.", ("route",)
    ),
    "settlement_http_problems_total": _Declared(
        "counter",
        "Problem documents answered (409, 422, 503, 504, ...), by status and slug.",
        ("status", "slug"),
    ),
    "settlement_http_request_duration_seconds": _Declared(
        "histogram",
        "Time to answer an HTTP request, by route and status class.",
        ("route", "status_class"),
    ),
    "settlement_attempt_duration_seconds": _Declared(
        "histogram",
        "Time from an attempt's claim to its settled answer (effect and settlement), by route.",
        ("route",),
    ),
    "settlement_settle_duration_seconds": _Declared(
        "histogram", "Time of one settlement transaction, by observation source.", ("source",)
    ),
    "settlement_observations_total": _Declared(
        "counter",
        "Observations settled, by source, deciding stage (A, B, C) and disposition.",
        ("source", "stage", "disposition"),
    ),
    "settlement_conflicts_total": _Declared(
        "counter", "Operations that entered or grew a conflict (alert on any increase)."
    ),
    "settlement_claims_total": _Declared(
        "counter", "Claims of operations for a new attempt, by kind.", ("kind",)
    ),
    "settlement_terminal_total": _Declared(
        "counter", "Operations that became terminal (completed, failed, conflict)."
    ),
    "settlement_leases_acquired_total": _Declared("counter", "Redis leases taken."),
    "settlement_leases_lost_total": _Declared(
        "counter", "Leases lost while their attempt ran (expired, taken, or Redis unreachable)."
    ),
    "settlement_lease_heartbeat_failures_total": _Declared(
        "counter", "Lease extends that failed and were retried."
    ),
    "settlement_sweeper_demotions_total": _Declared(
        "counter", "In-progress operations demoted by the sweeper."
    ),
    "settlement_late_responses_total": _Declared(
        "counter", "Provider answers settled after their attempt gave up."
    ),
    "settlement_stale_epoch_outcomes_total": _Declared(
        "counter", "Verified terminal outcomes of a superseded epoch (possible duplicate effect)."
    ),
    "settlement_purged_operations_total": _Declared(
        "counter", "Expired terminal operations moved to tombstones."
    ),
    "settlement_forgotten_tombstones_total": _Declared(
        "counter", "Tombstones deleted after their retention."
    ),
    "settlement_forgotten_feed_rows_total": _Declared(
        "counter", "Final feed receipts out of every page's reach, and feed alarms, deleted."
    ),
    "settlement_oldest_open_operation_age_seconds": _Declared(
        "gauge",
        "Age of the oldest in_progress, unknown or conflict operation (0: none), as of the "
        "latest purge pass of any worker.",
    ),
}


_NOT_A_GAUGE = _Declared("counter", "")
_STATUS_CLASS = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}
_Labels = tuple[tuple[str, str], ...]


class _Series(msgspec.Struct, array_like=True, frozen=True):
    """One series of a snapshot: a counter's or gauge's value, or a histogram's sum, count
    and per-bucket counts."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    count: int = 0
    buckets: tuple[int, ...] = ()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[_Series])


class Metrics:
    """This process's instruments, and the hooks the rest of the service calls."""

    def __init__(self, shared_dir: str | None = None, *, export: str = "none") -> None:
        """``shared_dir``: the server's snapshot directory (see the module docstring).
        ``export``: ``otlp`` also pushes this process's counters and gauge with the OTLP
        exporter."""
        # the tallies behind the instruments: series labels (sorted pairs) -> value, and for
        # a histogram [sum, count, per-bucket counts...]
        self._counts: dict[str, dict[_Labels, float]] = {}
        self._gauges: dict[str, float] = {}
        self._histograms: dict[str, dict[_Labels, list[float]]] = {}
        self._reader = InMemoryMetricReader()
        readers: list[MetricReader] = [self._reader]
        if export == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        self._provider = MeterProvider(
            metric_readers=readers,
            resource=Resource.create(
                {"service.name": "settlement", "service.instance.id": str(os.getpid())}
            ),
            shutdown_on_exit=False,
            exemplar_filter=AlwaysOffExemplarFilter(),
        )
        meter = self._provider.get_meter("settlement")
        for name, declared in DECLARED.items():
            if declared.kind == "counter":
                self._counts[name] = {}
                meter.create_observable_counter(
                    name, callbacks=[self._observe_counter(name)], description=declared.help
                )
            elif declared.kind == "gauge":
                meter.create_observable_gauge(
                    name, callbacks=[self._observe_gauge(name)], description=declared.help
                )
            else:
                self._histograms[name] = {}
        self._dir = Path(shared_dir) if shared_dir else None
        self._pid = os.getpid()
        self._dirty = True

    def _observe_counter(self, name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            return [Observation(v, dict(k)) for k, v in list(self._counts[name].items())]

        return observe

    def _observe_gauge(self, name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            value = self._gauges.get(name)
            return [] if value is None else [Observation(value)]

        return observe

    # -- recording ----------------------------------------------------------------------------

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._add(name, tuple(sorted(labels.items())), amount)

    def _add(self, name: str, labels: _Labels, amount: float = 1.0) -> None:
        series = self._counts.get(name)
        if series is None:
            raise KeyError(f"undeclared metric {name}")
        series[labels] = series.get(labels, 0.0) + amount
        self._dirty = True

    def set(self, name: str, value: float) -> None:
        if DECLARED.get(name, _NOT_A_GAUGE).kind != "gauge":
            raise KeyError(f"undeclared gauge {name}")
        self._gauges[name] = value
        self._dirty = True

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        self._record(name, tuple(sorted(labels.items())), seconds)

    def _record(self, name: str, labels: _Labels, seconds: float) -> None:
        series = self._histograms.get(name)
        if series is None:
            raise KeyError(f"undeclared histogram {name}")
        tally = series.get(labels)
        if tally is None:
            tally = series[labels] = [0.0] * (len(LATENCY_BUCKETS) + 3)
        tally[0] += seconds
        tally[1] += 1
        tally[2 + bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self._dirty = True

    # -- hooks --------------------------------------------------------------------------------

    def on_request(
        self, route: str, status: int, problem: str | None, replayed: bool, seconds: float
    ) -> None:
        """One HTTP answer (the request middleware). Label tuples are built in sorted order
        here: this runs on every request."""
        status_class = _STATUS_CLASS.get(status // 100, "other")
        outcome = problem or ("replayed" if replayed else "ok" if status < 400 else "error")
        self._add(
            "settlement_http_requests_total",
            (("outcome", outcome), ("route", route), ("status_class", status_class)),
        )
        if replayed:
            self._add("settlement_http_replays_total", (("route", route),))
        if problem is not None:
            self._add(
                "settlement_http_problems_total", (("slug", problem), ("status", str(status)))
            )
        self._record(
            "settlement_http_request_duration_seconds",
            (("route", route), ("status_class", status_class)),
            seconds,
        )

    def on_settled(
        self, source: str, stage: str, disposition: str, seconds: float | None = None
    ) -> None:
        self.inc(
            "settlement_observations_total", source=source, stage=stage, disposition=disposition
        )
        if disposition == "conflict":
            self.inc("settlement_conflicts_total")
        if seconds is not None:
            self.observe("settlement_settle_duration_seconds", seconds, source=source)

    def on_stale_epoch_outcome(self) -> None:
        self.inc("settlement_stale_epoch_outcomes_total")

    def on_claimed(self, kind: str) -> None:
        self.inc("settlement_claims_total", kind=kind)

    def on_progress_ended(self, operation_id: str, terminal: bool) -> None:
        if terminal:
            self.inc("settlement_terminal_total")

    def on_lease(self, event: str) -> None:
        """A lease event: ``acquired``, ``lost`` or ``heartbeat_failed``."""
        match event:
            case "acquired":
                self.inc("settlement_leases_acquired_total")
            case "lost":
                self.inc("settlement_leases_lost_total")
            case "heartbeat_failed":
                self.inc("settlement_lease_heartbeat_failures_total")

    def on_attempt(self, route: str, seconds: float) -> None:
        self.observe("settlement_attempt_duration_seconds", seconds, route=route)

    # -- reading ------------------------------------------------------------------------------

    def snapshot(self) -> list[_Series]:
        """This process's cumulative figures: counters and the gauge as OpenTelemetry
        collects them, histograms from their tallies."""
        out: list[_Series] = []
        data = self._reader.get_metrics_data()
        if data is not None:
            for resource in data.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        out.extend(_series_of(metric.name, metric.data))
        for name, series in self._histograms.items():
            for labels, tally in list(series.items()):
                buckets = tuple(int(n) for n in tally[2:])
                out.append(_Series(name, labels, tally[0], int(tally[1]), buckets))
        return out

    def value(self, name: str, **labels: str) -> float:
        """This process's figure of one series (a histogram's: its count)."""
        wanted = tuple(sorted(labels.items()))
        for series in self.snapshot():
            if series.name == name and series.labels == wanted:
                return float(series.count) if series.buckets else series.value
        return 0.0

    def render(self) -> str:
        """The server's figures as Prometheus text, from the snapshots as they are now."""
        return _render(_merge([*self._others(), self.snapshot()]))

    async def scrape(self) -> str:
        """The server's figures, once every live worker has written a snapshot newer than
        this call (at most :data:`FRESH_WAIT`): whatever was answered before counts."""
        if self._dir is not None:
            started = time.time()
            deadline = time.monotonic() + FRESH_WAIT
            # other processes' files: nothing to wait on but their modification times
            while time.monotonic() < deadline and self._stale_workers(started):  # noqa: ASYNC110
                await asyncio.sleep(_POLL)
        return self.render()

    # -- the shared directory -----------------------------------------------------------------

    def flush(self) -> None:
        """Write this process's snapshot (or, with nothing new, touch it)."""
        if self._dir is None:
            return
        path = self._dir / f"{self._pid}{_SUFFIX}"
        if not self._dirty and path.exists():
            os.utime(path)
            return
        self._dirty = False
        temporary = self._dir / f".{self._pid}.tmp"
        temporary.write_bytes(_encoder.encode(self.snapshot()))
        os.replace(temporary, path)

    async def run(self) -> None:
        """Flush every :data:`FLUSH_INTERVAL` seconds until cancelled (then once more)."""
        if self._dir is None:
            return
        try:
            while True:
                try:
                    self.flush()
                except OSError as exc:
                    log.warning("metrics snapshot not written", extra={"error": repr(exc)})
                await asyncio.sleep(FLUSH_INTERVAL)
        finally:
            with contextlib.suppress(OSError):
                self.flush()

    def _files(self) -> list[tuple[int, Path]]:
        assert self._dir is not None
        found = []
        for path in self._dir.glob(f"*{_SUFFIX}"):
            with contextlib.suppress(ValueError):
                pid = int(path.name.removesuffix(_SUFFIX))
                if pid != self._pid:
                    found.append((pid, path))
        return found

    def _stale_workers(self, since: float) -> bool:
        for pid, path in self._files():
            try:
                stale = path.stat().st_mtime < since
            except FileNotFoundError:
                continue
            if stale and _alive(pid):
                return True
        return False

    def _others(self) -> list[list[_Series]]:
        """The other workers' snapshots, oldest first."""
        if self._dir is None:
            return []
        read: list[tuple[float, list[_Series]]] = []
        for _pid, path in self._files():
            try:
                written = path.stat().st_mtime
                read.append((written, _decoder.decode(path.read_bytes())))
            except (OSError, msgspec.DecodeError) as exc:
                log.warning(
                    "metrics snapshot unreadable", extra={"path": str(path), "error": repr(exc)}
                )
        return [series for _, series in sorted(read, key=lambda item: item[0])]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _series_of(name: str, data: Any) -> list[_Series]:
    out = []
    if isinstance(data, Sum | Gauge):
        for point in data.data_points:
            labels = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
            out.append(_Series(name, labels, float(point.value)))
    return out


def _merge(snapshots: list[list[_Series]]) -> dict[str, dict[tuple[tuple[str, str], ...], _Series]]:
    """Sum counters and histograms over ``snapshots``; a gauge keeps the last one's value
    (they come oldest first)."""
    merged: dict[str, dict[tuple[tuple[str, str], ...], _Series]] = {}
    for snapshot in snapshots:
        for series in snapshot:
            declared = DECLARED.get(series.name)
            if declared is None:
                continue
            by_labels = merged.setdefault(series.name, {})
            seen = by_labels.get(series.labels)
            if seen is None or declared.kind == "gauge":
                by_labels[series.labels] = series
            elif declared.kind == "histogram":
                by_labels[series.labels] = _Series(
                    series.name,
                    series.labels,
                    seen.value + series.value,
                    seen.count + series.count,
                    tuple(a + b for a, b in zip(seen.buckets, series.buckets, strict=True)),
                )
            else:
                by_labels[series.labels] = _Series(
                    series.name, series.labels, seen.value + series.value
                )
    return merged


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: tuple[tuple[str, str], ...], *extra: tuple[str, str]) -> str:
    pairs = labels + extra
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _render(merged: dict[str, dict[tuple[tuple[str, str], ...], _Series]]) -> str:
    lines: list[str] = []
    for name, declared in DECLARED.items():
        lines.append(f"# HELP {name} {declared.help}")
        lines.append(f"# TYPE {name} {declared.kind}")
        series = merged.get(name, {})
        if not series and not declared.labels:
            if declared.kind != "histogram":
                lines.append(f"{name} 0")
            continue
        for labels, one in sorted(series.items()):
            if declared.kind != "histogram":
                lines.append(f"{name}{_labels(labels)} {_number(one.value)}")
                continue
            cumulative = 0
            for bound, count in zip((*LATENCY_BUCKETS, None), one.buckets, strict=False):
                cumulative += count
                le = "+Inf" if bound is None else _number(bound)
                lines.append(f"{name}_bucket{_labels(labels, ('le', le))} {cumulative}")
            lines.append(f"{name}_sum{_labels(labels)} {_number(one.value)}")
            lines.append(f"{name}_count{_labels(labels)} {one.count}")
    return "\n".join(lines) + "\n"
