"""What every bench entry point shares: its start-up (the machine's load before the run, the
embedded stack, the fixture, the seeded replay keys), the server-log count, and where and how
results are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.client import send_all
from bench.fixtures import TRANSFERS, Fixture
from bench.loadgen import ensure_wrk
from bench.stack import ServerProcess, Stack
from bench.usage import machine_busy_seconds

RESULTS = Path(__file__).resolve().parent / "results"
# Connections of the seeding client (setup, not measured).
SEED_CONCURRENCY = 32
# Cores used by other programs during a scenario above which its numbers are called noisy.
NOISE_CORES = 0.25
# What the server logs (at error level, with a traceback) for a request whose client left.
DISCONNECT = "client disconnected prematurely"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def env_number(name: str, default: float, minimum: float) -> float:
    """A number from the environment; a bad one stops the run with a message naming it."""
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw.strip() else default
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise SystemExit(f"{name} must be >= {minimum:g}, got {raw!r}")
    return value


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def main(run: Callable[[str], object]) -> int:
    """An entry point's exit status: ``run(stamp)`` with ``results/`` made; after Ctrl-C every
    server is already stopped (each ``with`` has closed)."""
    stamp = datetime.now().strftime("%Y-%m-%dT%H-%M")
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        run(stamp)
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130
    return 0


def seed(fixture: Fixture, server: ServerProcess, n: int) -> None:
    """``n`` completed transfers with keys replay-1..N (pairs in turn), for replay and status."""
    fixture.seed_requests = fixture.seed_transfers(server.port, TRANSFERS, "replay", n)
    answers = send_seed(server, fixture.seed_requests)
    fixture.operation_ids = [headers["operation-id"] for _, headers, _ in answers]


def send_seed(
    server: ServerProcess, requests: list[bytes]
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send each seeding request once; every answer must be a 201."""
    began = time.monotonic()
    answers = asyncio.run(send_all(server.port, requests, concurrency=SEED_CONCURRENCY))
    bad = [status for status, _, _ in answers if status != 201]
    if bad or len(answers) != len(requests):
        raise RuntimeError(f"seeding failed: {len(answers)} answers, statuses {set(bad)}")
    say(f"seeded {len(requests)} completed transfers in {time.monotonic() - began:.1f}s")
    return answers


class Session:
    """One run: its names under ``results/`` (``<stamp>[-<kind>].json`` and ``...-logs/``), the
    machine's load before it, its duration, and the error and warning lines of each server it
    started."""

    def __init__(self, stamp: str, kind: str | None = None) -> None:
        self.stamp = stamp
        self.name = stamp if kind is None else f"{stamp}-{kind}"
        self.log_dir = RESULTS / f"{self.name}-logs"
        self.began = time.monotonic()
        self.busy_before = 0.0
        self.server_log_counts: dict[str, dict[str, int]] = {}

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.began

    @contextlib.contextmanager
    def start(self, logs: str = "logs") -> Iterator[tuple[Stack, Fixture]]:
        """wrk at hand, one quiet second to measure what else the machine is doing, then
        embedded PostgreSQL and Redis with the bench client and accounts; stopped at exit."""
        self.began = time.monotonic()
        ensure_wrk()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        say(f"{logs}: {self.log_dir}")
        idle_before = machine_busy_seconds()
        time.sleep(1)
        self.busy_before = machine_busy_seconds() - idle_before
        if self.busy_before > NOISE_CORES:
            say(
                f"WARNING: the machine is busy before the run ({self.busy_before:.2f} cores in "
                "use by other programs): expect low, noisy numbers"
            )
        with Stack(self.log_dir) as stack:
            say(f"PostgreSQL and Redis up in {self.seconds:.1f}s")
            yield stack, asyncio.run(fixtures.create(stack.database_url))

    def save(self, document: dict[str, Any], seconds: float) -> Path:
        """Write ``document`` to ``results/<name>.json`` and say so."""
        path = RESULTS / f"{self.name}.json"
        path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"\nsaved {path.relative_to(RESULTS.parents[1])}; total {seconds:.0f}s")
        return path

    def server_errors(self, server: ServerProcess, what: str) -> None:
        """Count the server's error and warning lines; a request cut off by wrk's own stop
        (it closes its connections with requests in flight) is counted apart."""
        counts = {"error_lines": 0, "client_disconnects": 0, "warning_lines": 0}
        with server.log_path.open(errors="replace") as log:
            for line in log:
                if '"level": "warning"' in line:
                    counts["warning_lines"] += 1
                elif '"level": "error"' in line:
                    kind = "client_disconnects" if DISCONNECT in line else "error_lines"
                    counts[kind] += 1
        self.server_log_counts[what] = counts
        if counts["error_lines"]:
            say(f"  {what}: {counts['error_lines']} error line(s) in {server.log_path}")
