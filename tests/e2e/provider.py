"""The provider simulator as a real process, for the simulator's own tests and payout tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import msgspec

from service.domain.payouts import PayoutRequest, payout_fingerprint
from service.domain.provider_auth import request_key, signed_headers
from tests.e2e.server import START_TIMEOUT, STOP_TIMEOUT, free_port

SECRET = "e2e-provider-secret"
# Client timeout for ordinary calls; the simulator answers in milliseconds.
CALL_TIMEOUT = 5.0

ROOT = Path(__file__).resolve().parents[2]


def signed(
    content: bytes, key: str, *, secret: str = SECRET, now: float | None = None
) -> dict[str, str]:
    """The headers of a ``POST /payments`` the settlement server would send (``now``: the
    time it claims to be signed at, default the clock)."""
    return {
        "Idempotency-Key": key,
        "Content-Type": "application/json",
        **signed_headers(
            request_key(secret),
            method="POST",
            path="/payments",
            sink_key=key,
            body=content,
            now=time.time() if now is None else now,
        ),
    }


def make_payment(**overrides: Any) -> tuple[dict[str, Any], str]:
    """A valid payment body and its sink key ``<operation_id>:<binding_generation>``; its
    ``request_fingerprint`` is the server's for its payout unless given."""
    body: dict[str, Any] = {
        "operation_id": str(uuid.uuid4()),
        "binding_generation": 1,
        "beneficiary": "ACME Ltd",
        "amount": 1250,
        "currency": "EUR",
        **overrides,
    }
    body.setdefault("request_fingerprint", fingerprint_of(body))
    return body, f"{body['operation_id']}:{body['binding_generation']}"


def fingerprint_of(body: dict[str, Any]) -> str:
    """The fingerprint the server computes for the payout ``body`` describes (64 zeros when
    the server would refuse that payout)."""
    fields = {name: body.get(name) for name in ("beneficiary", "amount", "currency")}
    try:
        return payout_fingerprint(msgspec.convert(fields, type=PayoutRequest))
    except msgspec.ValidationError:
        return "0" * 64


