"""The synchronous client: ``Client`` for the idempotent routes and the status resource,
``AdminClient`` for the admin routes. Thread-safe (one pooled httpx.Client underneath)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import httpx

from . import _routes
from ._actions import ANSWERS, ActionAnswer, IdempotentCalls, idempotent
from ._call import Answer, Call, Request
from .keys import IntendedAction
from .models import (
    Account,
    Health,
    OperationView,
    PrincipalCreated,
    PrincipalRevoked,
    ProblemPage,
    Resolved,
    Superseded,
    WorkPage,
)
from .observe import Hook
from .outcome import FIRST_POLL_INTERVAL, TERMINAL, Outcome, OutcomeTimeout, next_interval, outcome
from .policy import RetryBudget, RetryPolicy

__all__ = ["DEFAULT_TIMEOUT", "AdminClient", "Client"]

T = TypeVar("T")

# Per request: connect within 5 s, and an answer within 30 s (a transfer takes milliseconds;
# a payout waits on the provider up to the server's SETTLEMENT_PROVIDER_TIMEOUT).
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class _Base:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        policy: RetryPolicy | None = None,
        budget: RetryBudget | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        hooks: Sequence[Hook] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = policy or RetryPolicy()
        self.budget = budget if budget is not None else RetryBudget()
        self.timeout = timeout
        self.hooks = tuple(hooks)
        self._rng = rng or random.Random()
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }

    def _call(self, request: Request, policy: RetryPolicy | None) -> Call:
        return Call(
            request,
            policy=policy or self.policy,
            budget=self.budget,
            rng=self._rng,
            hooks=self.hooks,
        )


class Client(IdempotentCalls, _Base):
    """``with Client(url, api_key) as client: client.create_transfer(...)``.

    Every mutating call carries an Idempotency-Key (``key=``, or a fresh UUIDv4) that all
    its retries reuse; see :mod:`settlement_client.policy` for what is retried."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        policy: RetryPolicy | None = None,
        budget: RetryBudget | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        hooks: Sequence[Hook] = (),
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            base_url, api_key, policy=policy, budget=budget, timeout=timeout, hooks=hooks, rng=rng
        )
        self._http = httpx.Client(base_url=self.base_url, transport=transport, timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, request: Request, kind: Any, *, policy: RetryPolicy | None = None) -> Any:
        """Send ``request`` under the retry policy: the final 2xx as an :class:`Answer`,
        anything else raised (:class:`~settlement_client.problems.SettlementError`)."""
        call = self._call(request, policy)
        while True:
            response: httpx.Response | None = None
            try:
                response = self._http.request(
                    request.method,
                    request.path,
                    content=request.body,
                    params=request.params,
                    headers=self._headers | call.headers(),
                    timeout=call.timeout(self.timeout),
                )
            except httpx.TransportError as error:
                decision = call.observe_error(error)
            else:
                decision = call.observe_answer(response)
            if decision.action == "return":
                assert response is not None
                return call.answer(response, kind)
            if decision.action == "raise":
                raise call.failure(decision, response)
            time.sleep(decision.wait)

    # -- idempotent routes: create_<kind> (IdempotentCalls), perform -----------------------

    def perform(
        self, action: IntendedAction, *, prefer_wait: int = 0, policy: RetryPolicy | None = None
    ) -> Answer[ActionAnswer]:
        """Send a persisted intended action with its own key (first time or after a restart)."""
        request = idempotent(action.kind, action.body, action.key, prefer_wait)
        answer: Answer[ActionAnswer] = self.send(request, ANSWERS[action.kind], policy=policy)
        return answer

    # -- reads -------------------------------------------------------------------------------

    def get_account(self, account_id: str) -> Answer[Account]:
        answer: Answer[Account] = self.send(
            _routes.get(f"/v1/accounts/{_routes.segment(account_id)}"), Account
        )
        return answer

    def get_operation(self, operation_id: str) -> Answer[OperationView]:
        answer: Answer[OperationView] = self.send(
            _routes.get(f"/v1/operations/{_routes.segment(operation_id)}"), OperationView
        )
        return answer

    def find_operation(self, key: str, route: str | None = None) -> Answer[OperationView]:
        params = {"key": key} | ({"route": route} if route else {})
        answer: Answer[OperationView] = self.send(
            _routes.get("/v1/operations", params), OperationView
        )
        return answer

    def problem_page(self, slug: str) -> Answer[ProblemPage]:
        answer: Answer[ProblemPage] = self.send(
            _routes.get(f"/problems/{_routes.segment(slug)}"), ProblemPage
        )
        return answer

    def health(self) -> Answer[Health]:
        """``GET /health``: 200 when PostgreSQL and Redis answer; 503 with the same body,
        naming the dependency that is down, when one does not (returned, not retried)."""
        request = Request("GET", "/health", answers=(503,))
        answer: Answer[Health] = self.send(request, Health)
        return answer

    def wait_for_outcome(self, operation_id: str, timeout: float) -> Outcome:
        """Follow ``GET /v1/operations/{id}`` until the operation is terminal (completed,
        failed, conflict), or raise :class:`OutcomeTimeout` after ``timeout`` seconds.

        Waiting does not settle an ``unknown`` operation by itself: a payout whose provider
        answer was lost settles when that answer arrives late, when the provider's feed
        reports it, or when the request is sent again with the same key (which asks the
        provider again under the same sink key); otherwise an operator decides it."""
        deadline = time.monotonic() + timeout
        interval, polls = FIRST_POLL_INTERVAL, 0
        view: OperationView | None = None
        while True:
            view = self.get_operation(operation_id).value
            polls += 1
            if view.state in TERMINAL:
                return outcome(view, polls)
            left = deadline - time.monotonic()
            if left <= 0:
                raise OutcomeTimeout(
                    f"operation {operation_id} still {view.state} after {timeout}s", view
                )
            time.sleep(min(interval, left))
            interval = next_interval(interval)


