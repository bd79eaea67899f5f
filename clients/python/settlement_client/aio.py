"""The asyncio client: ``AsyncClient`` and ``AsyncAdminClient``, the same methods as the
synchronous ones (each a coroutine), over one pooled httpx.AsyncClient."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from . import _routes
from ._actions import ANSWERS, ActionAnswer, AsyncIdempotentCalls, idempotent
from ._call import Answer, Request
from .client import DEFAULT_TIMEOUT, _Base
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

__all__ = ["AsyncAdminClient", "AsyncClient"]


class AsyncClient(AsyncIdempotentCalls, _Base):
    """``async with AsyncClient(url, api_key) as client: await client.create_transfer(...)``.

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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            base_url, api_key, policy=policy, budget=budget, timeout=timeout, hooks=hooks, rng=rng
        )
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport, timeout=timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, request: Request, kind: Any, *, policy: RetryPolicy | None = None) -> Any:
        """Send ``request`` under the retry policy: the final 2xx as an :class:`Answer`,
        anything else raised (:class:`~settlement_client.problems.SettlementError`)."""
        call = self._call(request, policy)
        while True:
            response: httpx.Response | None = None
            try:
                response = await self._http.request(
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
            await asyncio.sleep(decision.wait)

    # -- idempotent routes: create_<kind> (IdempotentCalls), perform -----------------------

    async def perform(
        self, action: IntendedAction, *, prefer_wait: int = 0, policy: RetryPolicy | None = None
    ) -> Answer[ActionAnswer]:
        """Send a persisted intended action with its own key (first time or after a restart)."""
        request = idempotent(action.kind, action.body, action.key, prefer_wait)
        answer: Answer[ActionAnswer] = await self.send(request, ANSWERS[action.kind], policy=policy)
        return answer

    # -- reads -------------------------------------------------------------------------------

    async def get_account(self, account_id: str) -> Answer[Account]:
        answer: Answer[Account] = await self.send(
            _routes.get(f"/v1/accounts/{_routes.segment(account_id)}"), Account
        )
        return answer

    async def get_operation(self, operation_id: str) -> Answer[OperationView]:
        answer: Answer[OperationView] = await self.send(
            _routes.get(f"/v1/operations/{_routes.segment(operation_id)}"), OperationView
        )
        return answer

    async def find_operation(self, key: str, route: str | None = None) -> Answer[OperationView]:
        params = {"key": key} | ({"route": route} if route else {})
        answer: Answer[OperationView] = await self.send(
            _routes.get("/v1/operations", params), OperationView
        )
        return answer

    async def problem_page(self, slug: str) -> Answer[ProblemPage]:
        answer: Answer[ProblemPage] = await self.send(
            _routes.get(f"/problems/{_routes.segment(slug)}"), ProblemPage
        )
        return answer

    async def health(self) -> Answer[Health]:
        """``GET /health``: 200 when PostgreSQL and Redis answer; 503 with the same body,
        naming the dependency that is down, when one does not (returned, not retried)."""
        request = Request("GET", "/health", answers=(503,))
        answer: Answer[Health] = await self.send(request, Health)
        return answer

    async def wait_for_outcome(self, operation_id: str, timeout: float) -> Outcome:  # noqa: ASYNC109 - the same signature as Client's; the timeout is the status resource's, not one await's
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
            view = (await self.get_operation(operation_id)).value
            polls += 1
            if view.state in TERMINAL:
                return outcome(view, polls)
            left = deadline - time.monotonic()
            if left <= 0:
                raise OutcomeTimeout(
                    f"operation {operation_id} still {view.state} after {timeout}s", view
                )
            await asyncio.sleep(min(interval, left))
            interval = next_interval(interval)


class AsyncAdminClient(AsyncClient):
    """The admin routes (an ``admin`` principal's key), besides every ``AsyncClient`` method."""

    async def create_principal(
        self, tenant: str, name: str, role: Literal["admin", "client", "observer"]
    ) -> Answer[PrincipalCreated]:
        answer: Answer[PrincipalCreated] = await self.send(
            _routes.principal(tenant, name, role), PrincipalCreated
        )
        return answer

    async def rotate_principal(self, principal_id: str) -> Answer[PrincipalCreated]:
        path = f"/admin/v1/principals/{_routes.segment(principal_id)}/rotate"
        answer: Answer[PrincipalCreated] = await self.send(Request("POST", path), PrincipalCreated)
        return answer

    async def revoke_principal(self, principal_id: str) -> Answer[PrincipalRevoked]:
        path = f"/admin/v1/principals/{_routes.segment(principal_id)}/revoke"
        answer: Answer[PrincipalRevoked] = await self.send(Request("POST", path), PrincipalRevoked)
        return answer

    async def supersede_operation(
        self,
        operation_id: str,
        reason: str,
        *,
        request: Any = None,
        rebind: bool = True,
        force: bool = False,
    ) -> Answer[Superseded]:
        answer: Answer[Superseded] = await self.send(
            _routes.supersede(operation_id, reason, request, rebind, force), Superseded
        )
        return answer

    async def resolve(
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
        answer: Answer[Resolved] = await self.send(call, Resolved)
        return answer

    async def list_work(
        self,
        state: Literal["unknown", "conflict", "in_progress"],
        *,
        tenant: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        key: str | None = None,
    ) -> Answer[WorkPage]:
        """``key``: only the operations with this Idempotency-Key."""
        answer: Answer[WorkPage] = await self.send(
            _routes.work(state, tenant, limit, after, key), WorkPage
        )
        return answer
