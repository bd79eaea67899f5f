"""The system under test: embedded PostgreSQL and Redis in a temporary directory, server
processes started the way production starts them, fixtures, and an RSS sampler.

Every wait here is bounded; every process started here is stopped by its own id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

# A server whose workers have not all logged "server ready" by then has failed to start.
START_TIMEOUT = 60.0
# uvicorn drains for up to 10 s (service.cli.GRACEFUL_SHUTDOWN); then it is killed.
STOP_TIMEOUT = 20.0
# Between samples of RSS and CPU time (psutil reads /proc: cheap, but not free).
RSS_INTERVAL = 0.1
# Connections per worker are counted every this many samples (about once a second).
CONNECTIONS_EVERY = 10
# What each worker logs once its lifespan has started (service.http.app).
READY_LINE = b'"msg": "server ready"'

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def plain_url(url: str) -> str:
    """``postgresql+asyncpg://...`` -> ``postgresql://...`` (asyncpg, libpq and the server)."""
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith("postgresql") else url


class ServerProcess:
    """One uvicorn server (a supervisor and ``workers`` worker processes) on a free port."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        workers: int,
        env: dict[str, str],
        log_path: Path,
    ) -> None:
        self.name = name
        self.port = port
        self.workers = workers
        self.base_url = f"http://{HOST}:{port}"
        self.log_path = log_path
        self._argv = list(argv)
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        from devstack import die_with_parent

        with self.log_path.open("ab") as log_file:
            self._offset = log_file.tell()
            self._proc = subprocess.Popen(
                self._argv,
                cwd=ROOT,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal Ctrl-C reaches the bench, which stops it
                preexec_fn=die_with_parent(),
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited during start ({self._proc.returncode}); see "
                    f"{self.log_path}\n{self._log_tail()}"
                )
            if self._ready_workers() >= self.workers and self._healthy():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} not ready within {START_TIMEOUT:g}s\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def _ready_workers(self) -> int:
        with self.log_path.open("rb") as f:
            f.seek(self._offset)
            return f.read().count(READY_LINE)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _log_tail(self, size: int = 3000) -> str:
        data = self.log_path.read_bytes()[-size:]
        return data.decode("utf-8", "replace")

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def worker_processes(self) -> list[psutil.Process]:
        """The processes that serve requests: uvicorn's spawned workers (or the one process)."""
        main = psutil.Process(self.pid)
        if self.workers == 1:
            return [main]
        found = []
        for child in main.children():
            with contextlib.suppress(psutil.Error):
                cmdline = " ".join(child.cmdline())
                if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
                    found.append(child)
        return found

    def client_connections(self) -> dict[int, int]:
        """Established connections to the server port, per worker pid."""
        counts = {}
        for worker in self.worker_processes():
            with contextlib.suppress(psutil.Error):
                counts[worker.pid] = sum(
                    1
                    for c in worker.net_connections(kind="tcp")
                    if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == self.port
                )
        return counts

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is its id
            proc.wait(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass
class Usage:
    """What the processes of a scenario used: peak RSS of each worker, CPU of each group."""

    peak_rss_mib: dict[int, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    # every CPU of the machine, busy (not idle, not waiting on I/O), whoever used it
    machine_busy_seconds: float = 0.0
    worker_cpu_seconds: dict[int, float] = field(default_factory=dict)
    # most client connections each worker held at once (uvicorn's workers share one
    # listening socket: the kernel decides which worker accepts a connection)
    worker_connections: dict[int, int] = field(default_factory=dict)

    @property
    def worker_cores(self) -> list[float]:
        if self.wall_seconds <= 0:
            return []
        return [
            round(self.worker_cpu_seconds.get(pid, 0.0) / self.wall_seconds, 2)
            for pid in sorted(self.peak_rss_mib)
        ]

    @property
    def rss_values(self) -> list[float]:
        return [round(self.peak_rss_mib[pid], 1) for pid in sorted(self.peak_rss_mib)]

    def cores(self, group: str) -> float:
        if self.wall_seconds <= 0:
            return 0.0
        return self.cpu_seconds.get(group, 0.0) / self.wall_seconds

    @property
    def other_cores(self) -> float:
        """CPU the machine spent on anything but the measured processes: other programs on a
        shared machine (and the kernel's share that no process is charged for)."""
        if self.wall_seconds <= 0:
            return 0.0
        ours = sum(self.cpu_seconds.values())
        return max(0.0, self.machine_busy_seconds - ours) / self.wall_seconds


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


ProcessGroup = Callable[[], list[psutil.Process]]


@contextlib.contextmanager
def sample(
    workers: Sequence[psutil.Process],
    connections: Callable[[], dict[int, int]] | None = None,
    **groups: ProcessGroup,
) -> Iterator[Usage]:
    """Sample the workers' RSS, and the CPU time of the workers and of each other group
    (e.g. PostgreSQL: its postmaster and backends), every RSS_INTERVAL while the block runs.

    CPU is counted from the first sample for processes alive then, from zero for processes
    that start later (a backend of a new connection); a process that ends between two
    samples loses at most one interval.
    """
    usage = Usage({p.pid: 0.0 for p in workers})
    stop = threading.Event()
    everything: dict[str, ProcessGroup] = {"workers": lambda: list(workers), **groups}
    first: dict[tuple[str, int], float] = {}
    last: dict[tuple[str, int], float] = {}

    machine_before = machine_busy_seconds()

    def take(initial: bool) -> None:
        for name, members in everything.items():
            try:
                procs = members()
            except psutil.Error:
                continue
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    cpu = times.user + times.system
                    key = (name, p.pid)
                    first.setdefault(key, cpu if initial else 0.0)
                    last[key] = cpu
                    if name == "workers":
                        rss = p.memory_info().rss / MIB
                        usage.peak_rss_mib[p.pid] = max(usage.peak_rss_mib[p.pid], rss)

    def loop() -> None:
        rounds = 0
        while not stop.wait(RSS_INTERVAL):
            take(initial=False)
            rounds += 1
            if connections is not None and rounds % CONNECTIONS_EVERY == 0:
                with contextlib.suppress(psutil.Error, OSError):
                    for pid, n in connections().items():
                        seen = usage.worker_connections.get(pid, 0)
                        usage.worker_connections[pid] = max(seen, n)

    take(initial=True)
    began = time.monotonic()
    thread = threading.Thread(target=loop, name="usage-sampler", daemon=True)
    thread.start()
    try:
        yield usage
    finally:
        stop.set()
        thread.join(5)
        take(initial=False)
        usage.wall_seconds = time.monotonic() - began
        usage.cpu_seconds = dict.fromkeys(everything, 0.0)
        for key, cpu in last.items():
            usage.cpu_seconds[key[0]] += cpu - first[key]
            if key[0] == "workers":
                usage.worker_cpu_seconds[key[1]] = cpu - first[key]
        usage.machine_busy_seconds = machine_busy_seconds() - machine_before


class Stack:
    """Embedded PostgreSQL and Redis (not durable) under a temporary directory.

    ``server(...)`` makes server processes against them; ``log_dir`` keeps every log.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._tmp: Path | None = None
        self._exit = contextlib.ExitStack()
        self.database_url = ""
        self.redis_url = ""
        self.pg_port = 0
        self.pg_pid = 0
        self.redis_pid = 0

    def __enter__(self) -> Self:
        from devstack import EmbeddedServices
        from service.store.migrate import upgrade

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="settlement-bench-"))
        self._exit.callback(shutil.rmtree, self._tmp, ignore_errors=True)
        try:
            services = self._exit.enter_context(EmbeddedServices(self._tmp, durable=False))
            assert services.postgres is not None
            assert services.redis is not None
            self.pg_port = services.postgres.port
            self.pg_pid = services.postgres.pid
            self.redis_pid = services.redis.pid
            self.database_url = plain_url(services.database_url)
            self.redis_url = services.redis_url
            upgrade(self.database_url)
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.keep_database_log()
        self._exit.close()

    @property
    def tmp(self) -> Path:
        assert self._tmp is not None
        return self._tmp

    def keep_database_log(self) -> None:
        if self._tmp is not None and (self._tmp / "postgres.log").exists():
            shutil.copyfile(self._tmp / "postgres.log", self.log_dir / "postgres.log")

    def postgres_processes(self) -> list[psutil.Process]:
        """The postmaster and every backend (one per open connection)."""
        postmaster = psutil.Process(self.pg_pid)
        return [postmaster, *postmaster.children()]

    def redis_processes(self) -> list[psutil.Process]:
        return [psutil.Process(self.redis_pid)]

    def server_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLEMENT_")}
        env.update(
            SETTLEMENT_DATABASE_URL=self.database_url,
            SETTLEMENT_REDIS_URL=self.redis_url,
            SETTLEMENT_LOG_FORMAT="json",
            SETTLEMENT_DATA_DIR=str(self.tmp),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def production_server(self, workers: int) -> ServerProcess:
        """``python -m service.cli serve``: the production entry point."""
        port = free_port()
        argv = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
        return ServerProcess(
            "settlement serve",
            [*argv, "--workers", str(workers)],
            port=port,
            workers=workers,
            env=self.server_env(),
            log_path=self.log_dir / "server.log",
        )

    def baseline_server(self, workers: int, *, log_level: str = "INFO") -> ServerProcess:
        """``python -m bench.bare_app``: the same app and uvicorn options, plus baselines."""
        port = free_port()
        argv = [sys.executable, "-m", "bench.bare_app", "--port", str(port)]
        return ServerProcess(
            f"bench.bare_app (log level {log_level})",
            [*argv, "--workers", str(workers)],
            port=port,
            workers=workers,
            env=self.server_env(BENCH_LOG_LEVEL=log_level),
            log_path=self.log_dir / f"baseline-server-{log_level.lower()}.log",
        )
