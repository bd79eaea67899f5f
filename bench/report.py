"""What ``make bench`` prints and saves: the table, the throughput ratios, the notes, and
``results/<date>.json`` with every number behind them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from bench.peer_app import LAYERS
from bench.runner import SERVED_GROUPS, Row, Runner
from bench.session import NOISE_CORES, machine


def write(runner: Runner) -> dict[str, Any]:
    """Print the table, the ratios and the notes; write them to ``results/<date>.json``."""
    seconds = runner.session.seconds
    ratios = throughput_ratios(runner.rows)
    cpu = cpu_ratios(runner.rows)
    print()
    print(table(runner.rows))
    print()
    print("throughput ratios (req/s; above 1: the first serves more):")
    for name, value in ratios.items():
        print(f"  {name:<36} {'-' if value is None else f'{value:.3f}'}")
    print(
        "CPU per request ratios (app workers + PostgreSQL + Redis; below 1: the first uses less):"
    )
    for name, value in cpu.items():
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
        "cpu_per_request_ratios": cpu,
        "server_logs": runner.session.server_log_counts,
        "machine_busy_cores_before_run": round(runner.session.busy_before, 2),
        "total_seconds": round(seconds, 1),
    }
    runner.session.save(document, seconds)
    return document


def _peer_pairs() -> list[tuple[str, str]]:
    """The server's rows over each peer's: ``new / <layer>-new``, ``replay / <layer>-replay``."""
    return [(mine, f"{layer}-{mine}") for layer in LAYERS for mine in ("new", "replay")]


def _ratio(rows: list[Row], a: str, b: str, value: Callable[[Row], float]) -> float | None:
    """``value`` of row ``a`` over that of row ``b`` (None where a side is missing or zero)."""
    by_name = {row.name: row for row in rows}
    if a not in by_name or b not in by_name or not value(by_name[b]):
        return None
    return round(value(by_name[a]) / value(by_name[b]), 3)


def cpu_ratios(rows: list[Row]) -> dict[str, float | None]:
    """CPU per request (app workers, PostgreSQL and Redis) of the server over each peer's: less
    noisy than req/s on a shared machine."""
    return {f"{a} / {b}": _ratio(rows, a, b, Row.cpu_ms_per_request) for a, b in _peer_pairs()}


def throughput_ratios(rows: list[Row]) -> dict[str, float | None]:
    """req/s of the server over its peers and its baselines (None where a side is missing or
    zero)."""
    by_name = {row.name: row for row in rows}

    def ratio(a: str, b: str) -> float | None:
        return _ratio(rows, a, b, lambda row: row.result.rps)

    ratios = {f"{a} / {b}": ratio(a, b) for a, b in _peer_pairs()}
    ratios |= {
        "replay / uvicorn-replay": ratio("replay", "uvicorn-replay"),
        "new / uvicorn-new": ratio("new", "uvicorn-new"),
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
    width = max([len("scenario"), *(len(row.name) for row in rows)])
    header = (
        f"{'scenario':<{width}} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
        f"{'5xx':>5} {'peak RSS/worker MiB':>20} {'conns/worker':>12} "
        f"{'cores app/pg/load/other':>24} {'CPU ms/req app/pg/redis':>24} {'= sum':>6} "
        f"{'redis/req':>9}  target"
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
        per_request, total, commands = "-", "-", "-"
        if row.usage is not None and r.requests:
            per_request = "/".join(
                f"{1000 * row.usage.cpu_seconds.get(g, 0.0) / r.requests:.2f}"
                for g in SERVED_GROUPS
            )
            total = f"{row.cpu_ms_per_request():.2f}"
            commands = f"{row.usage.redis_commands / r.requests:.2f}"
        lines.append(
            f"{row.name:<{width}} {r.rps:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{errors:>7} {r.server_errors:>5} {rss:>20} {conns:>12} {cpu:>24} "
            f"{per_request:>24} {total:>6} {commands:>9}  {row.target}"
        )
    lines.append(
        "errors: non-2xx answers + transport errors (wrk) or failed transactions (pgbench); "
        "* contention: without its 409s, which are the expected answers (p50/p99 are theirs)"
    )
    lines.append(
        "conns/worker: most client connections each worker held at once; cores: CPU used "
        "by the app workers / PostgreSQL / the load generator / anything else on the "
        "machine, averaged over the scenario; CPU ms/req: CPU time of the app workers / "
        "of PostgreSQL / of Redis per request, and their sum (less noisy than req/s on a "
        "shared machine); redis/req: commands Redis processed per request, whoever sent them (a "
        "Lua script: its EVALSHA and each command it runs)"
    )
    return "\n".join(lines)
