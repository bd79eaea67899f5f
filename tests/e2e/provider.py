"""The provider simulator as a real process, for end-to-end payout tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from tests.e2e.server import START_TIMEOUT, STOP_TIMEOUT, free_port

SECRET = "e2e-provider-secret"


class ProviderProcess:
    def __init__(self, db_path: Path | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="settlement-provider-")
        self.db_path = db_path or Path(self._dir.name) / "provider.sqlite3"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devstack.provider",
                "--port",
                str(self.port),
                "--db",
                str(self.db_path),
                "--secret",
                SECRET,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[2],
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "provider exited during start"
            try:
                httpx.get(f"{self.base_url}/health", timeout=1.0)
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("provider did not start")

    def arm(self, mode: str, count: int = 1, delay_ms: int | None = None) -> None:
        fault: dict[str, Any] = {"mode": mode, "count": count}
        if delay_ms is not None:
            fault["delay_ms"] = delay_ms
        response = httpx.post(f"{self.base_url}/_sim/faults", json=fault)
        assert response.status_code == 200, response.text

    def clear(self) -> None:
        assert httpx.delete(f"{self.base_url}/_sim/faults").status_code == 200

    def total(self) -> int:
        response = httpx.get(f"{self.base_url}/_sim/payments")
        assert response.status_code == 200, response.text
        return int(response.json()["count"])

    def counts(self, sink_key: str) -> dict[str, int]:
        response = httpx.get(f"{self.base_url}/_sim/payments", params={"key": sink_key})
        assert response.status_code == 200, response.text
        return {"count": response.json()["count"], "declines": response.json()["declines"]}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
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
        self._dir.cleanup()
