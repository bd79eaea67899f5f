"""``make soak``: memory of the server's workers under a long, steady load.

The goal it checks: peak RSS of at most 150 MB per worker, and no growth beyond 5 % over a
10-minute soak at steady load.

Starts the same stack as ``make bench`` (embedded PostgreSQL and Redis, not durable, in a
temporary directory; the production server ``python -m service.cli serve --workers N``),
creates the bench principal and accounts, seeds BENCH_SEED completed transfers, then runs
SOAK_DURATION seconds of load in segments of SOAK_SEGMENT seconds. In each segment two wrk
run side by side at a fixed number of connections (SOAK_CONNECTIONS in all):

* ``new`` (``fresh.lua``): a new transfer per request, unique keys (claim, lease, effect,
  settle), on SOAK_CONNECTIONS - SOAK_REPLAY_CONNECTIONS connections;
* ``replay`` (``cycle.lua``): retries of the seeded transfers, on SOAK_REPLAY_CONNECTIONS.

Each segment starts new wrk processes (new connections, new keys): throughput is recorded per
segment, so a slowdown over the run shows too.

The RSS (and USS) of each worker is sampled every SOAK_INTERVAL seconds with psutil, and its
peak every 0.1 s (``bench.usage.sample``, with the CPU used by each group). Per worker the
report gives RSS at SOAK_BASELINE seconds (the end of minute 1, after warm-up), at the end,
the peak, the growth from minute 1 to the end, and the least-squares slope in MiB/min (from
minute 1 on, and over the whole run). Prints a table; writes ``bench/results/<date>-soak.json``
(with the RSS series and every segment); the server's log (its per-request INFO lines), wrk's
and PostgreSQL's go to ``bench/results/<date>-soak-logs/``.

Environment: BENCH_WORKERS (2), BENCH_SEED (1000), SOAK_DURATION (600 s), SOAK_CONNECTIONS
(16), SOAK_REPLAY_CONNECTIONS (4), SOAK_SEGMENT (30 s), SOAK_INTERVAL (10 s), SOAK_BASELINE
(60 s). With the defaults a run takes about eleven minutes.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import session
from bench.fixtures import TRANSFERS, Fixture
from bench.loadgen import LoadResult, run_wrk, write_requests
from bench.session import NOISE_CORES, RESULTS, Session, env_number, machine, save, say, seed
from bench.stack import ServerProcess, Stack
from bench.usage import (
    MIB,
    RssSeries,
    Usage,
    process_cpu_seconds,
    sample,
    sample_series,
)

# The goal: peak RSS per worker (MB, 10^6 bytes) and growth from minute 1 to the end (%).
PEAK_GOAL_MB = 150.0
GROWTH_GOAL_PERCENT = 5.0
SCRIPTS = {"new": "fresh.lua", "replay": "cycle.lua"}
# uvicorn's workers share one listening socket: which worker accepts wrk's connections is up
# to the kernel, so they are counted in each segment, this long after wrk starts.
CONNECTIONS_AFTER = 2.0


@dataclass(frozen=True)
class SoakConfig:
    workers: int
    duration: float
    connections: int
    replay_connections: int
    segment: float
    interval: float
    baseline: float
    seed: int

    @property
    def new_connections(self) -> int:
        return self.connections - self.replay_connections

    @classmethod
    def from_env(cls) -> SoakConfig:
        config = cls(
            workers=int(env_number("BENCH_WORKERS", 2, 1)),
            duration=env_number("SOAK_DURATION", 600, 10),
            connections=int(env_number("SOAK_CONNECTIONS", 16, 2)),
            replay_connections=int(env_number("SOAK_REPLAY_CONNECTIONS", 4, 0)),
            segment=env_number("SOAK_SEGMENT", 30, 5),
            interval=env_number("SOAK_INTERVAL", 10, 1),
            baseline=env_number("SOAK_BASELINE", 60, 0),
            seed=int(env_number("BENCH_SEED", 1000, 1)),
        )
        if config.new_connections < 1:
            raise SystemExit("SOAK_REPLAY_CONNECTIONS must be below SOAK_CONNECTIONS")
        return config


@dataclass
class Segment:
    """One stretch of load: the wrk runs that went side by side."""

    index: int
    start_s: float
    seconds: float
    results: dict[str, LoadResult]
    # client connections each worker held (pid order), counted CONNECTIONS_AFTER s in
    connections: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start_s": round(self.start_s, 1),
            "seconds": round(self.seconds, 2),
            "client_connections_per_worker": self.connections,
            **{name: result.as_dict() for name, result in self.results.items()},
        }


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 2:
        return None
    try:
        fit = statistics.linear_regression([t for t, _ in points], [v for _, v in points])
    except statistics.StatisticsError:
        return None
    return fit.slope * 60


class Soak:
    def __init__(self, config: SoakConfig, stamp: str) -> None:
        self.config = config
        self.stamp = stamp
        self.log_dir = RESULTS / f"{stamp}-soak-logs"
        self.session = Session(self.log_dir)
        self.segments: list[Segment] = []
        self.series = RssSeries([])
        self.usage = Usage()
        self.notes: list[str] = []
        self.load_seconds = 0.0
        self.loadgen_seconds = 0.0

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        with self.session.start("logs (the server's per-request lines among them)") as (
            stack,
            fixture,
        ):
            server = stack.production_server(self.config.workers)
            with server:
                say(f"production server up: {server.base_url}, {server.workers} worker(s)")
                seed(fixture, server, self.config.seed)
                self.soak(stack, server, fixture)
            self.session.server_errors(server, "production server")
        return self.report(self.session.seconds)

    def soak(self, stack: Stack, server: ServerProcess, fixture: Fixture) -> None:
        cfg = self.config
        workers = sorted(server.worker_processes(), key=lambda p: p.pid)
        if len(workers) != cfg.workers:
            raise RuntimeError(f"expected {cfg.workers} worker processes, found {len(workers)}")
        self.series = RssSeries([p.pid for p in workers])
        replay_file = write_requests(self.log_dir / "replay.requests", fixture.seed_requests)
        say(
            f"soak: {cfg.duration:g}s at {cfg.connections} connections ({cfg.new_connections} "
            f"new, {cfg.replay_connections} replay) in segments of {cfg.segment:g}s; "
            f"RSS every {cfg.interval:g}s of workers {self.series.pids}"
        )
        began = time.monotonic()
        deadline = began + cfg.duration
        before = process_cpu_seconds()
        with (
            sample(
                workers,
                None,
                postgres=stack.postgres_processes,
                redis=stack.redis_processes,
            ) as usage,
            sample_series(workers, cfg.interval, began, self.series),
        ):
            index = 0
            while (left := deadline - time.monotonic()) >= 1:  # bounded: one segment at most
                index += 1
                length = min(cfg.segment, left)
                self.segments.append(
                    self.segment(server, fixture, replay_file, index, began, length)
                )
                self.progress(self.segments[-1])
            self.load_seconds = time.monotonic() - began
        self.loadgen_seconds = process_cpu_seconds() - before
        usage.cpu_seconds["loadgen"] = self.loadgen_seconds
        self.usage = usage
        gone = set(self.series.pids) - {p.pid for p in server.worker_processes()}
        if gone or self.series.lost:
            self.notes.append(
                f"worker(s) {sorted(gone | self.series.lost)} exited during the soak: "
                "their series end early"
            )

    def segment(
        self,
        server: ServerProcess,
        fixture: Fixture,
        replay_file: Path,
        index: int,
        began: float,
        length: float,
    ) -> Segment:
        cfg = self.config
        url = server.base_url + "/"
        # a new key prefix each segment (and random parts per wrk thread): keys never repeat
        plan = {"new": (fixture.fresh_args(TRANSFERS, f"soak{index}"), cfg.new_connections)}
        if cfg.replay_connections:
            plan["replay"] = ([str(replay_file)], cfg.replay_connections)
        start = time.monotonic()
        futures: dict[str, Future[LoadResult]] = {}
        # each wrk ends at its duration; run_wrk kills one that hangs WRK_GRACE later
        with ThreadPoolExecutor(max_workers=len(plan), thread_name_prefix="wrk") as pool:
            for name, (args, n) in plan.items():
                futures[name] = pool.submit(
                    run_wrk,
                    url,
                    SCRIPTS[name],
                    args,
                    duration=length,
                    connections=n,
                    log_path=self.log_dir / f"wrk-{name}.log",
                )
            time.sleep(min(CONNECTIONS_AFTER, length / 2))
            connections: list[int] = []
            with contextlib.suppress(psutil.Error, OSError):
                counts = server.client_connections()
                connections = [counts.get(pid, 0) for pid in self.series.pids]
        results = {}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                self.notes.append(f"segment {index}: wrk ({name}) failed: {first_line}")
                say(f"  segment {index}: wrk ({name}) failed: {first_line}")
        if not results:
            raise RuntimeError(f"every wrk of segment {index} failed; see {self.log_dir}")
        return Segment(index, start - began, time.monotonic() - start, results, connections)

    def progress(self, seg: Segment) -> None:
        parts = []
        for name, r in seg.results.items():
            parts.append(
                f"{name} {r.rps:.0f} req/s p99 {r.p99_ms:.0f} ms non-2xx {r.non_2xx}"
                + (f" errors {sum(r.errors.values())}" if r.errors else "")
            )
        if seg.connections:
            parts.append("connections " + "/".join(str(n) for n in seg.connections))
        last = self.series.samples[-1] if self.series.samples else None
        rss = ""
        if last is not None:
            values = "/".join("-" if v is None else f"{v:.1f}" for v in last["rss_mib"])
            rss = f"; RSS {values} MiB at {last['t_s']:.0f}s"
        end = seg.start_s + seg.seconds
        say(f"  {end:5.0f}s segment {seg.index}: " + ", ".join(parts) + rss)

    # -- numbers ---------------------------------------------------------------------------

    def worker_rows(self) -> list[dict[str, Any]]:
        cfg = self.config
        rows: list[dict[str, Any]] = []
        for i, pid in enumerate(self.series.pids):
            rss = self.series.column(i)
            uss = self.series.column(i, "uss_mib")
            if not rss:
                rows.append({"pid": pid, "samples": 0})
                continue
            after = [(t, v) for t, v in rss if t >= cfg.baseline] or rss
            uss_after = [(t, v) for t, v in uss if t >= cfg.baseline] or uss
            start_t, start = after[0]
            end_t, end = rss[-1]
            peak = max(max(v for _, v in rss), self.usage.peak_rss_mib.get(pid, 0.0))
            rows.append(
                {
                    "pid": pid,
                    "samples": len(rss),
                    "rss_min1_mib": start,
                    "rss_min1_at_s": start_t,
                    "rss_end_mib": end,
                    "rss_end_at_s": end_t,
                    "peak_rss_mib": round(peak, 2),
                    "peak_rss_mb": round(peak * MIB / 1e6, 1),
                    "growth_percent": round(100 * (end - start) / start, 2),
                    "slope_mib_per_min_after_min1": _round(slope_per_minute(after)),
                    "slope_mib_per_min_whole_run": _round(slope_per_minute(rss)),
                    "rss_first_mib": rss[0][1],
                    "uss_min1_mib": uss_after[0][1] if uss_after else None,
                    "uss_end_mib": uss[-1][1] if uss else None,
                    "uss_growth_percent": (
                        round(100 * (uss[-1][1] - uss_after[0][1]) / uss_after[0][1], 2)
                        if uss_after
                        else None
                    ),
                }
            )
        return rows

    def load_totals(self) -> dict[str, Any]:
        per_script: dict[str, dict[str, Any]] = {}
        for name in SCRIPTS:
            runs = [s.results[name] for s in self.segments if name in s.results]
            if not runs:
                continue
            statuses: dict[str, int] = {}
            errors: dict[str, int] = {}
            for r in runs:
                for k, n in r.statuses.items():
                    statuses[k] = statuses.get(k, 0) + n
                for k, n in r.errors.items():
                    errors[k] = errors.get(k, 0) + n
            requests = sum(r.requests for r in runs)
            seconds = sum(r.seconds for r in runs)
            total = LoadResult(requests, seconds, 0.0, 0.0, statuses, errors)
            rps_series = [round(r.rps, 1) for r in runs]
            per_script[name] = {
                "connections": (
                    self.config.new_connections if name == "new" else self.config.replay_connections
                ),
                "requests": requests,
                "seconds": round(seconds, 1),
                "rps": round(total.rps, 1),
                "rps_first_segment": rps_series[0],
                "rps_last_segment": rps_series[-1],
                "rps_per_segment": rps_series,
                "p50_ms_median_of_segments": round(statistics.median(r.p50_ms for r in runs), 2),
                "p99_ms_median_of_segments": round(statistics.median(r.p99_ms for r in runs), 2),
                "p99_ms_worst_segment": round(max(r.p99_ms for r in runs), 2),
                "max_ms": round(max(r.max_ms or 0.0 for r in runs), 2),
                "statuses": dict(sorted(statuses.items())),
                "non_2xx": total.non_2xx,
                "server_errors_5xx": total.server_errors,
                "transport_errors": errors,
            }
        return {
            "requests": sum(s["requests"] for s in per_script.values()),
            "rps": round(sum(s["rps"] for s in per_script.values()), 1),
            "non_2xx": sum(s["non_2xx"] for s in per_script.values()),
            "server_errors_5xx": sum(s["server_errors_5xx"] for s in per_script.values()),
            "transport_errors": sum(
                sum(s["transport_errors"].values()) for s in per_script.values()
            ),
            "load_seconds": round(self.load_seconds, 1),
            "segments": len(self.segments),
            "by_script": per_script,
        }

    # -- output ----------------------------------------------------------------------------

    def report(self, seconds: float) -> dict[str, Any]:
        cfg = self.config
        rows = self.worker_rows()
        load = self.load_totals()
        measured = [r for r in rows if r.get("samples")]
        peak_met = bool(measured) and all(
            r["peak_rss_mib"] * MIB <= PEAK_GOAL_MB * 1e6 for r in measured
        )
        growth_met = bool(measured) and all(
            r["growth_percent"] <= GROWTH_GOAL_PERCENT for r in measured
        )
        if cfg.duration <= cfg.baseline:
            self.notes.append(
                f"SOAK_DURATION {cfg.duration:g}s is not past SOAK_BASELINE {cfg.baseline:g}s: "
                "growth is measured from the first sample"
            )
        if self.usage.other_cores > NOISE_CORES:
            self.notes.append(
                f"other work on the machine took {self.usage.other_cores:.2f} cores during the "
                "soak: throughput is low and noisy"
            )

        print()
        print(self.table(rows))
        print()
        print(
            f"load: {cfg.connections} connections ({cfg.new_connections} new, "
            f"{cfg.replay_connections} replay), {load['load_seconds']:g}s in "
            f"{load['segments']} segments of up to {cfg.segment:g}s"
        )
        print(
            f"  {'total':<7} {load['requests']:>9} requests {load['rps']:>8.1f} req/s  "
            f"non-2xx {load['non_2xx']}, 5xx {load['server_errors_5xx']}, "
            f"transport errors {load['transport_errors']}"
        )
        for name, s in load["by_script"].items():
            print(
                f"  {name:<7} {s['requests']:>9} requests {s['rps']:>8.1f} req/s  "
                f"non-2xx {s['non_2xx']}, 5xx {s['server_errors_5xx']}; "
                f"p50 {s['p50_ms_median_of_segments']:.1f} ms, p99 "
                f"{s['p99_ms_median_of_segments']:.1f} ms (median of segments, worst "
                f"{s['p99_ms_worst_segment']:.1f}); req/s first segment "
                f"{s['rps_first_segment']:.0f}, last {s['rps_last_segment']:.0f}"
            )
        cores = "/".join(
            f"{self.usage.cores(g):.2f}" for g in ("workers", "postgres", "redis", "loadgen")
        )
        print(f"  cores app/pg/redis/load/other: {cores}/{self.usage.other_cores:.2f}")
        per_worker = "/".join(f"{c:.2f}" for c in self.usage.worker_cores)
        print(f"  cores per worker: {per_worker} (uvicorn's workers share one listening socket)")
        for what, counts in self.session.server_log_counts.items():
            print(
                f"  {what} log: {counts['error_lines']} error lines, "
                f"{counts['client_disconnects']} 'client disconnected prematurely', "
                f"{counts['warning_lines']} warning lines"
            )
        print()
        worst_peak = max((r["peak_rss_mib"] for r in measured), default=0.0)
        worst_growth = max((r["growth_percent"] for r in measured), default=0.0)
        print(
            f"goal peak RSS <= {PEAK_GOAL_MB:g} MB ({PEAK_GOAL_MB * 1e6 / MIB:.1f} MiB) per "
            f"worker: {'met' if peak_met else 'NOT met'} (highest {worst_peak:.1f} MiB)"
        )
        print(
            f"goal growth <= {GROWTH_GOAL_PERCENT:g} % from minute 1 to the end: "
            f"{'met' if growth_met else 'NOT met'} (highest {worst_growth:+.2f} %)"
        )
        for note in self.notes:
            print(f"note: {note}")

        document = {
            "date": self.stamp,
            "kind": "soak",
            "config": asdict(cfg),
            "machine": machine(),
            "goals": {
                "peak_rss_mb_per_worker": PEAK_GOAL_MB,
                "growth_percent": GROWTH_GOAL_PERCENT,
                "peak_met": peak_met,
                "growth_met": growth_met,
            },
            "workers": rows,
            "load": load,
            "cpu_cores": {
                **{g: round(self.usage.cores(g), 2) for g in self.usage.cpu_seconds},
                "other": round(self.usage.other_cores, 2),
            },
            "cpu_cores_per_worker": self.usage.worker_cores,
            "server_logs": self.session.server_log_counts,
            "notes": self.notes,
            "rss_series": {"pids": self.series.pids, "samples": self.series.samples},
            "segments": [s.as_dict() for s in self.segments],
            "machine_busy_cores_before_run": round(self.session.busy_before, 2),
            "total_seconds": round(seconds, 1),
        }
        save(document, f"{self.stamp}-soak.json", seconds)
        return document

    def table(self, rows: list[dict[str, Any]]) -> str:
        header = (
            f"{'worker':<7} {'pid':>8} {'RSS@min1 MiB':>13} {'RSS end MiB':>12} "
            f"{'peak MiB':>9} {'growth %':>9} {'MiB/min':>8} {'USS growth %':>13} "
            f"{'samples':>8}"
        )
        lines = [header, "-" * len(header)]
        for n, row in enumerate(rows, 1):
            if not row.get("samples"):
                lines.append(f"{n:<7} {row['pid']:>8}  no samples")
                continue
            slope = row["slope_mib_per_min_after_min1"]
            uss = row["uss_growth_percent"]
            lines.append(
                f"{n:<7} {row['pid']:>8} {row['rss_min1_mib']:>13.1f} {row['rss_end_mib']:>12.1f} "
                f"{row['peak_rss_mib']:>9.1f} {row['growth_percent']:>+9.2f} "
                f"{'-' if slope is None else f'{slope:+.3f}':>8} "
                f"{'-' if uss is None else f'{uss:+.2f}':>13} {row['samples']:>8}"
            )
        lines.append(
            f"RSS@min1: the sample at {self.config.baseline:g}s (after warm-up); end: the sample "
            "when the load stopped; peak: highest RSS seen (sampled every 0.1 s); growth: end "
            "over min1; MiB/min: least-squares slope of RSS from min1 to the end"
        )
        return "\n".join(lines)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def main() -> int:
    config = SoakConfig.from_env()
    return session.main(lambda stamp: Soak(config, stamp).run())


if __name__ == "__main__":
    sys.exit(main())
