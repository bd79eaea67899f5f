"""What ``make bench-scale`` prints and saves: the rows in ``make bench``'s table, the ratios
at size over empty side by side, the purge's rate against the ingest rate, the sizes per
million operations, the workers' peak RSS, and ``results/<date>-scale.json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench import report
from bench.runner import Row
from bench.session import NOISE_CORES, machine

if TYPE_CHECKING:
    from bench.scale import Scale

# The goals of the issue: a request at size costs within 15 % of one on an empty database,
# and the purge keeps up with at least 3 times the rate operations arrive.
WITHIN = 0.15
PURGE_OVER_INGEST = 3.0
# The scenarios compared, each as (empty, at size).
PAIRS = (("new", "new@size"), ("replay", "replay@size"), ("status", "status@size"))
MIB = 1024 * 1024


def write(scale: Scale) -> dict[str, Any]:
    runner = scale.runner
    rows = {row.name: row for row in runner.rows}
    seconds = runner.session.seconds
    print()
    print(report.table(runner.rows))

    rounds = scale.scale.rounds
    compared = {a: _compare(_rounds(rows, a, rounds), _rounds(rows, b, rounds)) for a, b in PAIRS}
    print()
    print(
        f"at size ({scale.scale.rows:,} operations filled) / empty, same run, {rounds} "
        "round(s) in turn (req/s and CPU over all of them; p99: the worst round):"
    )
    print(
        f"  {'scenario':<8} {'req/s empty':>12} {'at size':>9} {'ratio':>7}   "
        f"{'CPU ms/req empty':>16} {'at size':>8} {'ratio':>7}   "
        f"{'p99 ms empty':>12} {'at size':>8}   within {WITHIN:.0%}"
    )
    for name, c in compared.items():
        if c is None:
            print(f"  {name:<8} -")
            continue
        print(
            f"  {name:<8} {c['rps_empty']:>12.0f} {c['rps_at_size']:>9.0f} "
            f"{c['rps_ratio']:>7.3f}   {c['cpu_ms_empty']:>16.3f} {c['cpu_ms_at_size']:>8.3f} "
            f"{c['cpu_ratio']:>7.3f}   {c['p99_ms_empty']:>12.2f} {c['p99_ms_at_size']:>8.2f}   "
            f"{'yes' if c['within_goal'] else 'NO'}"
        )
    print(
        "  ratio of req/s (below 1: slower at size) and of CPU per request of app workers + "
        "PostgreSQL + Redis (above 1: dearer at size; less noisy on a shared machine)"
    )
    print("  PostgreSQL blocks per request (pg_stat_database; read: not in shared buffers):")
    for name, c in compared.items():
        if c is None:
            continue
        e, z = c["shared_blocks_per_request_empty"], c["shared_blocks_per_request_at_size"]
        if e is None or z is None:
            continue
        print(
            f"    {name:<8} empty: hit {e['hit']:.1f}, read {e['read']:.2f}; "
            f"at size: hit {z['hit']:.1f}, read {z['read']:.2f}"
        )

    purge = scale.purge.as_dict()
    ingest = rows["new+purge"].result.rps if "new+purge" in rows else 0.0
    purge["backlog_operations"] = scale.backlog
    purge["ingest_operations_per_second"] = round(ingest, 1)
    purge["purge_over_ingest"] = (
        round(purge["operations_per_second"] / ingest, 2) if ingest else None
    )
    purge["keeps_up_3x"] = bool(
        purge["purge_over_ingest"] and purge["purge_over_ingest"] >= PURGE_OVER_INGEST
    )
    print()
    print(
        f"retention purge beside new at full speed (clock {scale.purge.ahead / 3600:.1f} h "
        f"ahead, backlog {scale.backlog:,} expired operations):"
    )
    print(
        f"  {purge['operations_purged']:,} operations in {purge['seconds']:.1f}s = "
        f"{purge['operations_per_second']:,.0f}/s; new at {ingest:,.0f} req/s meanwhile; "
        f"purge / ingest = {purge['purge_over_ingest']} (goal >= {PURGE_OVER_INGEST:g}: "
        f"{'yes' if purge['keeps_up_3x'] else 'NO'})"
        + ("; the backlog ran out first: a lower bound" if purge["backlog_ran_out"] else "")
    )
    if purge["error"]:
        print(f"  ERROR in the purge: {purge['error']}")

    operations = scale.sizes.get("operations", {}).get("rows", 0)
    per_million = _per_million(scale.sizes, operations)
    print()
    print(f"sizes after the fill ({operations:,} operations; MiB per million operations):")
    print(f"  {'table':<17} {'rows':>11} {'heap':>8} {'indexes':>8} {'total':>8}  largest index")
    for table, size in scale.sizes.items():
        pm = per_million[table]
        biggest = max(size["indexes"].items(), key=lambda kv: kv[1], default=("-", 0))
        print(
            f"  {table:<17} {size['rows']:>11,} {pm['heap_mib']:>8.1f} {pm['index_mib']:>8.1f} "
            f"{pm['total_mib']:>8.1f}  {biggest[0]} "
            f"({biggest[1] * 1e6 / max(operations, 1) / MIB:.1f})"
        )
    total = sum(pm["total_mib"] for pm in per_million.values())
    print(f"  all of them: {total:.0f} MiB per million operations")
    tombstones = scale.sizes_after_purge.get("tombstones")
    if tombstones and tombstones["rows"]:
        print(
            f"  after the purge: {tombstones['rows']:,} tombstones, "
            f"{tombstones['total_bytes'] / MIB:.1f} MiB "
            f"({tombstones['total_bytes'] * 1e6 / tombstones['rows'] / MIB:.1f} MiB per million)"
        )

    print()
    print("plans at size (EXPLAIN ANALYZE, once, rolled back; the whole plans are in the JSON):")
    for name, plan in scale.plans.items():
        ms = plan["execution_ms"]
        print(f"  {name:<52} {'-' if ms is None else f'{ms:8.3f} ms'}  {_scans(plan['plan'])}")

    rss = {row.name: row.usage.rss_values for row in runner.rows if row.usage is not None}
    print()
    print("server workers' peak RSS (MiB, per worker):")
    for name, values in rss.items():
        print(f"  {name:<14} {'/'.join(f'{v:.0f}' for v in values)}")

    noisy = [
        f"{row.name} {row.usage.other_cores:.2f}"
        for row in runner.rows
        if row.usage is not None and row.usage.other_cores > NOISE_CORES
    ]
    print()
    if noisy or runner.session.busy_before > NOISE_CORES:
        print(
            "WARNING: other work on the machine took CPU during "
            + (", ".join(noisy) or "the start")
            + " (cores): req/s are low and noisy there; CPU per request is steadier"
        )
    filled = scale.filled
    document = {
        "date": runner.session.stamp,
        "config": {**scale.config.__dict__, **scale.scale.__dict__},
        "machine": machine(),
        "fill": {
            "operations": filled.operations if filled else 0,
            "seconds": round(filled.seconds, 1) if filled else None,
            "operations_per_second": round(filled.operations / filled.seconds, 1)
            if filled and filled.seconds
            else None,
            "chunks": filled.chunks if filled else 0,
            "vacuum_analyze_seconds": round(scale.vacuum_seconds, 1),
        },
        "scenarios": {row.name: row.as_dict() for row in runner.rows},
        "at_size_over_empty": compared,
        "purge": purge,
        "sizes_after_fill": scale.sizes,
        "sizes_after_fill_mib_per_million_operations": per_million,
        "sizes_after_purge": scale.sizes_after_purge,
        "plans_at_size": scale.plans,
        "peak_rss_mib_per_worker": rss,
        "server_logs": runner.session.server_log_counts,
        "machine_busy_cores_before_run": round(runner.session.busy_before, 2),
        "total_seconds": round(seconds, 1),
    }
    runner.session.save(document, seconds)
    return document


def _scans(plan: list[str]) -> str:
    """The scans of a plan, in order: which index (or none) each table was read by."""
    found = []
    for line in plan:
        text = line.strip().removeprefix("->").strip()
        if " Scan " in text or text.startswith(("Seq Scan", "Index", "Bitmap")):
            found.append(text.split("  (")[0])
    return "; ".join(found)


def _rounds(rows: dict[str, Row], name: str, rounds: int) -> list[Row]:
    """The rows of scenario ``name`` in each round (``name``, ``name#2``, ...)."""
    names = [name] + [f"{name}#{turn}" for turn in range(2, rounds + 1)]
    return [rows[n] for n in names if n in rows]


def _compare(empty: list[Row], sized: list[Row]) -> dict[str, Any] | None:
    """req/s, CPU ms per request (app workers, PostgreSQL, Redis) and p99 of each side over
    its rounds, and the ratios at size over empty."""
    if not empty or not sized:
        return None

    def side(rows: list[Row]) -> tuple[float, float, float]:
        requests = sum(r.result.requests for r in rows)
        seconds = sum(r.result.seconds for r in rows)
        cpu = sum(r.cpu_ms_per_request() * r.result.requests for r in rows)
        return (
            requests / seconds if seconds else 0.0,
            cpu / requests if requests else 0.0,
            max(r.result.p99_ms for r in rows),
        )

    def blocks(rows: list[Row]) -> dict[str, float] | None:
        counted = [r.extra["shared_blocks"] for r in rows if "shared_blocks" in r.extra]
        requests = sum(c["requests"] for c in counted)
        if not requests:
            return None
        return {
            "hit": round(sum(c["hit"] for c in counted) / requests, 2),
            "read": round(sum(c["read"] for c in counted) / requests, 2),
        }

    rps_empty, cpu_empty, p99_empty = side(empty)
    rps_sized, cpu_sized, p99_sized = side(sized)
    if not rps_empty or not cpu_empty:
        return None
    rps_ratio = rps_sized / rps_empty
    cpu_ratio = cpu_sized / cpu_empty
    return {
        "rounds": len(empty),
        "rps_empty": round(rps_empty, 1),
        "rps_at_size": round(rps_sized, 1),
        "rps_ratio": round(rps_ratio, 3),
        "cpu_ms_empty": round(cpu_empty, 3),
        "cpu_ms_at_size": round(cpu_sized, 3),
        "cpu_ratio": round(cpu_ratio, 3),
        "p99_ms_empty": round(p99_empty, 2),
        "p99_ms_at_size": round(p99_sized, 2),
        "shared_blocks_per_request_empty": blocks(empty),
        "shared_blocks_per_request_at_size": blocks(sized),
        "rps_ratio_per_round": [
            round(b.result.rps / a.result.rps, 3) if a.result.rps else None
            for a, b in zip(empty, sized, strict=False)
        ],
        "within_goal": rps_ratio >= 1 - WITHIN and cpu_ratio <= 1 + WITHIN,
    }


def _per_million(sizes: dict[str, Any], operations: int) -> dict[str, dict[str, float]]:
    scale = 1e6 / max(operations, 1) / MIB
    return {
        table: {
            "heap_mib": round(size["heap_bytes"] * scale, 2),
            "index_mib": round(size["index_bytes"] * scale, 2),
            "total_mib": round(size["total_bytes"] * scale, 2),
        }
        for table, size in sizes.items()
    }
