"""The system under test: embedded PostgreSQL and Redis in a temporary directory, and server
processes started the way production starts them (``bench.usage`` samples what they use).

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
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import psutil

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

# A server whose workers have not all logged "server ready" by then has failed to start.
START_TIMEOUT = 60.0
# a server drains for up to 10 s (service.serving.GRACEFUL_SHUTDOWN); then it is killed.
STOP_TIMEOUT = 20.0
# What each worker logs once its lifespan has started (service.http.app).
READY_LINE = b'"msg": "server ready"'


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
    """One uvicorn server (a supervisor and ``workers`` worker processes) on a free port;
    :class:`GranianProcess` for a granian one."""

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

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# the process titles of PostgreSQL's own work, apart from the backends of connections
_BACKGROUND = ("autovacuum", "checkpointer", "background writer", "walwriter", "io worker")


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
            self.pg_pid = services.postgres.pid
            self.redis_pid = services.redis.pid
            self.database_url = plain_url(services.database_url)
            self.redis_url = services.redis_url
            upgrade(self.database_url)
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
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

    def postgres_background(self) -> list[psutil.Process]:
        """The PostgreSQL processes that serve no client connection: autovacuum, the
        checkpointer, the WAL and background writers (their titles say so)."""
        found = []
        for process in self.postgres_processes()[1:]:
            with contextlib.suppress(psutil.Error):
                title = " ".join(process.cmdline())
                if any(role in title for role in _BACKGROUND):
                    found.append(process)
        return found

    def redis_processes(self) -> list[psutil.Process]:
        return [psutil.Process(self.redis_pid)]

    def redis_commands(self) -> int:
        """Commands Redis has processed since it started (``INFO stats``; this one counted)."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            return int(client.info("stats")["total_commands_processed"])
        finally:
            client.close()

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

    def production_server(
        self, workers: int, claim_settle: str = "statement", database_url: str | None = None
    ) -> ServerProcess:
        """``python -m service.cli serve``: the production entry point (granian), on the
        stack's database or ``database_url``; ``claim_settle``: its SETTLEMENT_DB_CLAIM_SETTLE.
        A server other than the default one logs to a file of its own."""
        port = free_port()
        argv = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
        env = self.server_env(SETTLEMENT_DB_CLAIM_SETTLE=claim_settle)
        log = "server.log"
        if claim_settle != "statement":
            log = f"server-{claim_settle}.log"
        if database_url is not None:
            env["SETTLEMENT_DATABASE_URL"] = database_url
            log = "server-empty.log"
        return GranianProcess(
            "settlement serve",
            [*argv, "--workers", str(workers)],
            port=port,
            workers=workers,
            env=env,
            log_path=self.log_dir / log,
        )

    def uvicorn_server(self, workers: int) -> ServerProcess:
        """The production app (``service.http.app:app_from_env``) under uvicorn instead of
        granian (httptools, uvloop, the same workers, no access log): the server
        ``settlement serve`` ran before it needed granian's limits, to measure what they cost."""
        port = free_port()
        return ServerProcess(
            "uvicorn",
            [*_uvicorn_argv(port, workers), "service.http.app:app_from_env"],
            port=port,
            workers=workers,
            env=self.server_env(),
            log_path=self.log_dir / "uvicorn-server.log",
        )

    def baseline_server(self, workers: int, *, log_level: str = "INFO") -> ServerProcess:
        """``python -m bench.bare_app``: the same app and server options, plus baselines."""
        return self._bench_app(
            "bench.bare_app",
            f"bench.bare_app (log level {log_level})",
            workers,
            self.server_env(BENCH_LOG_LEVEL=log_level),
            f"baseline-server-{log_level.lower()}.log",
        )

    def peer_server(
        self, workers: int, principal_id: str, layer: str, server: str = "granian"
    ) -> ServerProcess:
        """``python -m bench.peer_app``: the peer with idempotency layer ``layer``, under the
        same server options (``server="granian"``) or under uvicorn as most of its users run
        it (``"uvicorn"``: ``uvicorn --workers N`` with uvloop and httptools, as
        ``uvicorn[standard]`` picks them; no access log, as ours); its operation rows name
        ``principal_id`` (it authenticates nobody)."""
        env = self.server_env(BENCH_PEER_PRINCIPAL=principal_id, BENCH_PEER_LAYER=layer)
        if server == "granian":
            return self._bench_app(
                "bench.peer_app",
                f"bench.peer_app ({layer})",
                workers,
                env,
                f"peer-server-{layer}.log",
            )
        port = free_port()
        return ServerProcess(
            f"bench.peer_app ({layer}, uvicorn)",
            [*_uvicorn_argv(port, workers), "bench.peer_app:app_factory"],
            port=port,
            workers=workers,
            env=env,
            log_path=self.log_dir / f"peer-server-{layer}-uvicorn.log",
        )

    def _bench_app(
        self, module: str, name: str, workers: int, env: dict[str, str], log_name: str
    ) -> ServerProcess:
        """One of the bench's apps, served by ``bench.serve`` as ``settlement serve`` is."""
        port = free_port()
        return GranianProcess(
            name,
            [sys.executable, "-m", module, "--port", str(port), "--workers", str(workers)],
            port=port,
            workers=workers,
            env=env,
            log_path=self.log_dir / log_name,
        )


def _uvicorn_argv(port: int, workers: int) -> list[str]:
    """uvicorn serving an app factory (named after these): httptools, uvloop, ``workers``
    workers, no access log."""
    return [
        *(sys.executable, "-m", "uvicorn", "--factory", "--loop", "uvloop"),
        *("--http", "httptools", "--no-access-log", "--log-level", "warning"),
        *("--host", HOST, "--port", str(port), "--workers", str(workers)),
    ]


class GranianProcess(ServerProcess):
    """A granian server (``settlement serve``, ``bench.serve``): its workers are its direct
    children (forked, not spawned), one at least."""

    def worker_processes(self) -> list[psutil.Process]:
        children: list[psutil.Process] = psutil.Process(self.pid).children()
        return children
