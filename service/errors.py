"""The one root of the server's errors: every layer's error is a :class:`SettlementError`
that names its problem type (a slug of :mod:`service.problem_types`), and the HTTP layer
answers any of them through that registry, in one place (``service.http.problems``).

The tree (each layer raises its own; none below http raises an HTTP exception), with the
problem type each names::

    SettlementError                                  internal-error (the default)
    ├── InvalidObservation      core    an observation malformed on its face: internal-error
    ├── BadCursor               store   a list cursor that does not decode: validation-error
    ├── OperationNotFound       store   no such operation, or not the caller's: not-found
    ├── KeyExpired              store   purged; its tombstone stands: idempotency-key-expired
    ├── EffectRefused           store   a constraint refused an effect's writes: effect-refused
    ├── PrincipalExists         store   the tenant has a principal of that name
    ├── PrincipalLimit          store   the tenant holds as many principals as it may
    ├── StaleRevision           store   the CAS matched no row (the phase runner reruns it)
    ├── RowLocked               store   a row stayed locked past the lock timeout:
    │                                   operation-in-progress
    ├── SettlementContention    store   the revision kept moving: service-unavailable
    ├── DatabaseUnavailable     store   the database went away under a statement or gave no
    │   │                               connection: service-unavailable (never the driver's
    │   │                               own errors: service.store.db decides, once)
    │   └── PoolTimeout         store   no pooled connection came free in time
    ├── LeaseUnavailable        leases  Redis unreachable or too slow: lease-unavailable
    └── ProblemError            http    a refusal of the request, named by its slug
        ├── AuthError                   credentials or role
        └── IdempotencyKeyError         the Idempotency-Key header

``retry_after`` of an error's problem type says what kind of error it is: with it, a busy or
unreachable dependency (the client is told to retry with the same key, the error's own
message goes to the log); without it, a refusal whose message is the answer's detail.

Standard library only: core imports it too.
"""

from __future__ import annotations

__all__ = ["SettlementError"]


class SettlementError(Exception):
    """Anything the server refuses or fails with on purpose; ``problem`` is its slug."""

    problem: str = "internal-error"
