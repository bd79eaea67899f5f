"""What ``make bench`` prints and saves: the table, the throughput ratios, the notes, and
``results/<date>.json`` with every number behind them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.peer_app import LAYERS
from bench.rounds import DISAGREE, Spread, ratio_rounds, spread
from bench.runner import PEER_SERVERS, SERVED, SERVED_GROUPS, Row, Runner
from bench.session import NOISE_CORES, machine

# The figures of a row whose median and spread are reported (JSON key: the row's value).
FIGURES: dict[str, Callable[[Row], float | None]] = {
    "rps": lambda row: row.result.rps,
    "p50_ms": lambda row: row.result.p50_ms,
    "p99_ms": lambda row: row.result.p99_ms,
}
# The process groups whose CPU per request is reported (SERVED: the sum of SERVED_GROUPS).
CPU_GROUPS = (*SERVED_GROUPS, "loadgen", SERVED)


@dataclass
class Summary:
    """A scenario over the rounds it ran in: one row per round, in round order (one row for
    a scenario measured outside the rounds)."""

    name: str
    rows: list[Row]

    def spread(self, value: Callable[[Row], float | None]) -> Spread | None:
        values = [v for v in (value(row) for row in self.rows) if v is not None]
        return spread(values) if values else None

    def by_round(self, value: Callable[[Row], float | None]) -> dict[int | None, float | None]:
        return {row.round: value(row) for row in self.rows}

    @property
    def median_row(self) -> Row:
        """The round whose req/s is the median (the lower of the two middle ones)."""
        ordered = sorted(self.rows, key=lambda row: row.result.rps)
        return ordered[(len(ordered) - 1) // 2]

    def as_dict(self) -> dict[str, Any]:
        """The median round's figures, with req/s, p50, p99, CPU and Redis commands per
        request replaced by their medians over the rounds; each round's figures under
        ``each_round`` and their medians and spreads under ``spread``."""
        median = self.median_row
        out = median.as_dict()
        if len(self.rows) == 1:
            return out
        spreads: dict[str, Any] = {}
        for key, value in FIGURES.items():
            figure = self.spread(value)
            if figure is not None:
                out[key] = round(figure.median, 2)
                spreads[key] = figure.as_dict(2)
        cpu: dict[str, Any] = {}
        for group in CPU_GROUPS:
            figure = self.spread(functools.partial(_cpu, group))
            if figure is not None and "cpu_ms_per_request" in out:
                out["cpu_ms_per_request"][group] = round(figure.median, 3)
                cpu[group] = figure.as_dict(3)
        if cpu:
            spreads["cpu_ms_per_request"] = cpu
        commands = self.spread(_redis_per_request)
        if commands is not None and "redis_commands_per_request" in out:
            out["redis_commands_per_request"] = round(commands.median, 2)
        out["errors_all_rounds"] = sum(row.result.failures for row in self.rows)
        out["server_errors_all_rounds"] = sum(row.result.server_errors for row in self.rows)
        out["median_round"] = median.round
        out["spread"] = spreads
        out["each_round"] = [
            {"round": row.round, **{k: v for k, v in row.as_dict().items() if k != "notes"}}
            for row in self.rows
        ]
        out["notes"] = self.notes()
        return out

    def notes(self) -> list[str]:
        """Each round's notes once: as they are where every round wrote the same, else with
        their round."""
        seen: dict[str, list[int | None]] = {}
        for row in self.rows:
            for note in row.notes:
                seen.setdefault(note, []).append(row.round)
        return [
            note if len(turns) == len(self.rows) else f"round {'/'.join(map(str, turns))}: {note}"
            for note, turns in seen.items()
        ]


def _cpu(group: str, row: Row) -> float | None:
    return row.cpu_ms(group)


def _cell(summary: Summary, value: Callable[[Row], float | None], digits: int) -> str:
    """A figure's median over the rounds, and its spread when there are several."""
    figure = summary.spread(value)
    if figure is None:
        return "-"
    text = f"{figure.median:.{digits}f}"
    if len(figure.rounds) > 1:
        text += f" ±{figure.relative:.0%}"
    return text


def _redis_per_request(row: Row) -> float | None:
    if row.usage is None or not row.result.requests:
        return None
    return row.usage.redis_commands / row.result.requests


def summarize(rows: list[Row]) -> list[Summary]:
    """The rows grouped by scenario, in the order each scenario first ran (round 1 runs the
    systems in their listed order)."""
    found: dict[str, Summary] = {}
    for row in rows:
        found.setdefault(row.name, Summary(row.name, [])).rows.append(row)
    return list(found.values())


