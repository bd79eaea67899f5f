"""A real server process for end-to-end tests: started with `settlement serve`, over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

# A server that has not answered /health by then has failed to start.
START_TIMEOUT = 30.0
# Graceful stop budget before the process is killed.
STOP_TIMEOUT = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        database_url: str,
        redis_url: str,
        *,
        env: dict[str, str] | None = None,
        workers: int = 1,
        module: tuple[str, ...] = ("service.cli", "serve"),
        preexec: Callable[[], None] | None = None,
    ) -> None:
        """``module``: what ``python -m`` runs (the server, or the benchmark's baseline app);
        it is given ``--port`` and ``--workers``. ``preexec``: run in the child before it
        starts (a resource limit)."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="settlement-server-", suffix=".log")  # noqa: SIM115 - closed in __exit__
        self._env = {
            **os.environ,
            "SETTLEMENT_DATABASE_URL": database_url,
            "SETTLEMENT_REDIS_URL": redis_url,
            "SETTLEMENT_LOG_FORMAT": "json",
            **(env or {}),
        }
        self._workers = workers
        self._module = module
        self._preexec = preexec
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait: bool = True) -> Self:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                *self._module,
                "--port",
                str(self.port),
                "--workers",
                str(self._workers),
            ],
            env=self._env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
            preexec_fn=self._preexec,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                httpx.get(f"{self.base_url}/health", timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not answer within {START_TIMEOUT}s:\n{self.output()}")

    def output(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._log.close()
