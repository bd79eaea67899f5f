"""What ``make soak`` prints and saves: per worker RSS at minute 1, at the end, its peak, growth
and slope; the load of each segment and in all; whether the memory goals are met; and
``results/<date>-soak.json`` with the RSS series and every segment.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from bench.loadgen import LoadResult
from bench.session import NOISE_CORES, machine
from bench.soak_runner import SCRIPTS, Soak
from bench.usage import MIB

# The goal: peak RSS per worker (MB, 10^6 bytes) and growth from minute 1 to the end (%).
PEAK_GOAL_MB = 150.0
GROWTH_GOAL_PERCENT = 5.0


def write(soak: Soak) -> dict[str, Any]:
    """Print the table, the load, the goals and the notes; write ``results/<date>-soak.json``."""
    seconds = soak.session.seconds
    cfg = soak.config
    rows = worker_rows(soak)
    load = load_totals(soak)
    measured = [r for r in rows if r.get("samples")]
    peak_met = bool(measured) and all(
        r["peak_rss_mib"] * MIB <= PEAK_GOAL_MB * 1e6 for r in measured
    )
    growth_met = bool(measured) and all(
        r["growth_percent"] <= GROWTH_GOAL_PERCENT for r in measured
    )
    if cfg.duration <= cfg.baseline:
        soak.notes.append(
            f"SOAK_DURATION {cfg.duration:g}s is not past SOAK_BASELINE {cfg.baseline:g}s: "
            "growth is measured from the first sample"
        )
    if soak.usage.other_cores > NOISE_CORES:
        soak.notes.append(
            f"other work on the machine took {soak.usage.other_cores:.2f} cores during the "
            "soak: throughput is low and noisy"
        )

    print()
    print(table(rows, cfg.baseline))
    print()
    _print_load(soak, load)
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
    for note in soak.notes:
        print(f"note: {note}")

    document = {
        "date": soak.session.stamp,
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
            **{g: round(soak.usage.cores(g), 2) for g in soak.usage.cpu_seconds},
            "other": round(soak.usage.other_cores, 2),
        },
        "cpu_cores_per_worker": soak.usage.worker_cores,
        "server_logs": soak.session.server_log_counts,
        "notes": soak.notes,
        "rss_series": {"pids": soak.series.pids, "samples": soak.series.samples},
        "segments": [s.as_dict() for s in soak.segments],
        "machine_busy_cores_before_run": round(soak.session.busy_before, 2),
        "total_seconds": round(seconds, 1),
    }
    soak.session.save(document, seconds)
    return document


def _print_load(soak: Soak, load: dict[str, Any]) -> None:
    """The load in all and by script, the cores used, the server's log lines."""
    cfg = soak.config
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
        f"{soak.usage.cores(g):.2f}" for g in ("workers", "postgres", "redis", "loadgen")
    )
    print(f"  cores app/pg/redis/load/other: {cores}/{soak.usage.other_cores:.2f}")
    per_worker = "/".join(f"{c:.2f}" for c in soak.usage.worker_cores)
    print(f"  cores per worker: {per_worker} (the server's workers share one listening socket)")
    for what, counts in soak.session.server_log_counts.items():
        print(
            f"  {what} log: {counts['error_lines']} error lines, "
            f"{counts['client_disconnects']} 'client disconnected prematurely', "
            f"{counts['warning_lines']} warning lines"
        )


def table(rows: list[dict[str, Any]], baseline: float) -> str:
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
        f"RSS@min1: the sample at {baseline:g}s (after warm-up); end: the sample "
        "when the load stopped; peak: highest RSS seen (sampled every 0.1 s); growth: end "
        "over min1; MiB/min: least-squares slope of RSS from min1 to the end"
    )
    return "\n".join(lines)


def worker_rows(soak: Soak) -> list[dict[str, Any]]:
    """Per worker: RSS at minute 1, at the end, its peak, growth and slope."""
    cfg = soak.config
    rows: list[dict[str, Any]] = []
    for i, pid in enumerate(soak.series.pids):
        rss = soak.series.column(i)
        uss = soak.series.column(i, "uss_mib")
        if not rss:
            rows.append({"pid": pid, "samples": 0})
            continue
        after = [(t, v) for t, v in rss if t >= cfg.baseline] or rss
        uss_after = [(t, v) for t, v in uss if t >= cfg.baseline] or uss
        start_t, start = after[0]
        end_t, end = rss[-1]
        peak = max(max(v for _, v in rss), soak.usage.peak_rss_mib.get(pid, 0.0))
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


def load_totals(soak: Soak) -> dict[str, Any]:
    """Requests, answers and latencies of each script over every segment, and in all."""
    per_script: dict[str, dict[str, Any]] = {}
    for name in SCRIPTS:
        runs = [s.results[name] for s in soak.segments if name in s.results]
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
                soak.config.new_connections if name == "new" else soak.config.replay_connections
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
        "transport_errors": sum(sum(s["transport_errors"].values()) for s in per_script.values()),
        "load_seconds": round(soak.load_seconds, 1),
        "segments": len(soak.segments),
        "by_script": per_script,
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


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
