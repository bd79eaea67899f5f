"""`settlement serve` takes its host, port and workers from SETTLEMENT_HOST, SETTLEMENT_PORT
and SETTLEMENT_WORKERS when no flag names them, and says where the console is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY
from tests.e2e.server import free_port

pytestmark = pytest.mark.e2e

START = 60.0


def test_serve_reads_its_address_and_workers_from_the_settings(
    services: Services, app_database: str
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "SETTLEMENT_DATABASE_URL": app_database,
        "SETTLEMENT_REDIS_URL": services.redis_url,
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_HOST": "127.0.0.1",
        "SETTLEMENT_PORT": str(port),
        "SETTLEMENT_WORKERS": "2",
        "SETTLEMENT_LOG_FORMAT": "json",
    }
    with tempfile.NamedTemporaryFile(prefix="settlement-serve-") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            deadline = time.monotonic() + START
            while True:
                assert proc.poll() is None, Path(log.name).read_text()
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/livez", timeout=1.0)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, Path(log.name).read_text()
                    time.sleep(0.1)
            assert answer.status_code == 200
            output = Path(log.name).read_text()
            assert f"console: http://127.0.0.1:{port}/console" in output
            # every line of a JSON-logging server is JSON, that one too
            assert all(json.loads(line) for line in output.splitlines() if line.strip())
            # two workers: the serving process's own children that run the app
            workers = [
                child
                for child in psutil.Process(proc.pid).children(recursive=True)
                if "python" in child.name().lower() or child.cmdline()[:1] == [sys.executable]
            ]
            assert len(workers) >= 2, [w.cmdline() for w in workers]
        finally:
            proc.terminate()
            proc.wait(30)
