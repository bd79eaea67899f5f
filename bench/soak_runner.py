"""How ``make soak`` runs: its configuration, then SOAK_DURATION seconds of load in segments
of two wrk side by side (``new`` and ``replay``), with the workers' RSS series and the CPU of
each group sampled meanwhile.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.fixtures import TRANSFERS, Fixture
from bench.loadgen import LoadResult, run_wrk, write_requests
from bench.session import Session, env_number, say, seed
from bench.stack import ServerProcess, Stack
from bench.usage import RssSeries, Usage, process_cpu_seconds, sample, sample_series

SCRIPTS = {"new": "fresh.lua", "replay": "cycle.lua"}
# the server's workers share one listening socket: which worker accepts wrk's connections is up
# to the kernel, so they are counted in each segment, this long after wrk starts.
CONNECTIONS_AFTER = 2.0


@dataclass(frozen=True)
class SoakConfig:
    workers: int
    duration: float
    connections: int
    replay_connections: int
    segment: float
    interval: float
    baseline: float
    seed: int

    @property
    def new_connections(self) -> int:
        return self.connections - self.replay_connections

    @classmethod
    def from_env(cls) -> SoakConfig:
        config = cls(
            workers=int(env_number("BENCH_WORKERS", 2, 1)),
            duration=env_number("SOAK_DURATION", 600, 10),
            connections=int(env_number("SOAK_CONNECTIONS", 16, 2)),
            replay_connections=int(env_number("SOAK_REPLAY_CONNECTIONS", 4, 0)),
            segment=env_number("SOAK_SEGMENT", 30, 5),
            interval=env_number("SOAK_INTERVAL", 10, 1),
            baseline=env_number("SOAK_BASELINE", 60, 0),
            seed=int(env_number("BENCH_SEED", 1000, 1)),
        )
        if config.new_connections < 1:
            raise SystemExit("SOAK_REPLAY_CONNECTIONS must be below SOAK_CONNECTIONS")
        return config


@dataclass
class Segment:
    """One stretch of load: the wrk runs that went side by side."""

    index: int
    start_s: float
    seconds: float
    results: dict[str, LoadResult]
    # client connections each worker held (pid order), counted CONNECTIONS_AFTER s in
    connections: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start_s": round(self.start_s, 1),
            "seconds": round(self.seconds, 2),
            "client_connections_per_worker": self.connections,
            **{name: result.as_dict() for name, result in self.results.items()},
        }


class Soak:
    """One ``make soak`` run: the load in segments, and what was sampled meanwhile."""

    def __init__(self, config: SoakConfig, stamp: str) -> None:
        self.config = config
        self.session = Session(stamp, "soak")
        self.segments: list[Segment] = []
        self.series = RssSeries([])
        self.usage = Usage()
        self.notes: list[str] = []
        self.load_seconds = 0.0
        self.loadgen_seconds = 0.0

    def run(self) -> Soak:
        """Start the stack and the server, seed the replay keys, soak, stop them; this run."""
        with self.session.start("logs (the server's per-request lines among them)") as (
            stack,
            fixture,
        ):
            server = stack.production_server(self.config.workers)
            with server:
                say(f"production server up: {server.base_url}, {server.workers} worker(s)")
                seed(fixture, server, self.config.seed)
                self.soak(stack, server, fixture)
            self.session.server_errors(server, "production server")
        return self

    def soak(self, stack: Stack, server: ServerProcess, fixture: Fixture) -> None:
        cfg = self.config
        workers = sorted(server.worker_processes(), key=lambda p: p.pid)
        if len(workers) != cfg.workers:
            raise RuntimeError(f"expected {cfg.workers} worker processes, found {len(workers)}")
        self.series = RssSeries([p.pid for p in workers])
        replay_file = write_requests(
            self.session.log_dir / "replay.requests", fixture.seed_requests
        )
        say(
            f"soak: {cfg.duration:g}s at {cfg.connections} connections ({cfg.new_connections} "
            f"new, {cfg.replay_connections} replay) in segments of {cfg.segment:g}s; "
            f"RSS every {cfg.interval:g}s of workers {self.series.pids}"
        )
        began = time.monotonic()
        deadline = began + cfg.duration
        before = process_cpu_seconds()
        with (
            sample(
                workers,
                None,
                postgres=stack.postgres_processes,
                redis=stack.redis_processes,
            ) as usage,
            sample_series(workers, cfg.interval, began, self.series),
        ):
            index = 0
            while (left := deadline - time.monotonic()) >= 1:  # bounded: one segment at most
                index += 1
                length = min(cfg.segment, left)
                self.segments.append(
                    self.segment(server, fixture, replay_file, index, began, length)
                )
                self.progress(self.segments[-1])
            self.load_seconds = time.monotonic() - began
        self.loadgen_seconds = process_cpu_seconds() - before
        usage.cpu_seconds["loadgen"] = self.loadgen_seconds
        self.usage = usage
        gone = set(self.series.pids) - {p.pid for p in server.worker_processes()}
        if gone or self.series.lost:
            self.notes.append(
                f"worker(s) {sorted(gone | self.series.lost)} exited during the soak: "
                "their series end early"
            )

    def segment(
        self,
        server: ServerProcess,
        fixture: Fixture,
        replay_file: Path,
        index: int,
        began: float,
        length: float,
    ) -> Segment:
        cfg = self.config
        url = server.base_url + "/"
        # a new key prefix each segment (and random parts per wrk thread): keys never repeat
        plan = {"new": (fixture.fresh_args(TRANSFERS, f"soak{index}"), cfg.new_connections)}
        if cfg.replay_connections:
            plan["replay"] = ([str(replay_file)], cfg.replay_connections)
        start = time.monotonic()
        futures: dict[str, Future[LoadResult]] = {}
        # each wrk ends at its duration; run_wrk kills one that hangs WRK_GRACE later
        with ThreadPoolExecutor(max_workers=len(plan), thread_name_prefix="wrk") as pool:
            for name, (args, n) in plan.items():
                futures[name] = pool.submit(
                    run_wrk,
                    url,
                    SCRIPTS[name],
                    args,
                    duration=length,
                    connections=n,
                    log_path=self.session.log_dir / f"wrk-{name}.log",
                )
            time.sleep(min(CONNECTIONS_AFTER, length / 2))
            connections: list[int] = []
            with contextlib.suppress(psutil.Error, OSError):
                counts = server.client_connections()
                connections = [counts.get(pid, 0) for pid in self.series.pids]
        results = {}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                self.notes.append(f"segment {index}: wrk ({name}) failed: {first_line}")
                say(f"  segment {index}: wrk ({name}) failed: {first_line}")
        if not results:
            raise RuntimeError(f"every wrk of segment {index} failed; see {self.session.log_dir}")
        return Segment(index, start - began, time.monotonic() - start, results, connections)

    def progress(self, seg: Segment) -> None:
        parts = []
        for name, r in seg.results.items():
            parts.append(
                f"{name} {r.rps:.0f} req/s p99 {r.p99_ms:.0f} ms non-2xx {r.non_2xx}"
                + (f" errors {sum(r.errors.values())}" if r.errors else "")
            )
        if seg.connections:
            parts.append("connections " + "/".join(str(n) for n in seg.connections))
        last = self.series.samples[-1] if self.series.samples else None
        rss = ""
        if last is not None:
            values = "/".join("-" if v is None else f"{v:.1f}" for v in last["rss_mib"])
            rss = f"; RSS {values} MiB at {last['t_s']:.0f}s"
        end = seg.start_s + seg.seconds
        say(f"  {end:5.0f}s segment {seg.index}: " + ", ".join(parts) + rss)
