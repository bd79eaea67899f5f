"""What ``make bench`` prints and saves: the table, the throughput ratios, the notes, and
``results/<date>.json`` with every number behind them.
"""

from __future__ import annotations

import os
from typing import Any

from bench.runner import Row, Runner
from bench.session import NOISE_CORES, machine


def write(runner: Runner) -> dict[str, Any]:
    """Print the table, the ratios and the notes; write them to ``results/<date>.json``."""
    seconds = runner.session.seconds
    ratios = throughput_ratios(runner.rows)
    print()
    print(table(runner.rows))
    print()
    print("throughput ratios:")
    for name, value in ratios.items():
        print(f"  {name:<36} {'-' if value is None else f'{value:.3f}'}")
    print()
    print("notes:")
    for row in runner.rows:
        for note in row.notes:
            print(f"  {row.name}: {note}")
    noisy = [
        f"{row.name} {row.usage.other_cores:.2f}"
        for row in runner.rows
        if row.usage is not None and row.usage.other_cores > NOISE_CORES
    ]
    if noisy:
        print(
            "  WARNING: other work on the machine took CPU during "
            + ", ".join(noisy)
            + " (cores): those numbers are low and noisy; run again on a quiet machine"
        )
    for what, counts in runner.session.server_log_counts.items():
        print(
            f"  {what} log: {counts['error_lines']} error lines, "
            f"{counts['client_disconnects']} 'client disconnected prematurely' (requests "
            f"in flight when wrk stopped), {counts['warning_lines']} warning lines"
        )
    cfg = runner.config
    print(
        f"  {os.cpu_count()} CPUs shared by server, PostgreSQL, Redis and the load "
        f"generator; wrk -t2 -c{cfg.connections}, {cfg.duration:g}s per scenario after "
        f"{cfg.warmup:g}s warm-up; cpu = cores used (app workers / PostgreSQL / loadgen)"
    )
    document = {
        "date": runner.session.stamp,
        "config": cfg.__dict__,
        "machine": machine(),
        "scenarios": {row.name: row.as_dict() for row in runner.rows},
        "ratios": ratios,
        "server_logs": runner.session.server_log_counts,
        "machine_busy_cores_before_run": round(runner.session.busy_before, 2),
        "total_seconds": round(seconds, 1),
    }
    runner.session.save(document, seconds)
    return document


def throughput_ratios(rows: list[Row]) -> dict[str, float | None]:
    """req/s of the server over its peers and its baselines (None where a side is missing or
    zero)."""
    by_name = {row.name: row for row in rows}

    def ratio(a: str, b: str) -> float | None:
        if a not in by_name or b not in by_name or not by_name[b].result.rps:
            return None
        return round(by_name[a].result.rps / by_name[b].result.rps, 3)

    ratios = {
        "new / powertools-new": ratio("new", "powertools-new"),
        "replay / powertools-replay": ratio("replay", "powertools-replay"),
        "new / asgi-idem-new": ratio("new", "asgi-idem-new"),
        "replay / asgi-idem-replay": ratio("replay", "asgi-idem-replay"),
        "new / pgbench-min": ratio("new", "pgbench-min"),
        "replay / bare": ratio("replay", "bare"),
        "new / plain-transfer": ratio("new", "plain-transfer"),
        "plain-transfer / peer-plain-transfer": ratio("plain-transfer", "peer-plain-transfer"),
        "new / pgbench-new": ratio("new", "pgbench-new"),
        "replay / pgbench-read": ratio("replay", "pgbench-read"),
    }
    info = [by_name[f"new@INFO-{t}"].result.rps for t in (1, 2) if f"new@INFO-{t}" in by_name]
    warning = [
        by_name[f"new@WARNING-{t}"].result.rps for t in (1, 2) if f"new@WARNING-{t}" in by_name
    ]
    if info and warning and sum(warning):
        ratios["new@INFO / new@WARNING"] = round(sum(info) / sum(warning), 3)
    return ratios


def table(rows: list[Row]) -> str:
    header = (
        f"{'scenario':<19} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
        f"{'5xx':>5} {'peak RSS/worker MiB':>20} {'conns/worker':>12} "
        f"{'cores app/pg/load/other':>24} {'CPU ms/req app/pg':>18}  target"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        r = row.result
        rss = "/".join(f"{v:.0f}" for v in row.usage.rss_values) if row.usage else "-"
        rss = rss or "-"
        cpu = "-"
        if row.usage is not None:
            groups = ("workers", "postgres", "loadgen")
            cpu = "/".join(f"{row.usage.cores(g):.2f}" for g in groups)
            cpu += f"/{row.usage.other_cores:.2f}"
        errors = str(r.failures)
        if row.name == "contention":
            errors = f"{r.failures - r.statuses.get('409', 0)}*"
        conns = row.usage.connection_split if row.usage and row.usage.worker_connections else "-"
        per_request = "-"
        if row.usage is not None and r.requests:
            app, pg = (row.usage.cpu_seconds.get(g, 0.0) for g in ("workers", "postgres"))
            per_request = f"{1000 * app / r.requests:.2f}/{1000 * pg / r.requests:.2f}"
        lines.append(
            f"{row.name:<19} {r.rps:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{errors:>7} {r.server_errors:>5} {rss:>20} {conns:>12} {cpu:>24} "
            f"{per_request:>18}  {row.target}"
        )
    lines.append(
        "errors: non-2xx answers + transport errors (wrk) or failed transactions (pgbench); "
        "* contention: without its 409s, which are the expected answers (p50/p99 are theirs)"
    )
    lines.append(
        "conns/worker: most client connections each worker held at once; cores: CPU used "
        "by the app workers / PostgreSQL / the load generator / anything else on the "
        "machine, averaged over the scenario; CPU ms/req: CPU time of the app workers / "
        "of PostgreSQL per request (less noisy than req/s on a shared machine)"
    )
    return "\n".join(lines)
