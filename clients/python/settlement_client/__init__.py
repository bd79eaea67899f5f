"""A client of the settlement server that retries safely by construction.

Every mutating call carries an Idempotency-Key that all of its retries reuse; only answers
the server calls safe to retry with the same key are retried (``policy``), with full-jitter
backoff, ``Retry-After``, ``Prefer: wait`` and a client-wide retry budget; every other
problem is raised as its own exception class (``problems``).
"""

from __future__ import annotations

from ._actions import *  # noqa: F403 - the answers of the idempotent routes, in _actions.__all__
from ._actions import ANSWERS
from ._call import Answer, Request
from .aio import AsyncAdminClient, AsyncClient
from .client import DEFAULT_TIMEOUT, AdminClient, Client
from .keys import IntendedAction
from .models import OperationView, PrincipalCreated, ProblemDocument
from .observe import AttemptEvent, Hook
from .outcome import Outcome, OutcomeTimeout
from .policy import Decision, Observed, RetryBudget, RetryPolicy, parse_retry_after
from .problems import *  # noqa: F403 - one exception class per slug, listed in problems.__all__
from .problems import __all__ as _problems

__all__ = [
    "DEFAULT_TIMEOUT",
    "AdminClient",
    "Answer",
    "AsyncAdminClient",
    "AsyncClient",
    "AttemptEvent",
    "Client",
    "Decision",
    "Hook",
    "IntendedAction",
    "Observed",
    "OperationView",
    "Outcome",
    "OutcomeTimeout",
    "PrincipalCreated",
    "ProblemDocument",
    "Request",
    "RetryBudget",
    "RetryPolicy",
    "parse_retry_after",
    *sorted({answer.__name__ for answer in ANSWERS.values()}),  # Account, Transfer, ...
    *_problems,
]
