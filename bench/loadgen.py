"""Load generators: wrk (Lua scripts), pgbench (custom scripts) and a small asyncio HTTP/1.1
client for what wrk cannot do (seeding, and clients that retry one key until it is terminal).

Every run here is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
LUA = BENCH / "lua"
SQL = BENCH / "sql"

# wrk ends its own run at the duration; this bounds a wrk that hangs anyway.
WRK_GRACE = 30.0
# A request that has not been answered by then counts as a wrk timeout.
WRK_TIMEOUT = "10s"
# apt-get update + install of one small package.
APT_TIMEOUT = 300.0
# One request of the asyncio client.
REQUEST_TIMEOUT = 30.0

_RESULT = re.compile(r"^BENCH_RESULT (\{.*\})$", re.MULTILINE)


@dataclass
class LoadResult:
    """One measured run: throughput, latency percentiles (ms), answers by status."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]
    errors: dict[str, int] = field(default_factory=dict)
    p90_ms: float | None = None
    mean_ms: float | None = None
    max_ms: float | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def non_2xx(self) -> int:
        return sum(
            n for status, n in self.statuses.items() if status.isdigit() and status[0] != "2"
        )

    @property
    def failures(self) -> int:
        """Non-2xx answers, transport errors, failed transactions."""
        return self.non_2xx + sum(self.errors.values())

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status.startswith("5"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "rps": round(self.rps, 1),
            "p50_ms": round(self.p50_ms, 2),
            "p90_ms": None if self.p90_ms is None else round(self.p90_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "mean_ms": None if self.mean_ms is None else round(self.mean_ms, 2),
            "max_ms": None if self.max_ms is None else round(self.max_ms, 2),
            "statuses": dict(sorted(self.statuses.items())),
            "non_2xx": self.non_2xx,
            "transport_or_transaction_errors": self.errors,
        }


# -- wrk ---------------------------------------------------------------------------------------


def ensure_wrk() -> str:
    """The wrk binary; installed from Debian's packages when missing (root only)."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("wrk is not installed: run `sudo apt-get install -y wrk`")
    print("wrk not found: installing it with apt-get", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "wrk"]
    if subprocess.run(install, env=env, capture_output=True, timeout=APT_TIMEOUT).returncode:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, timeout=APT_TIMEOUT)
        subprocess.run(install, env=env, check=True, capture_output=True, timeout=APT_TIMEOUT)
    found = shutil.which("wrk")
    if not found:
        raise RuntimeError("apt-get installed wrk, yet it is not on PATH")
    return found


def write_requests(path: Path, requests: Sequence[bytes]) -> Path:
    """The request list cycle.lua reads: ``<length>\\n<bytes>`` for each request."""
    with path.open("wb") as f:
        for raw in requests:
            f.write(b"%d\n" % len(raw))
            f.write(raw)
    return path


def raw_request(
    method: str,
    path: str,
    port: int,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def run_wrk(
    url: str,
    script: str,
    args: Sequence[str],
    *,
    duration: float,
    connections: int,
    log_path: Path | None = None,
) -> LoadResult:
    wrk = ensure_wrk()
    threads = max(1, min(2, connections))
    argv = [
        wrk,
        *("-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(duration))}s"),
        *("--timeout", WRK_TIMEOUT, "-s", str(LUA / script), url, "--", *args),
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=duration + WRK_GRACE, check=False
    )
    if log_path is not None:
        with log_path.open("a") as log:
            log.write(f"$ wrk ... {url} ({script})\n{done.stdout}{done.stderr}\n")
    match = _RESULT.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    data = json.loads(match.group(1))
    latency = data["latency_us"]
    return LoadResult(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        p50_ms=latency["p50"] / 1000,
        p90_ms=latency["p90"] / 1000,
        p99_ms=latency["p99"] / 1000,
        mean_ms=latency["mean"] / 1000,
        max_ms=latency["max"] / 1000,
        statuses={str(k): int(v) for k, v in data["statuses"].items()},
        errors={k: int(v) for k, v in data["errors"].items() if k != "status" and v},
    )


# -- pgbench -----------------------------------------------------------------------------------

_TPS = re.compile(r"^tps = ([\d.]+)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)


def run_pgbench(
    script: str,
    *,
    port: int,
    variables: dict[str, str],
    duration: float,
    clients: int,
    work_dir: Path,
    log_path: Path | None = None,
) -> LoadResult:
    """pgbench -M prepared with a custom script; latencies from its per-transaction log."""
    from devstack import EmbeddedPostgres

    name = Path(script).stem
    for old in work_dir.glob(f"pgbench_{name}*"):
        old.unlink()
    argv = [
        str(EmbeddedPostgres.bin_dir() / "pgbench"),
        *("-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-n", "-M", "prepared"),
        *("-c", str(clients), "-j", str(max(1, min(2, clients))), "-T", str(round(duration))),
        *("-f", str(SQL / script), "-l", f"--log-prefix={work_dir / ('pgbench_' + name)}"),
    ]
    for key, value in variables.items():
        argv += ["-D", f"{key}={value}"]
    argv.append("settlement")
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=duration + WRK_GRACE,
        check=False,
        cwd=work_dir,
    )
    if log_path is not None:
        with log_path.open("a") as log:
            log.write(f"$ pgbench -f {script}\n{done.stdout}{done.stderr}\n")
    tps = _TPS.search(done.stdout)
    if done.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    latencies: list[float] = []
    for log_file in work_dir.glob(f"pgbench_{name}*"):
        for line in log_file.read_text().splitlines():
            fields = line.split()
            # client_id transaction_no time_us script_no time_epoch time_us_part [lag]
            if len(fields) >= 6 and fields[2].isdigit():
                latencies.append(int(fields[2]) / 1000)
        log_file.unlink()
    failed = _FAILED.search(done.stdout)
    count = len(latencies)
    seconds = count / float(tps.group(1)) if float(tps.group(1)) else 0.0
    p50, p99 = _percentiles(latencies)
    return LoadResult(
        requests=count,
        seconds=seconds,
        p50_ms=p50,
        p99_ms=p99,
        mean_ms=statistics.fmean(latencies) if latencies else 0.0,
        max_ms=max(latencies, default=0.0),
        statuses={},
        errors={"failed": int(failed.group(1))} if failed and int(failed.group(1)) else {},
    )


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    ordered = sorted(values)
    return _rank(ordered, 0.50), _rank(ordered, 0.99)


def _rank(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    index = max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))
    return ordered[index]


# -- a small asyncio HTTP/1.1 client ---------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection; requests are raw bytes, answers are parsed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), REQUEST_TIMEOUT
        )
        return cls(reader, writer)

    async def send(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            self._writer.write(raw)
            await self._writer.drain()
            head = await self._reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", ""):
                raise RuntimeError("chunked answers are not expected from these routes")
            body = await self._reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 2)


async def send_all(
    port: int, requests: Sequence[bytes], *, concurrency: int
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send every request once over ``concurrency`` connections; the answers in order."""
    answers: list[tuple[int, dict[str, str], bytes] | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)

    async def worker() -> None:
        conn = await Connection.open(port)
        try:
            while not queue.empty():
                i = queue.get_nowait()
                answers[i] = await conn.send(requests[i])
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return [a for a in answers if a is not None]


@dataclass
class ContentionRound:
    key: str
    requests: int = 0
    in_progress: int = 0
    finals: dict[int, int] = field(default_factory=dict)
    distinct_final_bodies: int = 0
    executions: int = -1  # transfers written for the key's operation (SQL count)
    attempts: int = -1  # attempt rows of the key's operation (SQL count)
    seconds: float = 0.0


async def contention(
    port: int,
    build: Callable[[str], bytes],
    *,
    clients: int,
    duration: float,
    count_effects: Callable[[str], Awaitable[tuple[int, int]]],
) -> tuple[list[ContentionRound], LoadResult]:
    """Rounds of ``clients`` clients that send one new key at once and retry it at once on
    every 409 until they get another answer; a new key each round until ``duration`` ends.

    ``build(key)`` gives the raw request; ``count_effects(key)`` -> (transfers, attempts)
    written for the key's operation. Returns the rounds and the run as a LoadResult over all
    answers whose percentiles are those of the 409 answers (client-side, in ms).
    """
    conns = [await Connection.open(port) for _ in range(clients)]
    rounds: list[ContentionRound] = []
    latencies_409: list[float] = []
    statuses: dict[str, int] = {}
    deadline = time.perf_counter() + duration
    try:
        while time.perf_counter() < deadline or not rounds:
            key = f"contention-{os.getpid()}-{time.time_ns()}"
            current = await _contention_round(
                conns, key, build(key), deadline + REQUEST_TIMEOUT, latencies_409, statuses
            )
            current.executions, current.attempts = await count_effects(key)
            rounds.append(current)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    ordered = sorted(latencies_409)
    p50, p99 = _percentiles(ordered)
    result = LoadResult(
        requests=sum(r.requests for r in rounds),
        seconds=sum(r.seconds for r in rounds),
        p50_ms=p50,
        p99_ms=p99,
        p90_ms=_rank(ordered, 0.90) if ordered else 0.0,
        mean_ms=statistics.fmean(ordered) if ordered else 0.0,
        max_ms=ordered[-1] if ordered else 0.0,
        statuses=statuses,
    )
    return rounds, result


async def _contention_round(
    conns: Sequence[Connection],
    key: str,
    raw: bytes,
    give_up_at: float,
    latencies_409: list[float],
    statuses: dict[str, int],
) -> ContentionRound:
    current = ContentionRound(key=key)
    start = asyncio.Event()
    finals: list[bytes] = []

    async def client(conn: Connection) -> None:
        await start.wait()
        while True:  # bounded: a key that never settles is given up at give_up_at
            sent = time.perf_counter()
            status, _, body = await conn.send(raw)
            elapsed = (time.perf_counter() - sent) * 1000
            current.requests += 1
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status != 409:
                current.finals[status] = current.finals.get(status, 0) + 1
                finals.append(body)
                return
            current.in_progress += 1
            latencies_409.append(elapsed)
            if time.perf_counter() > give_up_at:
                return

    began = time.perf_counter()
    tasks = [asyncio.create_task(client(c)) for c in conns]
    start.set()
    await asyncio.gather(*tasks)
    current.seconds = time.perf_counter() - began
    current.distinct_final_bodies = len(set(finals))
    return current