class ProviderProcess:
    """``python -m devstack.provider`` on a free port, with its secret from the environment.

    Payments go to ``db_path`` (default: a throw-away file); ``output()`` is what it logged.
    ``sim_token`` is its ``SETTLEMENT_SIM_TOKEN`` (default unset: open controls on loopback),
    which the control calls here send.
    """

    def __init__(self, db_path: Path | None = None, *, sim_token: str | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.sim_token = sim_token
        self._dir = tempfile.TemporaryDirectory(prefix="settlement-provider-")
        self.db_path = db_path or Path(self._dir.name) / "provider.sqlite3"
        self._log_path = Path(self._dir.name) / "provider.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        with self._log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "devstack.provider",
                    "--port",
                    str(self.port),
                    "--db",
                    str(self.db_path),
                ],
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"simulator exited with {self.proc.returncode}:\n{self.output()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"simulator did not answer within {START_TIMEOUT}s:\n{self.output()}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the stop timeout; the exit status (None: never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SETTLEMENT_SIM_TOKEN"}
        env["SETTLEMENT_PROVIDER_SECRET"] = SECRET
        if self.sim_token is not None:
            env["SETTLEMENT_SIM_TOKEN"] = self.sim_token
        return env

    def output(self) -> str:
        return self._log_path.read_text(errors="replace")

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

    # --- calls -------------------------------------------------------------------------------

    def pay(
        self, body: dict[str, Any], key: str | None, *, timeout: float = CALL_TIMEOUT
    ) -> httpx.Response:
        """A payment signed as the settlement server signs it (unsigned without a key)."""
        content = msgspec.json.encode(body)
        headers = {"Content-Type": "application/json"} if key is None else signed(content, key)
        return self.post_payment(content, headers, timeout=timeout)

    def post_payment(
        self, content: bytes, headers: dict[str, str], *, timeout: float = CALL_TIMEOUT
    ) -> httpx.Response:
        """``POST /payments`` with exactly these bytes and headers."""
        return httpx.post(
            f"{self.base_url}/payments", content=content, headers=headers, timeout=timeout
        )

    def control_headers(self) -> dict[str, str]:
        return {} if self.sim_token is None else {"Authorization": f"Bearer {self.sim_token}"}

    def arm(self, mode: str, count: int = 1, delay_ms: int | None = None) -> None:
        fault: dict[str, Any] = {"mode": mode, "count": count}
        if delay_ms is not None:
            fault["delay_ms"] = delay_ms
        response = httpx.post(
            f"{self.base_url}/_sim/faults",
            json=fault,
            headers=self.control_headers(),
            timeout=CALL_TIMEOUT,
        )
        assert response.status_code == 200, response.text

    def faults(self) -> list[dict[str, Any]]:
        """The payment faults armed and not yet taken (a new payment takes one as it arrives)."""
        response = httpx.get(
            f"{self.base_url}/_sim/faults", headers=self.control_headers(), timeout=CALL_TIMEOUT
        )
        assert response.status_code == 200, response.text
        armed: list[dict[str, Any]] = response.json()["armed"]
        return armed

    def clear_faults(self) -> None:
        response = httpx.delete(
            f"{self.base_url}/_sim/faults", headers=self.control_headers(), timeout=CALL_TIMEOUT
        )
        assert response.status_code == 200, response.text
        assert response.json() == {"armed": []}

    def counts(self, key: str | None = None) -> dict[str, int]:
        """``{count, declines}`` of one sink key, or of every payment."""
        params = {} if key is None else {"key": key}
        response = httpx.get(
            f"{self.base_url}/_sim/payments",
            params=params,
            headers=self.control_headers(),
            timeout=CALL_TIMEOUT,
        )
        assert response.status_code == 200, response.text
        counts: dict[str, int] = response.json()
        return counts

    def total(self) -> int:
        """Committed payments over every sink key."""
        return self.counts()["count"]

    def pay_new(self, **overrides: Any) -> httpx.Response:
        """A new payment (``make_payment(**overrides)``), signed; its answer."""
        body, key = make_payment(**overrides)
        return self.pay(body, key)

    # --- the event feeds ---------------------------------------------------------------------

    def cursor_feed(self, cursor: str | None = None, limit: int | None = None) -> httpx.Response:
        """``GET /feeds/cursor``, leaving out what is None."""
        return self._feed("/feeds/cursor", {"cursor": cursor, "limit": limit})

    def timestamp_feed(self, after: int | None = None, limit: int | None = None) -> httpx.Response:
        """``GET /feeds/timestamp``, leaving out what is None."""
        return self._feed("/feeds/timestamp", {"after": after, "limit": limit})

    def _feed(self, path: str, params: dict[str, Any]) -> httpx.Response:
        given = {name: value for name, value in params.items() if value is not None}
        return httpx.get(f"{self.base_url}{path}", params=given, timeout=CALL_TIMEOUT)

    def arm_feed(self, mode: str, count: int = 1) -> list[dict[str, Any]]:
        """Arm a feed fault; what is armed afterwards."""
        response = httpx.post(
            f"{self.base_url}/_sim/feed-faults",
            json={"mode": mode, "count": count},
            headers=self.control_headers(),
            timeout=CALL_TIMEOUT,
        )
        assert response.status_code == 200, response.text
        armed: list[dict[str, Any]] = response.json()["armed"]
        return armed

    def feed_faults(self) -> list[dict[str, Any]]:
        response = httpx.get(
            f"{self.base_url}/_sim/feed-faults",
            headers=self.control_headers(),
            timeout=CALL_TIMEOUT,
        )
        assert response.status_code == 200, response.text
        armed: list[dict[str, Any]] = response.json()["armed"]
        return armed

    def clear_feed_faults(self) -> None:
        response = httpx.delete(
            f"{self.base_url}/_sim/feed-faults",
            headers=self.control_headers(),
            timeout=CALL_TIMEOUT,
        )
        assert response.status_code == 200, response.text
        assert response.json() == {"armed": []}
