"""Load generators: wrk (Lua scripts) and pgbench (custom scripts), with the raw requests
wrk replays. The asyncio client for what wrk cannot do is ``bench.client``.

Every run here is bounded in time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BENCH = Path(__file__).resolve().parent
LUA = BENCH / "lua"
SQL = BENCH / "sql"

# wrk ends its own run at the duration; this bounds a wrk that hangs anyway.
WRK_GRACE = 30.0
# A request that has not been answered by then counts as a wrk timeout.
WRK_TIMEOUT = "10s"
# apt-get update + install of one small package.
APT_TIMEOUT = 300.0

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
    _, match = _run(argv, ("wrk", f"... {url} ({script})"), _RESULT, duration, log_path)
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
    database_url: str,
    variables: dict[str, str],
    duration: float,
    clients: int,
    work_dir: Path,
    log_path: Path | None = None,
) -> LoadResult:
    """pgbench -M prepared with a custom script; latencies from its per-transaction log.

    The password goes in the environment: a command line is visible to every local user.
    """
    from devstack import EmbeddedPostgres

    target = urlsplit(database_url)
    name = Path(script).stem
    for old in work_dir.glob(f"pgbench_{name}*"):
        old.unlink()
    argv = [
        str(EmbeddedPostgres.bin_dir() / "pgbench"),
        *("-h", str(target.hostname), "-p", str(target.port), "-U", str(target.username)),
        *("-n", "-M", "prepared"),
        *("-c", str(clients), "-j", str(max(1, min(2, clients))), "-T", str(round(duration))),
        *("-f", str(SQL / script), "-l", f"--log-prefix={work_dir / ('pgbench_' + name)}"),
    ]
    for key, value in variables.items():
        argv += ["-D", f"{key}={value}"]
    argv.append(target.path.lstrip("/"))
    env = {**os.environ, "PGPASSWORD": unquote(target.password or "")}
    shown = ("pgbench", f"-f {script}")
    stdout, tps = _run(argv, shown, _TPS, duration, log_path, work_dir, env)
    latencies: list[float] = []
    for log_file in work_dir.glob(f"pgbench_{name}*"):
        for line in log_file.read_text().splitlines():
            fields = line.split()
            # client_id transaction_no time_us script_no time_epoch time_us_part [lag]
            if len(fields) >= 6 and fields[2].isdigit():
                latencies.append(int(fields[2]) / 1000)
        log_file.unlink()
    failed = _FAILED.search(stdout)
    count = len(latencies)
    seconds = count / float(tps.group(1)) if float(tps.group(1)) else 0.0
    p50, p99 = percentiles(latencies)
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


def _run(
    argv: list[str],
    shown: tuple[str, str],
    expect: re.Pattern[str],
    duration: float,
    log_path: Path | None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[str, re.Match[str]]:
    """Run a load tool for ``duration`` s (WRK_GRACE more at most); append ``$ <tool> <args>``
    and its output to ``log_path``. Its stdout, and the match of ``expect`` there; a failed
    run, or one without that line, raises."""
    tool, args = shown
    timeout = duration + WRK_GRACE
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=env
    )
    if log_path is not None:
        with log_path.open("a") as log:
            log.write(f"$ {tool} {args}\n{done.stdout}{done.stderr}\n")
    match = expect.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout, match


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """p50 and p99 (nearest rank) of unsorted values; zeros when there are none."""
    if not values:
        return 0.0, 0.0
    ordered = sorted(values)
    return rank(ordered, 0.50), rank(ordered, 0.99)


def rank(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    index = max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))
    return ordered[index]
