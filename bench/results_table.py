"""The dated tables of ``docs/benchmarks.md``, made from ``bench/results``.

One row per run of ``make bench`` (``<date>.json``; a run in rounds shows each figure's median
and, in brackets, its lowest and highest round, and has a row of its ratios too) and per run of
``make bench-scale``
(``<date>-scale.json``), and one per fault and system of each run of ``make bench-faults``
(``<date>-faults.json``); soak runs (``<date>-soak.json``) are left out. Every figure is read
from the run's file, none is typed by hand.

Run: ``python -m bench.results_table`` prints the tables; ``--write`` puts them into
``docs/benchmarks.md`` between its markers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "BEGIN",
    "DOC",
    "END",
    "RESULTS",
    "bench_rows",
    "faults_rows",
    "main",
    "ratio_rows",
    "scale_rows",
    "tables",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- results tables: python -m bench.results_table -->\n"
END = "<!-- end of results tables -->\n"

# The CPU per request of what serves a request: app workers, PostgreSQL and Redis.
SERVED = "workers+postgres+redis"
BENCH_HEADER = (
    "| run | workers | replay req/s | new req/s | status req/s | new p99 ms "
    "| new app CPU ms/req | new app+PG+Redis CPU ms/req |\n"
    "|---|---|---|---|---|---|---|---|"
)
# The ratios of a run in rounds: (JSON group, name) per column.
RATIOS = (
    ("ratio_spreads", "new / powertools-new"),
    ("ratio_spreads", "replay / powertools-replay"),
    ("ratio_spreads", "new / asgi-idem-new"),
    ("ratio_spreads", "replay / asgi-idem-replay"),
    ("ratio_spreads", "new / pgbench-min"),
    ("ratio_spreads", "replay / bare"),
    ("app_cpu_per_request_ratio_spreads", "replay / bare"),
)
RATIOS_HEADER = (
    "| run | rounds | new / powertools-new | replay / powertools-replay | new / asgi-idem-new "
    "| replay / asgi-idem-replay | new / pgbench-min | replay / bare "
    "| replay / bare, app CPU ms/req |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
# After a ratio whose rounds disagree by more than 15 % (bench.rounds.DISAGREE).
FLAG = " ⚑"
SCALE_HEADER = (
    "| run | rows | replay at size / empty | new at size / empty | status at size / empty "
    "| new CPU ms/req empty → at size |\n"
    "|---|---|---|---|---|---|"
)
FAULTS_HEADER = (
    "| run | fault | system | keys sent | transfers made | keys moved twice "
    "| answers lost at the retry | answers lost (transfer made / not) | 5xx (first / retries) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def _figure(value: object, digits: int = 1) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,.{digits}f}"
    return "-"


def _spread_figure(data: Mapping[str, Any], scenario: str, *path: str, digits: int = 1) -> str:
    """A figure of ``scenario``: its median and ``(min-max)`` over the rounds where the run
    recorded them, else its one value."""
    value = _figure(_get(data, "scenarios", scenario, *path), digits)
    spread = _get(data, "scenarios", scenario, "spread", *path)
    if not isinstance(spread, Mapping) or len(spread.get("rounds", [])) < 2:
        return value
    return f"{value} ({_figure(spread.get('min'), digits)}-{_figure(spread.get('max'), digits)})"


def _get(data: Mapping[str, Any], *path: str) -> object:
    here: object = data
    for key in path:
        if not isinstance(here, Mapping) or key not in here:
            return None
        here = here[key]
    return here


def _runs(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each result file's stem and content, by name (the date sorts first)."""
    return [(path.stem, json.loads(path.read_text())) for path in sorted(directory.glob("*.json"))]