def write(runner: Runner) -> dict[str, Any]:
    """Print the table, the ratios and the notes; write them to ``results/<date>.json``."""
    seconds = runner.session.seconds
    summaries = summarize(runner.rows)
    ratios = throughput_ratios(summaries)
    cpu = cpu_ratios(summaries)
    app_cpu = app_cpu_ratios(summaries)
    print()
    print(summary_table(summaries))
    print()
    groups = {
        "ratios": ratios,
        "cpu_per_request_ratios": cpu,
        "app_cpu_per_request_ratios": app_cpu,
    }
    flagged = {
        key: [name for name, figure in group.items() if figure is not None and figure.flagged]
        for key, group in groups.items()
    }
    for title, group in (
        ("throughput ratios (req/s; above 1: the first serves more)", ratios),
        (
            "CPU per request ratios (app workers + PostgreSQL + Redis; below 1: the first uses "
            "less)",
            cpu,
        ),
        ("app CPU per request ratios (the app workers alone)", app_cpu),
    ):
        print(f"{title}; median of the rounds [min-max], spread (max-min)/median:")
        for name, figure in group.items():
            print(f"  {name:<44} {_ratio_text(figure)}")
    if any(flagged.values()):
        print(
            "  FLAGGED: "
            + "; ".join(f"{key}: {', '.join(names)}" for key, names in flagged.items() if names)
            + f": their rounds disagree by more than {DISAGREE:.0%}; read them as noise, not "
            "as a result"
        )
    print()
    print("notes:")
    for summary in summaries:
        for note in summary.notes():
            print(f"  {summary.name}: {note}")
    noisy = [
        f"{row.name}{'' if row.round is None else f' (round {row.round})'} "
        f"{row.usage.other_cores:.2f}"
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
        f"generator; wrk -t2 -c{cfg.connections}, {cfg.duration:g}s per scenario and round "
        f"after {cfg.warmup:g}s warm-up, {cfg.rounds} round(s); cpu = cores used (app "
        "workers / PostgreSQL / loadgen)"
    )
    for turn, order in enumerate(runner.round_order, 1):
        print(f"  round {turn}: {', '.join(order)}")

    def medians(group: dict[str, Spread | None]) -> dict[str, float | None]:
        return {name: None if f is None else round(f.median, 3) for name, f in group.items()}

    def spreads(group: dict[str, Spread | None]) -> dict[str, Any]:
        return {name: None if f is None else f.as_dict() for name, f in group.items()}

    document = {
        "date": runner.session.stamp,
        "config": cfg.__dict__,
        "machine": machine(),
        "scenarios": {summary.name: summary.as_dict() for summary in summaries},
        "ratios": medians(ratios),
        "ratio_spreads": spreads(ratios),
        "cpu_per_request_ratios": medians(cpu),
        "cpu_per_request_ratio_spreads": spreads(cpu),
        "app_cpu_per_request_ratios": medians(app_cpu),
        "app_cpu_per_request_ratio_spreads": spreads(app_cpu),
        "flagged_ratios": flagged,
        "flag_threshold": DISAGREE,
        "round_order": runner.round_order,
        "server_logs": runner.session.server_log_counts,
        "machine_busy_cores_before_run": round(runner.session.busy_before, 2),
        "total_seconds": round(seconds, 1),
    }
    runner.session.save(document, seconds)
    return document


def _ratio_text(figure: Spread | None) -> str:
    if figure is None:
        return "-"
    text = f"{figure.median:.3f}"
    if len(figure.rounds) > 1:
        text += f"  [{figure.low:.3f}-{figure.high:.3f}]  {figure.relative:.0%}"
    return text + ("  FLAGGED" if figure.flagged else "")


# the claim-and-settle sent as a call of its function over the statement sent as is
# (SETTLEMENT_DB_CLAIM_SETTLE, service/store/hot_functions.py)
FUNCTION_PAIR = ("new-function", "new")


def _peer_pairs() -> list[tuple[str, str]]:
    """The server's rows over each peer's: ``new / <layer>-new``, ``replay / <layer>-replay``."""
    return [(mine, f"{layer}-{mine}") for layer in LAYERS for mine in ("new", "replay")]


def _trial_pairs(summaries: list[Summary]) -> list[tuple[str, str]]:
    """A peer's row under the other server over its row: ``<row>@<server> / <row>``."""
    names = {summary.name for summary in summaries}
    pairs = []
    for name in names:
        row, _, server = name.rpartition("@")
        if server in PEER_SERVERS and row in names:
            pairs.append((name, row))
    return sorted(pairs)


def _ratio(
    summaries: list[Summary], a: str, b: str, value: Callable[[Row], float | None]
) -> Spread | None:
    """``value`` of row ``a`` over that of row ``b``, round by round (None where a side is
    missing or zero in every round)."""
    by_name = {summary.name: summary for summary in summaries}
    if a not in by_name or b not in by_name:
        return None
    top, bottom = by_name[a].by_round(value), by_name[b].by_round(value)
    turns = [turn for turn in top if turn in bottom]
    return ratio_rounds([top[t] for t in turns], [bottom[t] for t in turns])


def cpu_ratios(summaries: list[Summary]) -> dict[str, Spread | None]:
    """CPU per request (app workers, PostgreSQL and Redis) of the server over each peer's: less
    noisy than req/s on a shared machine."""
    pairs = [*_peer_pairs(), *_trial_pairs(summaries), FUNCTION_PAIR]
    return {f"{a} / {b}": _ratio(summaries, a, b, _served_cpu) for a, b in pairs}


