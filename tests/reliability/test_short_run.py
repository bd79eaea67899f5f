"""The short reliability run inside ``make test``: two server processes, one PostgreSQL, one
Redis, the provider simulator and two feed observers (its cursor and timestamp feeds) under
concurrent clients and random faults, feed faults among them; the checker must find nothing.
``make chaos`` runs the long one (tests/reliability/chaos.py).

The seed is printed; ``SETTLEMENT_CHAOS_SEED=<n>`` replays the same schedule of actions and
faults (as closely as thread timing allows)."""

from __future__ import annotations

import os
import random

import pytest

from tests.reliability.harness import run

pytestmark = pytest.mark.reliability

# Seconds of load in the short run (the whole test, with start and checks, stays under 3 min).
SHORT_RUN = 45.0


# about 60 s alone, 200 s under make test's coverage of every process on a busy machine
@pytest.mark.timeout(600)
def test_a_short_run_under_faults_loses_nothing_and_does_nothing_twice() -> None:
    seed = int(os.environ.get("SETTLEMENT_CHAOS_SEED") or random.randrange(1, 10**6))
    print(f"\nreliability seed {seed} (SETTLEMENT_CHAOS_SEED={seed} replays it)")
    summary = run(seed, SHORT_RUN)
    print(summary.render())
    assert summary.actions > 20, summary.render()
    assert sum(summary.faults.values()) >= 5, summary.render()
    assert not summary.violations, summary.render()