class AdminClient(Client):
    """The admin routes (an ``admin`` principal's key), besides every ``Client`` method."""

    def create_principal(
        self, tenant: str, name: str, role: Literal["admin", "client", "observer"]
    ) -> Answer[PrincipalCreated]:
        answer: Answer[PrincipalCreated] = self.send(
            _routes.principal(tenant, name, role), PrincipalCreated
        )
        return answer

    def rotate_principal(self, principal_id: str) -> Answer[PrincipalCreated]:
        path = f"/admin/v1/principals/{_routes.segment(principal_id)}/rotate"
        answer: Answer[PrincipalCreated] = self.send(Request("POST", path), PrincipalCreated)
        return answer

    def revoke_principal(self, principal_id: str) -> Answer[PrincipalRevoked]:
        path = f"/admin/v1/principals/{_routes.segment(principal_id)}/revoke"
        answer: Answer[PrincipalRevoked] = self.send(Request("POST", path), PrincipalRevoked)
        return answer

    def supersede_operation(
        self,
        operation_id: str,
        reason: str,
        *,
        request: Any = None,
        rebind: bool = True,
        force: bool = False,
    ) -> Answer[Superseded]:
        answer: Answer[Superseded] = self.send(
            _routes.supersede(operation_id, reason, request, rebind, force), Superseded
        )
        return answer

    def resolve(
        self,
        operation_id: str,
        outcome: Literal["completed", "failed"],
        *,
        provider_reference: str,
        reason: str,
        status: int,
        body: dict[str, Any],
    ) -> Answer[Resolved]:
        """Settle an ``unknown`` or ``conflict`` operation as ``outcome`` (an operator's
        resolution): ``status`` and ``body`` are what the operation stores and replays to
        its client's next retry (a 2xx for ``completed``, a 4xx for ``failed``). Raises
        ``ResolutionRefused`` when the server's settlement core does not apply it."""
        call = _routes.resolve(operation_id, outcome, provider_reference, reason, status, body)
        answer: Answer[Resolved] = self.send(call, Resolved)
        return answer

    def list_work(
        self,
        state: Literal["unknown", "conflict", "in_progress"],
        *,
        tenant: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        key: str | None = None,
    ) -> Answer[WorkPage]:
        """``key``: only the operations with this Idempotency-Key."""
        answer: Answer[WorkPage] = self.send(
            _routes.work(state, tenant, limit, after, key), WorkPage
        )
        return answer
