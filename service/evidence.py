"""Signed evidence of an external outcome, shared by the provider and the server.

Evidence names the reservation tuple it is about and the result the operation should store.
It is signed with HMAC-SHA256 under the provider's shared secret over its canonical encoding:
the JSON of the evidence object with keys sorted at every level, no whitespace. The stored
result body is the canonical JSON of ``result.body``, with content type ``application/json``
for a success and ``application/problem+json`` for a failure, so the server's stored digest
and the provider's ``result_digest`` agree byte for byte.

The request fingerprint lives here too, because evidence carries it and the provider
simulator recomputes it from the payment it makes: SHA-256 (hex) of the JSON encoding, with
object keys sorted, of ``{"route": <method and path template>, "path": <path parameters>,
"body": <the decoded, validated request Struct with every default filled in>}``. Key order,
whitespace, and omitting a field versus sending its default do not change it; any
semantically different value does.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Annotated, Any, Literal

import msgspec

from service.core import Observation, ObservationKind, ReservationTuple, Result, Source

__all__ = [
    "Evidence",
    "EvidenceResult",
    "SignedEvidence",
    "canonical",
    "canonical_request",
    "content_type_for",
    "fingerprint",
    "fingerprint_of",
    "observation_of",
    "result_digest",
    "sign",
    "stored_body",
    "verify",
]


Hex64 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}(?!\n)$")]


class EvidenceResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    status: Annotated[int, msgspec.Meta(ge=100, le=599)]
    body: dict[str, Any]


class Evidence(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    operation_id: uuid.UUID
    binding_generation: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    request_fingerprint: Hex64
    outcome: Literal["completed", "failed"]
    result: EvidenceResult
    result_digest: Hex64
    issued_at: Annotated[str, msgspec.Meta(max_length=64)]

    def __post_init__(self) -> None:
        status = self.result.status
        if self.outcome == "completed" and not 200 <= status < 300:
            raise ValueError("a completed outcome carries a 2xx status")
        if self.outcome == "failed" and not 400 <= status < 500:
            raise ValueError("a failed outcome carries a 4xx status")


# HMAC-SHA256 in lower-case hex. Every pattern here ends in "(?!\n)$": "$" alone also
# matches before a final newline.
Signature = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}(?!\n)$")]


class SignedEvidence(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    evidence: Evidence
    signature: Signature


def canonical(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def canonical_request(route: str, path_params: dict[str, Any], body: msgspec.Struct) -> bytes:
    """The bytes the request fingerprint of ``body`` on ``route`` covers (the rule is in the
    module docstring); an operation's row keeps them to show what was asked."""
    return msgspec.json.encode(
        {"route": route, "path": path_params, "body": msgspec.to_builtins(body)},
        order="sorted",
    )


def fingerprint_of(canonical: bytes) -> str:
    """The request fingerprint of a :func:`canonical_request`."""
    return hashlib.sha256(canonical).hexdigest()


def fingerprint(route: str, path_params: dict[str, Any], body: msgspec.Struct) -> str:
    """The request fingerprint of ``body`` on ``route`` (the rule is in the module docstring)."""
    return fingerprint_of(canonical_request(route, path_params, body))


def content_type_for(outcome: str) -> str:
    return "application/json" if outcome == "completed" else "application/problem+json"


def stored_body(result: EvidenceResult) -> bytes:
    return canonical(result.body)


def result_digest(status: int, content_type: str, body: bytes) -> str:
    """Digest of a stored outcome: two outcomes are the same iff status, type and body are."""
    h = hashlib.sha256()
    h.update(f"{status}\n{content_type}\n".encode())
    h.update(body)
    return h.hexdigest()


def sign(evidence: Evidence, secret: str) -> str:
    return hmac.new(secret.encode(), canonical(evidence), hashlib.sha256).hexdigest()


def verify(signed: SignedEvidence, secret: str) -> bool:
    """Constant-time check of the signature, then of the digest the evidence claims."""
    expected = sign(signed.evidence, secret)
    if not hmac.compare_digest(expected.encode(), signed.signature.encode()):
        return False
    ev = signed.evidence
    body = stored_body(ev.result)
    digest = result_digest(ev.result.status, content_type_for(ev.outcome), body)
    return hmac.compare_digest(digest, ev.result_digest)


def observation_of(
    evidence: Evidence, source: Source, *, verified: bool = True, attempt_fencing: int | None = None
) -> Observation:
    """The observation verified evidence makes: its tuple comes only from the evidence."""
    content_type = content_type_for(evidence.outcome)
    return Observation(
        reservation=ReservationTuple(
            operation_id=str(evidence.operation_id),
            request_fingerprint=evidence.request_fingerprint,
            binding_generation=evidence.binding_generation,
        ),
        kind=ObservationKind(evidence.outcome),
        source=source,
        result=Result(
            status=evidence.result.status,
            content_type=content_type,
            body=stored_body(evidence.result),
            digest=evidence.result_digest,
        ),
        fencing_token=attempt_fencing,
        verified=verified,
    )
