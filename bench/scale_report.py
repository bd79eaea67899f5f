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

    compared = {a: _compare(rows.get(a), rows.get(b)) for a, b in PAIRS}
    print()
    print(f"at size ({scale.scale.rows:,} operations filled) / empty, same run:")
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

    rss = {
        name: rows[name].usage.rss_values
        for name in ("replay", "new", "status", "replay@size", "new@size", "status@size")
        if name in rows and rows[name].usage is not None
    }
    print()
    print("server workers' peak RSS (MiB, per worker):")
    for name, values in rss.items():
        print(f"  {name:<12} {'/'.join(f'{v:.0f}' for v in values)}")

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
        "peak_rss_mib_per_worker": rss,
        "server_logs": runner.session.server_log_counts,
        "machine_busy_cores_before_run": round(runner.session.busy_before, 2),
        "total_seconds": round(seconds, 1),
    }
    runner.session.save(document, seconds)
    return document


def _compare(empty: Row | None, sized: Row | None) -> dict[str, Any] | None:
    if empty is None or sized is None or not empty.result.rps:
        return None
    cpu_empty, cpu_sized = empty.cpu_ms_per_request(), sized.cpu_ms_per_request()
    rps_ratio = sized.result.rps / empty.result.rps
    cpu_ratio = cpu_sized / cpu_empty if cpu_empty else None
    return {
        "rps_empty": round(empty.result.rps, 1),
        "rps_at_size": round(sized.result.rps, 1),
        "rps_ratio": round(rps_ratio, 3),
        "cpu_ms_empty": round(cpu_empty, 3),
        "cpu_ms_at_size": round(cpu_sized, 3),
        "cpu_ratio": None if cpu_ratio is None else round(cpu_ratio, 3),
        "p99_ms_empty": round(empty.result.p99_ms, 2),
        "p99_ms_at_size": round(sized.result.p99_ms, 2),
        "within_goal": rps_ratio >= 1 - WITHIN and (cpu_ratio is None or cpu_ratio <= 1 + WITHIN),
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
