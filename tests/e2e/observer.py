"""``settlement observer run --feed NAME`` as a real process, for end-to-end and reliability
tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import STOP_TIMEOUT

__all__ = ["FEED_PATHS", "Observer"]

FEED_PATHS = {"cursor": "/feeds/cursor", "timestamp": "/feeds/timestamp"}


class Observer:
    """``settlement observer run --feed NAME`` as its own process, on a feed of its own name
    (so its checkpoint starts at the feed's beginning)."""

    def __init__(
        self,
        redis_url: str,
        database_url: str,
        provider: ProviderProcess,
        kind: str,
        *,
        name: str | None = None,
        failpoint: str | None = None,
        page_size: int = 20,
        unknown_grace: str | None = "0",
        promises: str | None = None,
    ) -> None:
        """``unknown_grace``: SETTLEMENT_FEED_UNKNOWN_GRACE (None: the setting's default);
        ``promises``: what the source is declared to promise, ``a+b`` (None: all three the
        simulator's timestamp feed keeps when no fault is armed, nothing for a cursor feed)."""
        if promises is None:
            # the simulator's timestamp feed keeps all three promises (faults aside)
            promises = "later-timestamp+watermark+short-page-end" if kind == "timestamp" else ""
        self.name = name or f"{kind[:2]}-{uuid.uuid4().hex[:10]}"
        self.kind = kind
        self._log = tempfile.NamedTemporaryFile(prefix="settlement-observer-", suffix=".log")  # noqa: SIM115 - closed in stop
        env = {
            **os.environ,
            "SETTLEMENT_DATABASE_URL": database_url,
            "SETTLEMENT_REDIS_URL": redis_url,
            "SETTLEMENT_PROVIDER_SECRET": SECRET,
            "SETTLEMENT_FEEDS": f"{self.name}={kind}:{provider.base_url}{FEED_PATHS[kind]}",
            "SETTLEMENT_FEED_PROMISES": f"{self.name}={promises}" if promises else "",
            "SETTLEMENT_FEED_PAGE_SIZE": str(page_size),
            "SETTLEMENT_FEED_POLL_INTERVAL": "0.05",
            "SETTLEMENT_FEED_MAX_BACKOFF": "0.3",
            "SETTLEMENT_LOG_FORMAT": "json",
        }
        if unknown_grace is not None:
            env["SETTLEMENT_FEED_UNKNOWN_GRACE"] = unknown_grace
        else:
            env.pop("SETTLEMENT_FEED_UNKNOWN_GRACE", None)
        if failpoint is not None:
            env["SETTLEMENT_ENABLE_FAILPOINTS"] = "1"
            env["SETTLEMENT_FAILPOINTS"] = f"{failpoint}=crash"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "observer", "run", "--feed", self.name],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
        )

    @property
    def log_path(self) -> Path:
        """The file the process writes its output to (gone once stopped)."""
        return Path(self._log.name)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
