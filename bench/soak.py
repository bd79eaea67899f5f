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

The run: ``bench.soak_runner``; the table and the JSON: ``bench.soak_report``; start-up shared
with ``make bench``: ``bench.session``.

Environment: BENCH_WORKERS (2), BENCH_SEED (1000), SOAK_DURATION (600 s), SOAK_CONNECTIONS
(16), SOAK_REPLAY_CONNECTIONS (4), SOAK_SEGMENT (30 s), SOAK_INTERVAL (10 s), SOAK_BASELINE
(60 s). With the defaults a run takes about eleven minutes.
"""

from __future__ import annotations

import sys

from bench import session, soak_report
from bench.soak_runner import Soak, SoakConfig


def main() -> int:
    config = SoakConfig.from_env()
    return session.main(lambda stamp: soak_report.write(Soak(config, stamp).run()))


if __name__ == "__main__":
    sys.exit(main())
