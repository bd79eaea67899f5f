"""Metrics: each declared once (:data:`DECLARED`), recorded through one facade into
prometheus_client and, with ``SETTLEMENT_OTEL_EXPORTER=otlp``, into OpenTelemetry too.

**Prometheus.** Every metric is a prometheus_client ``Counter``, ``Histogram`` or ``Gauge``;
``GET /metrics`` is prometheus_client's text exposition. A server with several uvicorn
workers answers a scrape from whichever worker the kernel hands the connection, so it uses
prometheus_client's multiprocess mode: ``settlement serve`` makes one directory per server
(``SETTLEMENT_METRICS_DIR``, a fresh temporary one unless set) and gives it to its workers as
``PROMETHEUS_MULTIPROC_DIR``. Each recording writes the new value into the worker's
memory-mapped files there; a scrape sums every file with ``MultiProcessCollector``, so
whatever any worker recorded before the scrape is in it, and nothing waits.

**Dead workers.** Counters and histograms are summed over every file in the directory, a
SIGKILLed worker's too: what it counted happened, and stays in the totals (it loses nothing:
each recording is already in its file). A new worker that is given a dead one's pid opens
the same files and counts on from their values, so a reused pid adds nothing twice. The
oldest-open-operation gauge uses ``multiprocess_mode="mostrecent"``: the value set last by any
worker, dead or alive (as of the latest purge pass of any worker); a dead worker's value gives
way to the next pass of a live one. The per-worker gauges (``per_worker``: the database pool's)
use ``liveall``: one series per worker, labelled ``pid``; a scrape drops those of a worker that
is gone (:mod:`service.telemetry.scrape`), which is the one file removed while the server
runs; ``settlement serve`` removes the directory at exit.

A scrape also shows figures made when it is scraped: ``settlement_build_info`` and each live
worker's ``process_*`` figures (:mod:`service.telemetry.scrape`).

prometheus_client chooses its mode once, when it is first imported in a process, from
``PROMETHEUS_MULTIPROC_DIR``; it is imported here only when the first :class:`Metrics` is
made, so ``settlement serve`` can set the variable first even with one worker in its own
process. Give a process one :class:`Metrics` in that mode: two would write the same file.

**OpenTelemetry.** With ``export="otlp"`` the same counters, histograms (the same bucket
bounds) and gauge are also OpenTelemetry SDK synchronous instruments of this process, pushed
by the OTLP exporter; the facade (:class:`_Instrument`) records both from one call.

**Cost per request** (``python -m bench.metrics_cost``: ``on_request``, a counter or three
and a histogram): about 5 us in multiprocess mode (a counter's ``inc`` is about 1 us, an
``mmap`` write; a histogram's ``observe`` two of them), about 2.5 us in one process; the
OpenTelemetry instruments add about 20 us, so they are made only to export.

Without a directory (tests, ``settlement sweep``, an observer process) the figures are the
process's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from service.config import ConfigError
from service.telemetry.scrape import build_info, recorded, worker_processes

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from prometheus_client import CollectorRegistry

__all__ = ["DECLARED", "LATENCY_BUCKETS", "MULTIPROC_VARIABLE", "Metrics"]

# prometheus_client's multiprocess directory variable (read when it is first imported)
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

# Request and settlement latencies, in seconds: a replay is a few ms, a provider call up to
# the provider timeout (2 s) plus settlement.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class _Declared:
    kind: Kind
    help: str
    # in alphabetical order: the order of the exposition in both modes
    labels: tuple[str, ...] = ()
    # a gauge of each worker's own (its pid a label, gone with the worker), not the latest
    per_worker: bool = False
    unit: str = "s"  # a gauge's, for OpenTelemetry


# name -> what it is. The Prometheus names are these (a counter's ends in _total).
DECLARED: dict[str, _Declared] = {
    "settlement_http_requests_total": _Declared(
        "counter",
        "HTTP requests answered, by route (method and path template; unmatched: no route), "
        "status class and outcome (ok, replayed, or the problem slug).",
        ("outcome", "route", "status_class"),
    ),
    "settlement_http_replays_total": _Declared(
        "counter", "Idempotent requests answered by replaying a stored outcome.", ("route",)
    ),
    "settlement_http_problems_total": _Declared(
        "counter",
        "Problem documents answered (409, 422, 503, 504, ...), by status and slug.",
        ("slug", "status"),
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
        ("disposition", "source", "stage"),
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
        "counter",
        "Final feed receipts out of every page's reach, feed alarms, and cursor feed "
        "promotions behind the purge's floor, deleted.",
    ),
    "settlement_forgotten_orphan_observations_total": _Declared(
        "counter", "Observations about an operation that was never here, deleted."
    ),
    "settlement_oldest_open_operation_age_seconds": _Declared(
        "gauge",
        "Age of the oldest in_progress, unknown or conflict operation (0: none), as of the "
        "latest purge pass of any worker.",
    ),
    "settlement_db_pool_connections_in_use": _Declared(
        "gauge",
        "Database connections of the worker's pool lent out now (requests, effects, reads).",
        per_worker=True,
        unit="{connection}",
    ),
    "settlement_db_pool_connections_max": _Declared(
        "gauge",
        "Database connections the worker's pool may lend at once (SETTLEMENT_DB_POOL_SIZE).",
        per_worker=True,
        unit="{connection}",
    ),
}

_STATUS_CLASS = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}
_Write = Callable[[float], None]
# the prometheus_client method that records a value of each kind
_WRITE: dict[Kind, str] = {"counter": "inc", "histogram": "observe", "gauge": "set"}


class _Instrument:
    """One declared metric: its prometheus_client metric and, when exporting, its
    OpenTelemetry instrument. :meth:`record` is the one place a value is recorded."""

    __slots__ = ("_labels", "_otel", "_prometheus", "_series", "kind")

    def __init__(
        self, name: str, declared: _Declared, registry: CollectorRegistry, meter: Meter | None
    ) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.kind = declared.kind
        self._labels = declared.labels
        self._prometheus: Any
        otel: Any = None
        if declared.kind == "counter":
            self._prometheus = Counter(name, declared.help, declared.labels, registry=registry)
            if meter is not None:
                otel = meter.create_counter(name, description=declared.help).add
        elif declared.kind == "histogram":
            self._prometheus = Histogram(
                name, declared.help, declared.labels, registry=registry, buckets=LATENCY_BUCKETS
            )
            if meter is not None:
                otel = meter.create_histogram(
                    name,
                    unit="s",
                    description=declared.help,
                    explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
                ).record
        else:
            self._prometheus = Gauge(
                name,
                declared.help,
                declared.labels,
                registry=registry,
                multiprocess_mode="liveall" if declared.per_worker else "mostrecent",
            )
            if meter is not None:
                otel = meter.create_gauge(name, unit=declared.unit, description=declared.help).set
        self._otel: Callable[[float, dict[str, str]], None] | None = otel
        # label values -> (the prometheus child's write, the OpenTelemetry attributes)
        self._series: dict[tuple[str, ...], tuple[_Write, dict[str, str]]] = {}

    def record(self, amount: float, values: tuple[str, ...] = ()) -> None:
        """Add ``amount`` (a counter), observe it (a histogram) or set it (the gauge), for
        the label ``values`` in the declared order."""
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = self._new_series(values)
        write, attributes = series
        write(amount)
        if self._otel is not None:
            self._otel(amount, attributes)

    def _new_series(self, values: tuple[str, ...]) -> tuple[_Write, dict[str, str]]:
        child = self._prometheus.labels(*values) if values else self._prometheus
        write: _Write = getattr(child, _WRITE[self.kind])
        return write, dict(zip(self._labels, values, strict=True))


class Metrics:
    """This process's instruments, and the hooks the rest of the service calls."""

    def __init__(
        self,
        shared_dir: str | None = None,
        *,
        export: str = "none",
        otel_readers: Sequence[MetricReader] = (),
    ) -> None:
        """``shared_dir``: the server's multiprocess directory (see the module docstring),
        which must be this process's ``PROMETHEUS_MULTIPROC_DIR``. ``export``: ``otlp`` also
        records into OpenTelemetry instruments pushed with the OTLP exporter;
        ``otel_readers``: more OpenTelemetry readers of them (tests, the cost script)."""
        from prometheus_client import CollectorRegistry

        if shared_dir is not None and os.environ.get(MULTIPROC_VARIABLE) != shared_dir:
            raise ConfigError(
                f"the metrics directory {shared_dir} must be {MULTIPROC_VARIABLE} before "
                "prometheus_client is imported (settlement serve sets both)"
            )
        self._registry = CollectorRegistry()
        self._provider = _meter_provider(export, otel_readers)  # kept for its readers' life
        meter = None if self._provider is None else self._provider.get_meter("settlement")
        self._instruments = {
            name: _Instrument(name, declared, self._registry, meter)
            for name, declared in DECLARED.items()
        }
        # what a scrape shows: the recorded figures, then those made when scraped
        self._scraped = CollectorRegistry(auto_describe=False)
        if shared_dir is not None and not any(Path(shared_dir).glob(f"*_{os.getpid()}.db")):
            raise ConfigError(
                f"prometheus_client was imported before {MULTIPROC_VARIABLE} was set: "
                "this process's metrics would not reach the other workers' scrapes"
            )
        self._scraped.register(recorded(shared_dir, self._registry))
        self._scraped.register(build_info())
        self._scraped.register(worker_processes(shared_dir))
        self._requests = self._instruments["settlement_http_requests_total"]
        self._replays = self._instruments["settlement_http_replays_total"]
        self._problems = self._instruments["settlement_http_problems_total"]
        self._durations = self._instruments["settlement_http_request_duration_seconds"]
        self._pool_in_use = self._instruments["settlement_db_pool_connections_in_use"]
        self._pool_size = -1

    # -- recording ----------------------------------------------------------------------------

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._recorded(name, "counter").record(amount, self._values(name, labels))

    def set(self, name: str, value: float) -> None:
        self._recorded(name, "gauge").record(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        self._recorded(name, "histogram").record(seconds, self._values(name, labels))

    def _recorded(self, name: str, kind: Kind) -> _Instrument:
        instrument = self._instruments.get(name)
        if instrument is None or instrument.kind != kind:
            raise KeyError(f"undeclared {kind} {name}")
        return instrument

    @staticmethod
    def _values(name: str, labels: dict[str, str]) -> tuple[str, ...]:
        declared = DECLARED[name].labels
        if labels.keys() != set(declared):
            raise KeyError(f"{name} has the labels {declared}, not {sorted(labels)}")
        return tuple(labels[label] for label in declared)

    # -- hooks --------------------------------------------------------------------------------

    def on_request(
        self, route: str, status: int, problem: str | None, replayed: bool, seconds: float
    ) -> None:
        """One HTTP answer (the request middleware). Label values are passed in the declared
        order here: this runs on every request."""
        status_class = _STATUS_CLASS.get(status // 100, "other")
        outcome = problem or ("replayed" if replayed else "ok" if status < 400 else "error")
        self._requests.record(1.0, (outcome, route, status_class))
        if replayed:
            self._replays.record(1.0, (route,))
        if problem is not None:
            self._problems.record(1.0, (problem, str(status)))
        self._durations.record(seconds, (route, status_class))

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

    def on_pool(self, in_use: int, size: int) -> None:
        """The worker's database pool lent out ``in_use`` of its ``size`` connections (on
        every checkout and return: an ``mmap`` write, about 1.6 us)."""
        self._pool_in_use.record(in_use)
        if size != self._pool_size:
            self._pool_size = size
            self._instruments["settlement_db_pool_connections_max"].record(size)

    # -- reading ------------------------------------------------------------------------------

    def value(self, name: str, **labels: str) -> float:
        """This process's figure of one series (a histogram's: its count)."""
        sample = name + "_count" if DECLARED[name].kind == "histogram" else name
        return self._registry.get_sample_value(sample, labels) or 0.0

    def render(self) -> str:
        """Prometheus text: the server's figures (every worker's) with a shared directory,
        else this process's."""
        from prometheus_client import generate_latest

        return generate_latest(self._scraped).decode()


def _meter_provider(export: str, readers: Sequence[MetricReader]) -> MeterProvider | None:
    """The OpenTelemetry side: none unless exporting (or given readers)."""
    if export != "otlp" and not readers:
        return None
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from opentelemetry.sdk.resources import Resource

    all_readers = list(readers)
    if export == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        all_readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    return MeterProvider(
        metric_readers=all_readers,
        resource=Resource.create(
            {"service.name": "settlement", "service.instance.id": str(os.getpid())}
        ),
        # the OTLP exporter pushes a last time at exit; test readers leave nothing behind
        shutdown_on_exit=export == "otlp",
        exemplar_filter=AlwaysOffExemplarFilter(),
    )
