"""Where one worker spends its CPU on the ``replay`` and ``new`` paths: py-spy ``record``.

Starts the same stack as ``make bench`` (embedded PostgreSQL and Redis, the production
server with BENCH_WORKERS workers), seeds the replay keys, then for each scenario drives wrk
at it and samples ONE worker with py-spy (100 Hz, non-blocking, idle frames left out) while
the load runs. Writes to ``bench/results/``:

* ``<date>-profile-<scenario>.svg``: a flame graph (hover a frame for its share);
* ``<date>-profile-<scenario>.txt``: self time by package, top functions by self and by
  inclusive time;
* ``<date>-profile-<scenario>.raw``: py-spy's collapsed stacks.

The sampled worker is the one holding most of wrk's connections when sampling starts.

py-spy is installed into the running virtualenv with pip when missing. Sampling costs the
worker a little CPU: throughput here is lower than in ``make bench``.

Run: ``.venv/bin/python -m bench.profile`` (BENCH_PROFILE_DURATION, default 10 s per
scenario; BENCH_WORKERS, BENCH_CONNECTIONS, BENCH_SEED as for ``make bench``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench import fixtures
from bench.fixtures import TRANSFERS
from bench.flame import load
from bench.loadgen import LoadResult, ensure_wrk, run_wrk, write_requests
from bench.runner import Config
from bench.session import RESULTS, say, seed
from bench.stack import ServerProcess, Stack

# py-spy samples per second.
RATE = 100
# Load runs this long before sampling starts, and on after it ends.
LEAD = 1.5
SCENARIOS = ("replay", "new", "plain-transfer")
DEFAULT_SCENARIOS = ("replay", "new")
# pip install of one wheel.
PIP_TIMEOUT = 300.0


def ensure_py_spy() -> str:
    local = Path(sys.executable).parent / "py-spy"
    found = str(local) if local.exists() else shutil.which("py-spy")
    if found:
        return found
    print("py-spy not found: installing it into this virtualenv with pip", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "py-spy"],
        check=True,
        timeout=PIP_TIMEOUT,
    )
    if not local.exists():
        raise RuntimeError(f"pip installed py-spy, yet {local} is missing")
    return str(local)


@dataclass(frozen=True)
class Profiler:
    """py-spy on one worker of a server under wrk load, for ``duration`` seconds at a time."""

    config: Config
    stamp: str
    duration: float
    py_spy: str

    def under_load(
        self, server: ServerProcess, script: str, args: list[str], name: str
    ) -> tuple[Path, LoadResult]:
        """Run wrk for LEAD + duration + LEAD seconds; sample one worker for ``duration``."""
        duration = self.duration
        raw = RESULTS / f"{self.stamp}-profile-{name}.raw"
        outcome: dict[str, LoadResult] = {}

        def load_it() -> None:
            outcome["result"] = run_wrk(
                server.base_url + "/",
                script,
                args,
                duration=duration + 2 * LEAD,
                connections=self.config.connections,
            )

        loader = threading.Thread(target=load_it, name=f"wrk-{name}")
        loader.start()
        time.sleep(LEAD)
        # the kernel may have given one worker most of wrk's connections: sample the busiest
        connections = server.client_connections()
        pid = max(connections, key=lambda p: connections[p])
        split = "/".join(str(connections[p]) for p in sorted(connections))
        say(f"  connections per worker {split}: sampling pid {pid}")
        subprocess.run(
            [
                self.py_spy,
                *("record", "--pid", str(pid), "--rate", str(RATE)),
                *("--duration", str(round(duration)), "--nonblocking", "--format", "raw"),
                *("--output", str(raw)),
            ],
            check=True,
            capture_output=True,
            timeout=duration + 60,
        )
        loader.join(duration + 2 * LEAD + 60)
        if "result" not in outcome:
            raise RuntimeError(f"wrk did not finish the {name} run")
        return raw, outcome["result"]

    def profile(self, server: ServerProcess, script: str, args: list[str], name: str) -> Path:
        """Profile one scenario; write its .txt and .svg beside the .raw; the .txt path."""
        config = self.config
        say(f"{name}: wrk with py-spy on one worker for {self.duration:g}s")
        raw, result = self.under_load(server, script, args, name)
        profile = load(raw)
        title = (
            f"{name}: one of {config.workers} workers, {result.rps:.0f} req/s overall "
            f"under py-spy, {config.connections} connections"
        )
        expected = RATE * self.duration
        text = profile.report(title) + (
            f"busy: {profile.total} of ~{expected:.0f} samples "
            f"({100 * profile.total / expected:.0f}% of the time on CPU)\n"
        )
        path = RESULTS / f"{self.stamp}-profile-{name}.txt"
        path.write_text(text)
        path.with_suffix(".svg").write_text(profile.svg(title))
        print(text.split("top functions of service/")[0], flush=True)
        return path


def main() -> int:
    config = Config.from_env()
    duration = float(os.environ.get("BENCH_PROFILE_DURATION", "10") or 10)
    stamp = datetime.now().strftime("%Y-%m-%dT%H-%M")
    log_dir = RESULTS / f"{stamp}-profile-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    wanted = [n.strip() for n in os.environ.get("BENCH_PROFILE_SCENARIOS", "").split(",")]
    wanted = [n for n in wanted if n] or list(DEFAULT_SCENARIOS)
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"BENCH_PROFILE_SCENARIOS: unknown {sorted(unknown)}; know {SCENARIOS}")
    written: list[Path] = []
    ensure_wrk()
    profiler = Profiler(config, stamp, duration, ensure_py_spy())
    with Stack(log_dir) as stack:
        fixture = asyncio.run(fixtures.create(stack.database_url))
        with stack.production_server(config.workers) as server:
            say(f"server up: {server.base_url}, {config.workers} worker(s)")
            seed(fixture, server, config.seed)
            replay = write_requests(log_dir / "replay.requests", fixture.seed_requests)
            runs = {
                "replay": ("cycle.lua", [str(replay)]),
                "new": ("fresh.lua", fixture.fresh_args(TRANSFERS, "profile")),
            }
            for name in (n for n in wanted if n in runs):
                script, args = runs[name]
                written.append(profiler.profile(server, script, args, name))
        if "plain-transfer" in wanted:
            with stack.baseline_server(config.workers) as server:
                args = fixture.fresh_args("/bench/plain-transfer", "profile")
                written.append(profiler.profile(server, "fresh.lua", args, "plain-transfer"))
    for path in written:
        say(f"written: {path.relative_to(RESULTS.parents[1])} (and .svg, .raw)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