def app_cpu_ratios(summaries: list[Summary]) -> dict[str, Spread | None]:
    """CPU per request of the app workers alone: a replay over a bare request (no I/O)."""
    return {"replay / bare": _ratio(summaries, "replay", "bare", lambda r: r.cpu_ms("workers"))}


def _served_cpu(row: Row) -> float | None:
    return row.cpu_ms(SERVED)


def throughput_ratios(summaries: list[Summary]) -> dict[str, Spread | None]:
    """req/s of the server over its peers and its baselines, each round's ratio then their
    median and spread (None where a side is missing or zero)."""
    by_name = {summary.name: summary for summary in summaries}

    def ratio(a: str, b: str) -> Spread | None:
        return _ratio(summaries, a, b, lambda row: row.result.rps)

    ratios = {f"{a} / {b}": ratio(a, b) for a, b in _peer_pairs()}
    ratios |= {
        "replay / uvicorn-replay": ratio("replay", "uvicorn-replay"),
        "new / uvicorn-new": ratio("new", "uvicorn-new"),
        "new-function / new": ratio(*FUNCTION_PAIR),
        "new / pgbench-min": ratio("new", "pgbench-min"),
        "replay / bare": ratio("replay", "bare"),
        "new / plain-transfer": ratio("new", "plain-transfer"),
        "plain-transfer / peer-plain-transfer": ratio("plain-transfer", "peer-plain-transfer"),
        "new / pgbench-new": ratio("new", "pgbench-new"),
        "replay / pgbench-read": ratio("replay", "pgbench-read"),
    }
    ratios |= {f"{a} / {b}": ratio(a, b) for a, b in _trial_pairs(summaries)}

    def rps(name: str) -> float:
        return sum(row.result.rps for row in by_name[name].rows)

    info = [rps(f"new@INFO-{t}") for t in (1, 2) if f"new@INFO-{t}" in by_name]
    warning = [rps(f"new@WARNING-{t}") for t in (1, 2) if f"new@WARNING-{t}" in by_name]
    if info and warning and sum(warning):
        ratios["new@INFO / new@WARNING"] = spread([sum(info) / sum(warning)])
    return ratios


def summary_table(summaries: list[Summary]) -> str:
    """One line per scenario: the medians over its rounds, and the spread ((max-min)/median)
    of req/s, p50, p99 and CPU per request."""
    width = max([len("scenario"), *(len(s.name) for s in summaries)])
    header = (
        f"{'scenario':<{width}} {'n':>2} {'req/s':>12} {'p50 ms':>13} {'p99 ms':>14} "
        f"{'errors':>7} {'5xx':>5} {'peak RSS/worker MiB':>20} {'conns/worker':>12} "
        f"{'cores app/pg/load/other':>24} {'CPU ms/req app/pg/redis':>32} "
        f"{'= sum':>12} {'redis/req':>9}  target"
    )
    lines = [header, "-" * len(header)]
    for summary in summaries:
        row = summary.median_row
        cell = functools.partial(_cell, summary)
        rss = "/".join(f"{v:.0f}" for v in row.usage.rss_values) if row.usage else "-"
        cores = "-"
        if row.usage is not None:
            groups = ("workers", "postgres", "loadgen")
            cores = "/".join(f"{row.usage.cores(g):.2f}" for g in groups)
            cores += f"/{row.usage.other_cores:.2f}"
        failures = sum(one.result.failures for one in summary.rows)
        errors = str(failures)
        if summary.name == "contention":
            errors = f"{failures - sum(one.result.statuses.get('409', 0) for one in summary.rows)}*"
        fives = sum(one.result.server_errors for one in summary.rows)
        conns = row.usage.connection_split if row.usage and row.usage.worker_connections else "-"
        parts = [summary.spread(functools.partial(_cpu, g)) for g in SERVED_GROUPS]
        per_request = "-"
        if all(part is not None for part in parts):
            per_request = "/".join(f"{part.median:.2f}" for part in parts if part is not None)
            if len(summary.rows) > 1:
                per_request += " ±" + "/".join(
                    f"{100 * part.relative:.0f}" for part in parts if part is not None
                )
                per_request += "%"
        commands = cell(_redis_per_request, 2).split(" ")[0]
        lines.append(
            f"{summary.name:<{width}} {len(summary.rows):>2} "
            f"{cell(lambda one: one.result.rps, 0):>12} "
            f"{cell(lambda one: one.result.p50_ms, 2):>13} "
            f"{cell(lambda one: one.result.p99_ms, 2):>14} {errors:>7} {fives:>5} {rss or '-':>20} "
            f"{conns:>12} {cores:>24} {per_request:>32} {cell(_served_cpu, 2):>12} "
            f"{commands:>9}  {row.target}"
        )
    lines.append(
        "n: rounds; each figure is the median over them, ±: their spread, (max-min)/median; "
        "errors and 5xx summed over the rounds: non-2xx answers + transport errors (wrk) or "
        "failed transactions (pgbench); * contention: without its 409s, which are the "
        "expected answers (p50/p99 are theirs); RSS, conns and cores: the median round's"
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
