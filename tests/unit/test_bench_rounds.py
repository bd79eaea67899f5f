"""``make bench`` in rounds: each figure's median and spread, each ratio computed round by
round then flagged when its rounds disagree by more than 15 %, the order rotated from round to
round, and the docs' tables rendering a run in rounds beside older runs. Pure, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import results_table
from bench.loadgen import LoadResult
from bench.report import Summary, summarize, throughput_ratios
from bench.rounds import DISAGREE, ratio_rounds, rotated, spread
from bench.runner import Row


def make_row(name: str, rps: float, turn: int | None = 1, p99_ms: float = 10.0) -> Row:
    result = LoadResult(
        requests=round(rps * 10), seconds=10.0, p50_ms=1.0, p99_ms=p99_ms, statuses={"201": 1}
    )
    return Row(name, "target", result, notes=[f"note of {name}"], round=turn)


def test_the_spread_is_the_extremes_over_the_median() -> None:
    figure = spread([90.0, 100.0, 110.0])
    assert (figure.median, figure.low, figure.high) == (100.0, 90.0, 110.0)
    assert figure.relative == pytest.approx(0.2)
    assert figure.flagged
    assert figure.as_dict()["rounds"] == [90.0, 100.0, 110.0]


def test_rounds_within_fifteen_percent_are_not_flagged() -> None:
    assert not spread([100.0, 100.0, 100.0 + 100 * DISAGREE]).flagged
    assert spread([100.0, 100.0, 100.0 + 100 * DISAGREE + 1]).flagged
    assert not spread([5.0]).flagged  # one round cannot disagree with itself


def test_a_spread_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        spread([])


def test_a_ratio_is_taken_round_by_round_then_its_median() -> None:
    figure = ratio_rounds([200.0, 330.0, 240.0], [100.0, 300.0, 200.0])
    assert figure is not None
    assert figure.rounds == pytest.approx((2.0, 1.1, 1.2))
    assert figure.median == pytest.approx(1.2)
    assert figure.flagged  # 2.0 against 1.1: the rounds disagree
    assert ratio_rounds([1.0, None, 3.0], [2.0, 4.0, 0.0]) == spread([0.5])
    assert ratio_rounds([None], [1.0]) is None


def test_the_order_turns_each_round() -> None:
    systems = ["ours", "peer a", "baseline", "peer b", "uvicorn", "pgbench"]
    firsts = [rotated(systems, turn, 3)[0] for turn in range(3)]
    assert firsts == ["ours", "baseline", "uvicorn"]
    assert rotated(["replay", "new"], 1) == ["new", "replay"]
    assert sorted(rotated(systems, 2, 3)) == sorted(systems)
    assert rotated([], 4) == []


def test_a_summary_reports_medians_spreads_and_each_round() -> None:
    rows = [
        make_row("new", rps, turn, p99)
        for turn, (rps, p99) in enumerate([(100, 30), (120, 10), (90, 20)], 1)
    ]
    [summary] = summarize(rows)
    assert summary.median_row.round == 1
    out = summary.as_dict()
    assert (out["rps"], out["p99_ms"]) == (100.0, 20.0)
    assert out["spread"]["rps"] == {
        "median": 100.0,
        "min": 90.0,
        "max": 120.0,
        "spread": 0.3,
        "rounds": [100.0, 120.0, 90.0],
        "flagged": True,
    }
    assert [one["round"] for one in out["each_round"]] == [1, 2, 3]
    assert out["notes"] == ["note of new"]  # the same in every round: said once


def test_the_ratios_pair_rows_of_the_same_round() -> None:
    rows = [
        make_row("new", 100, 1),
        make_row("powertools-new", 50, 1),
        make_row("new", 300, 2),
        make_row("powertools-new", 250, 2),
        make_row("new", 100, 3),
        make_row("powertools-new", 80, 3),
    ]
    ratio = throughput_ratios(summarize(rows))["new / powertools-new"]
    assert ratio is not None
    assert ratio.rounds == pytest.approx((2.0, 1.2, 1.25))
    assert ratio.median == pytest.approx(1.25)
    assert throughput_ratios(summarize(rows))["replay / bare"] is None


def test_a_single_row_keeps_the_figures_of_a_run_without_rounds() -> None:
    out = Summary("status", [make_row("status", 42.0, None)]).as_dict()
    assert out["rps"] == 42.0
    assert "spread" not in out and "each_round" not in out


def test_the_docs_tables_render_old_runs_and_runs_in_rounds(tmp_path: Path) -> None:
    old = {"config": {"workers": 2}, "scenarios": {"new": {"rps": 700.0, "p99_ms": 80.0}}}
    (tmp_path / "2026-01-01T00-00.json").write_text(json.dumps(old))
    rows = [make_row("new", rps, turn) for turn, rps in enumerate([700, 800, 600], 1)]
    rows += [make_row("powertools-new", rps, turn) for turn, rps in enumerate([500, 500, 500], 1)]
    summaries = summarize(rows)
    ratios = throughput_ratios(summaries)
    new = {
        "config": {"workers": 2, "rounds": 3},
        "scenarios": {summary.name: summary.as_dict() for summary in summaries},
        "ratio_spreads": {name: None if f is None else f.as_dict() for name, f in ratios.items()},
    }
    (tmp_path / "2026-01-02T00-00.json").write_text(json.dumps(new))
    assert results_table.bench_rows(tmp_path) == [
        "| `2026-01-01T00-00` | 2 | - | 700 | - | 80.0 | - | - |",
        "| `2026-01-02T00-00` | 2 | - | 700 (600-800) | - | 10.0 (10.0-10.0) | - | - |",
    ]
    [ratio_row] = results_table.ratio_rows(tmp_path)
    assert ratio_row.startswith("| `2026-01-02T00-00` | 3 | 1.40 (1.20-1.60) ⚑ | - |")
