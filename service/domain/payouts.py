"""The demo external effect: payouts through a downstream provider.

The provider honours the sink idempotency key ``<operation_id>:<binding_generation>``, so a
retry of an attempt whose outcome is unknown sends the same key and can never pay twice.
Its answer carries signed evidence of the outcome; only verified evidence becomes an
observation.

Every call is signed (:mod:`service.domain.provider_auth`): method, path, sink key, a
timestamp and the exact body bytes, under a key derived from the provider secret. The body
names the reservation tuple and the payout itself; the request fingerprint covers only the
route (always :data:`PAYOUT_ROUTE`, no path parameters) and the payout's three fields, so
the provider recomputes it with :func:`payout_fingerprint` from what it is asked to pay and
refuses a body whose fingerprint is not the one claimed. Evidence naming a reservation
therefore always describes the payout that reservation's fingerprint stands for.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

import httpx
import msgspec

from service.core import ReservationTuple
from service.domain.currencies import ISO_4217
from service.domain.ledger import WHOLE, Currency
from service.domain.provider_auth import request_key, signed_headers
from service.evidence import Evidence, SignedEvidence, fingerprint, verify

__all__ = [
    "PAYOUT_ROUTE",
    "Payout",
    "PayoutRequest",
    "ProviderClient",
    "ProviderUnavailable",
    "payout_fingerprint",
    "sink_key",
]

log = logging.getLogger("settlement.payouts")

# Largest payout in minor units (fits PostgreSQL bigint with room to spare).
MAX_PAYOUT = 10**15
# Largest provider answer read into memory; evidence is a few hundred bytes.
MAX_PROVIDER_ANSWER = 64 * 1024

# The scope name of the payout route: part of every payout's request fingerprint.
PAYOUT_ROUTE = "POST /v1/payouts"
# Where the provider takes payments.
PAYMENTS_PATH = "/payments"

Beneficiary = Annotated[str, msgspec.Meta(pattern=r"^[\x20-\x7e]{1,128}(?!\n)$")]


class PayoutRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    beneficiary: Beneficiary
    amount: Annotated[int, msgspec.Meta(gt=0, le=MAX_PAYOUT, description=WHOLE)]
    currency: Currency

    def __post_init__(self) -> None:
        if self.currency not in ISO_4217:
            raise ValueError(f"unknown currency {self.currency!r} (ISO 4217)")


class Payout(msgspec.Struct):
    """A payout the provider made (the provider's answer, stored and replayed)."""

    id: str
    provider_reference: str
    amount: int
    currency: str
    beneficiary: str


def payout_fingerprint(request: PayoutRequest) -> str:
    """The request fingerprint of a payout, as the server computes it for ``POST /v1/payouts``
    (no path parameters); the provider recomputes it from the payment it is asked to make."""
    return fingerprint(PAYOUT_ROUTE, {}, request)


class ProviderUnavailable(Exception):
    """No definitive answer: timeout, transport error, 5xx, or an answer we cannot trust."""


def sink_key(reservation: ReservationTuple) -> str:
    return f"{reservation.operation_id}:{reservation.binding_generation}"


class ProviderClient:
    """One pooled HTTP client per process; every call bounded by ``timeout``."""

    def __init__(self, base_url: str, secret: str, *, timeout: float) -> None:
        self._secret = secret
        self._timeout = timeout
        self._request_key = request_key(secret)
        self._client = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    async def close(self) -> None:
        await self._client.aclose()

    @staticmethod
    def _failed(said: str, key: str, exc: Exception) -> ProviderUnavailable:
        """``said`` for the attempt's record; the exception's own text for the log only."""
        log.warning(
            "provider call failed: %s",
            said,
            extra={"sink_key": key, "error": f"{type(exc).__name__}: {exc}"[:1000]},
        )
        return ProviderUnavailable(said)

    async def pay(self, reservation: ReservationTuple, request: PayoutRequest) -> SignedEvidence:
        """Send the payout under its sink key; the verified evidence of a definitive answer."""
        body = {
            "operation_id": reservation.operation_id,
            "binding_generation": reservation.binding_generation,
            "request_fingerprint": reservation.request_fingerprint,
            "beneficiary": request.beneficiary,
            "amount": request.amount,
            "currency": request.currency,
        }
        key = sink_key(reservation)
        content = msgspec.json.encode(body)
        call = self._client.build_request(
            "POST",
            PAYMENTS_PATH,
            content=content,
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        )
        call.headers.update(
            signed_headers(
                self._request_key,
                method=call.method,
                path=call.url.path,
                sink_key=key,
                body=content,
                now=time.time(),
            )
        )
        # What the attempt records is shown to the operation's client (its status resource):
        # one fixed sentence per kind of failure, never the exception's text (a provider's
        # raw bytes, a host name, a certificate's); the detail goes to the server's log.
        try:
            response = await self._client.send(call)
        except httpx.ConnectError as exc:  # refused, unreachable, no such host
            raise self._failed("connection refused or provider unreachable", key, exc) from exc
        except httpx.TimeoutException as exc:
            raise self._failed(
                f"timed out after {self._timeout:g} s waiting for the provider", key, exc
            ) from exc
        except httpx.RemoteProtocolError as exc:  # the answer was lost on its way
            raise self._failed(
                "answer lost: the provider closed the connection or sent a malformed answer",
                key,
                exc,
            ) from exc
        except httpx.HTTPError as exc:
            raise self._failed("provider call failed", key, exc) from exc
        if response.status_code >= 500:
            raise ProviderUnavailable(f"provider answered {response.status_code}")
        if response.status_code not in (201, 402) or len(response.content) > MAX_PROVIDER_ANSWER:
            log.error(
                "provider answer not understood",
                extra={"status": response.status_code, "operation_id": reservation.operation_id},
            )
            raise ProviderUnavailable(f"provider answered {response.status_code}")
        try:
            answer = msgspec.json.decode(response.content, type=_Answer)
            signed = SignedEvidence(evidence=answer.evidence, signature=answer.signature)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise self._failed("provider evidence malformed", key, exc) from exc
        if not verify(signed, self._secret):
            log.error(
                "provider evidence does not verify", extra={"sink_key": sink_key(reservation)}
            )
            raise ProviderUnavailable("provider evidence does not verify")
        ev = signed.evidence
        if (
            str(ev.operation_id) != reservation.operation_id
            or ev.binding_generation != reservation.binding_generation
            or ev.request_fingerprint != reservation.request_fingerprint
        ):
            log.error(
                "provider evidence names another reservation",
                extra={"sink_key": sink_key(reservation)},
            )
            raise ProviderUnavailable("provider evidence names another reservation")
        return signed


class _Answer(msgspec.Struct, frozen=True):
    reference: str
    evidence: Evidence
    signature: str
