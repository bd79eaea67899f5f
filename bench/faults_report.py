"""What ``make bench-faults`` prints and saves: one line per fault and system, side by side,
the definitions of its columns, and ``results/<date>-faults.json`` with every figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.faults_count import NOT_YET
from bench.session import Session, machine
from bench.stack import ROOT

__all__ = ["DEFINITIONS", "code", "table", "write"]

DEFINITIONS = {
    "keys_sent": "keys whose first request was sent (each key is one intended transfer)",
    "transfers_made": "transfer rows of those keys in the run's database",
    "keys_moved_twice": "keys with more than one transfer row: money moved twice",
    "extra_transfers": "transfer rows beyond the first of each key",
    "answers_lost": (
        "keys whose final retry got no definitive answer: no answer, a 5xx, or a 4xx of "
        f"{sorted(NOT_YET)} (a 2xx or any other 4xx is definitive); split by whether the "
        "database holds a transfer for the key"
    ),
    "lost_at_retry": "keys whose first retry got no definitive answer (before the late one)",
    "told_but_not_moved": "keys whose final retry got a 2xx but which have no transfer row",
    "first_no_answer": "first requests that got no answer (reset, closed or timed out)",
    "5xx": "5xx answers to the first requests, and to the retries and late retries",
    "retry": (
        "one plain resend of each key's request after the pass (same key, same body), and "
        "a late one, BENCH_FAULT_LATE seconds later, of each key whose retry got no "
        "definitive answer"
    ),
}


def _statuses(counts: Mapping[str, int]) -> str:
    return " ".join(f"{status}:{n}" for status, n in counts.items()) or "-"


def table(runs: Sequence[Mapping[str, Any]]) -> str:
    """One line per run, in run order (each fault, then each system)."""
    header = (
        f"{'fault':<12} {'system':<11} {'keys':>5} {'transfers':>9} {'moved 2x':>8} "
        f"{'extra':>6} {'lost':>5} {'(moved/not)':>11} {'lost@retry':>10} "
        f"{'5xx 1st/retry':>13} {'1st no answer':>13}  retry answers; late"
    )
    lines = [header, "-" * len(header)]
    for run in runs:
        split = f"({run['lost_with_transfer']}/{run['lost_without_transfer']})"
        fivexx = f"{run['first_5xx']}/{run['retry_5xx']}"
        answers = _statuses(run["retry_statuses"])
        if run["late_statuses"]:
            answers += f"; {_statuses(run['late_statuses'])}"
        lines.append(
            f"{run['fault']:<12} {run['system']:<11} {run['keys_sent']:>5} "
            f"{run['transfers_made']:>9} {run['keys_moved_twice']:>8} "
            f"{run['extra_transfers']:>6} {run['answers_lost']:>5} {split:>11} "
            f"{run['lost_at_retry']:>10} {fivexx:>13} {run['first_no_answer']:>13}  {answers}"
        )
    return "\n".join(lines)


def code() -> dict[str, Any]:
    """The commit the run measured, and the files of the working tree that differed from it
    (a run measures the tree, committed or not)."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=30
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    where = ("--", "service", "bench", "migrations")
    changed = git("diff", "--name-only", "HEAD", *where).splitlines()
    added = git("ls-files", "--others", "--exclude-standard", *where).splitlines()
    return {"commit": git("rev-parse", "HEAD") or None, "uncommitted": changed + added}


def write(current: Session, config: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> None:
    """Print the table, the definitions and what each fault did; write the JSON."""
    print()
    print(table(runs))
    print()
    for name, meaning in DEFINITIONS.items():
        print(f"  {name}: {meaning}")
    print()
    for run in runs:
        ledger = run["ledger"]
        agrees = "agree" if ledger["agrees"] else "DISAGREE"
        struck = run["in_flight_at_strike"]
        in_flight = (
            f"struck after {run['answered_at_strike']} answers with {struck} requests in flight; "
            if struck >= 0
            else ""
        )
        print(
            f"  {run['fault']} / {run['system']}: {run['fault_detail']}; {in_flight}first answers "
            f"{_statuses(run['first_statuses'])}; accounts and transfers {agrees} "
            f"(out {ledger['left_sources']}, in {ledger['reached_destinations']}, "
            f"transfers {ledger['transferred']}); {run['seconds']:.1f}s"
        )
    seconds = current.seconds
    document = {
        "date": current.stamp,
        "config": dict(config),
        "machine": machine(),
        "code": code(),
        "definitions": DEFINITIONS,
        "runs": list(runs),
        "total_seconds": round(seconds, 1),
    }
    current.save(document, seconds)