def bench_rows(directory: Path = RESULTS) -> list[str]:
    """A row per ``make bench`` run."""
    rows = []
    for stem, data in _runs(directory):
        if stem.endswith(("-soak", "-scale", "-faults")) or "new" not in data.get("scenarios", {}):
            continue
        cpu = _get(data, "scenarios", "new", "cpu_ms_per_request")
        total = _get(data, "scenarios", "new", "cpu_ms_per_request", SERVED)
        if total is None and isinstance(cpu, Mapping):
            parts = [cpu.get(one) for one in ("workers", "postgres", "redis")]
            numbers = [float(one) for one in parts if isinstance(one, int | float)]
            if len(numbers) == len(parts):
                total = sum(numbers)
        cells = [
            f"`{stem}`",
            str(_get(data, "config", "workers") or "-"),
            _spread_figure(data, "replay", "rps", digits=0),
            _spread_figure(data, "new", "rps", digits=0),
            _spread_figure(data, "status", "rps", digits=0),
            _spread_figure(data, "new", "p99_ms"),
            _spread_figure(data, "new", "cpu_ms_per_request", "workers", digits=2),
            _spread_figure(data, "new", "cpu_ms_per_request", SERVED, digits=2)
            if _get(data, "scenarios", "new", "spread", "cpu_ms_per_request", SERVED)
            else _figure(total, 2),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def ratio_rows(directory: Path = RESULTS) -> list[str]:
    """A row per ``make bench`` run in rounds: each headline ratio's median over the rounds
    (each round's ratio of that round's rows), its lowest and highest round, and ⚑ where they
    disagree by more than 15 %."""
    rows = []
    for stem, data in _runs(directory):
        if stem.endswith(("-soak", "-scale", "-faults")) or "ratio_spreads" not in data:
            continue
        cells = [f"`{stem}`", str(_get(data, "config", "rounds") or "-")]
        for group, name in RATIOS:
            ratio = _get(data, group, name)
            if not isinstance(ratio, Mapping):
                cells.append("-")
                continue
            cell = (
                f"{_figure(ratio.get('median'), 2)} ({_figure(ratio.get('min'), 2)}-"
                f"{_figure(ratio.get('max'), 2)})"
            )
            cells.append(cell + (FLAG if ratio.get("flagged") else ""))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def scale_rows(directory: Path = RESULTS) -> list[str]:
    """A row per ``make bench-scale`` run: throughput at size over throughput empty."""
    rows = []
    for stem, data in _runs(directory):
        if not stem.endswith("-scale"):
            continue
        ratio = "at_size_over_empty"
        cells = [
            f"`{stem}`",
            _figure(_get(data, "config", "rows"), 0),
            _figure(_get(data, ratio, "replay", "rps_ratio"), 2),
            _figure(_get(data, ratio, "new", "rps_ratio"), 2),
            _figure(_get(data, ratio, "status", "rps_ratio"), 2),
            f"{_figure(_get(data, ratio, 'new', 'cpu_ms_empty'), 2)} → "
            f"{_figure(_get(data, ratio, 'new', 'cpu_ms_at_size'), 2)}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def faults_rows(directory: Path = RESULTS) -> list[str]:
    """A row per fault and system of each ``make bench-faults`` run, in its run order."""
    rows = []
    for stem, data in _runs(directory):
        if not stem.endswith("-faults"):
            continue
        for run in data.get("runs", []):
            lost = (
                f"{_figure(run.get('answers_lost'), 0)} "
                f"({_figure(run.get('lost_with_transfer'), 0)} / "
                f"{_figure(run.get('lost_without_transfer'), 0)})"
            )
            cells = [
                f"`{stem}`",
                str(run.get("fault", "-")),
                str(run.get("system", "-")),
                _figure(run.get("keys_sent"), 0),
                _figure(run.get("transfers_made"), 0),
                _figure(run.get("keys_moved_twice"), 0),
                _figure(run.get("lost_at_retry"), 0),
                lost,
                f"{_figure(run.get('first_5xx'), 0)} / {_figure(run.get('retry_5xx'), 0)}",
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def tables(directory: Path = RESULTS) -> str:
    """The tables, as they stand between the markers of ``docs/benchmarks.md``."""
    return (
        "`make bench`, one row per run (a run in rounds: the median of its rounds, and in "
        "brackets the lowest and the highest):\n\n"
        + "\n".join([BENCH_HEADER, *bench_rows(directory)])
        + "\n\n`make bench` in rounds, its ratios of req/s (and of the app's CPU per request), "
        "each the median of the ratios of its rounds, in brackets the lowest and the highest; "
        f"{FLAG.strip()}: the rounds disagree by more than 15 % ((max - min) / median):\n\n"
        + "\n".join([RATIOS_HEADER, *ratio_rows(directory)])
        + "\n\n`make bench-scale`, one row per run:\n\n"
        + "\n".join([SCALE_HEADER, *scale_rows(directory)])
        + "\n\n`make bench-faults`, one row per fault and system of each run:\n\n"
        + "\n".join([FAULTS_HEADER, *faults_rows(directory)])
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.results_table", description=__doc__)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    text = tables()
    if not args.write:
        print(text, end="")
        return 0
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + text + doc[end:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
