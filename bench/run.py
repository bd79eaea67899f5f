"""``make bench``: throughput, latency and memory of the settlement server, with baselines.

Starts embedded PostgreSQL and Redis (not durable) in a temporary directory, then

* the production server (``python -m service.cli serve --workers N``) for the scenarios
  ``replay``, ``new``, ``status`` and ``contention``;
* the same app with two baseline routes (``python -m bench.bare_app``, same server options)
  for ``bare`` and ``plain-transfer`` (and, with BENCH_LOG_COST=1, ``new`` at log levels INFO
  and WARNING in turn, twice: what the per-request log lines cost);
* the peers (``python -m bench.peer_app``, one server each, the same workers, under granian
  with the same server options or under uvicorn, ``bench.peer_scenarios.PEER_SERVER``): the
  same transfer behind aws-lambda-powertools' idempotency on Redis, for ``powertools-replay``,
  ``powertools-new`` (and ``peer-plain-transfer``, without it), and behind
  asgi-idempotency-header's middleware on Redis, for ``asgi-idem-replay`` and
  ``asgi-idem-new``;
* pgbench with the server's own SQL for ``pgbench-new`` and ``pgbench-read``, and the least
  SQL of a transfer for ``pgbench-min``.

Every server starts once and stays up; the rows the ratios need run in BENCH_ROUNDS rounds,
the order turned each round; ``status`` and ``contention`` once, after them. One scenario at a
time, nothing else of the bench running meanwhile. Prints one table (each row's median over
its rounds and their spread) and the ratios (each computed round by round: their median and
spread, flagged where the rounds disagree by more than 15 %) and writes them to
``bench/results/<date>.json``; logs go to ``bench/results/<date>-logs/``.

Scenarios and the rounds: ``bench.scenarios`` (the peers': ``bench.peer_scenarios``); the
measuring: ``bench.runner``; medians, spreads and flags: ``bench.rounds``; the table and the
JSON: ``bench.report``; start-up shared with
``make soak``: ``bench.session``.

Environment: BENCH_WORKERS (2), BENCH_DURATION (10 s per scenario and round), BENCH_ROUNDS (3),
BENCH_CONNECTIONS (32),
BENCH_WARMUP (2 s before each wrk scenario), BENCH_CONTENTION_CLIENTS (200), BENCH_SEED
(1000 completed transfers for replay and status), BENCH_LOG_COST (0; 1 adds the log-level
diagnostic, about a minute), BENCH_PEER_SERVER (each peer's own: granian or uvicorn for
both), BENCH_PEER_TRIAL (0; 1 also measures each peer under the other server).
"""

from __future__ import annotations

import sys

from bench import report, scenarios, session
from bench.runner import Config, Runner


def main() -> int:
    config = Config.from_env()
    return session.main(lambda stamp: report.write(Runner(config, stamp).run(scenarios.ALL)))


if __name__ == "__main__":
    sys.exit(main())
