"""`settlement serve --embedded`: real PostgreSQL and Redis as children, none left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.server import START_TIMEOUT, STOP_TIMEOUT, free_port

pytestmark = pytest.mark.e2e

# The embedded servers must be gone this soon after the server process is.
ORPHAN_GRACE = 10.0
REPO = Path(__file__).resolve().parents[2]


def _start(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLEMENT_")}
    env["SETTLEMENT_DATA_DIR"] = str(data_dir)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--embedded", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT * 2
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited during start"
        try:
            response = httpx.get(f"{base}/health", timeout=1.0)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        assert response.status_code == 200
        assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}
        return proc, base
    proc.kill()
    raise AssertionError("embedded server did not become healthy")


def _servers_on(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(data_dir) in cmdline and ("postgres" in cmdline or "redis-server" in cmdline):
            found.append(proc)
    return found


def _wait_gone(data_dir: Path) -> list[psutil.Process]:
    deadline = time.monotonic() + ORPHAN_GRACE
    while time.monotonic() < deadline:
        left = [p for p in _servers_on(data_dir) if p.is_running() and p.status() != "zombie"]
        if not left:
            return []
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stop_signal_stops_embedded_services_cleanly(tmp_path: Path, sig: int) -> None:
    proc, _ = _start(tmp_path)
    assert _servers_on(tmp_path), "embedded servers were not found running"
    proc.send_signal(sig)
    assert proc.wait(STOP_TIMEOUT) == 0
    assert _wait_gone(tmp_path) == []
    assert "database system is shut down" in (tmp_path / "postgres.log").read_text()


def test_sigkill_of_the_server_leaves_no_orphans(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path)
    proc.kill()
    proc.wait(STOP_TIMEOUT)
    assert _wait_gone(tmp_path) == []


def test_data_survives_a_restart_of_the_embedded_server(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(STOP_TIMEOUT) == 0
    proc, base = _start(tmp_path)  # the migrated cluster is reused, not re-initialised
    try:
        assert httpx.get(f"{base}/health").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(STOP_TIMEOUT)
    assert _wait_gone(tmp_path) == []
