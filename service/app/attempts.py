"""One claimed attempt, from its effect to its answer (docs/design.md §5 steps 5-6).

Local and external effects run the same way: the work is a task, a heartbeat extends the
scope's lease while it runs, and the attempt waits for whichever comes first of the work
ending, the lease being lost, or (external only) the provider timeout.

* **local**: the effect runs inside its settlement transaction (``settle_local``). A lost
  lease cancels it, possibly mid-commit, so the answer then comes from the row: only a
  commit under this attempt's own fencing token is this attempt's outcome.
* **external**: the call is bounded by the late-response window. Past the provider timeout
  (or a lost lease) the attempt settles ``unknown`` (504) and hands the call to the late
  answer keeper, which settles the answer if it still arrives.

A bug is not an outcome: the attempt reports ``unknown`` so a retry may run again.

The parts: the heartbeat and the wait (:mod:`service.app.attempt_lease`), the local runner
(:mod:`service.app.local_attempts`, which also answers a database integrity error raised by
a local effect: 409 ``effect-refused``, nothing written), the external runner
(:mod:`service.app.external_attempts`), and what an attempt reports about itself
(:mod:`service.app.attempt_self`).
"""

from __future__ import annotations

import time
from typing import Any

from service.app.answers import Answer
from service.app.attempt_lease import LeaseKeeper
from service.app.attempt_self import attempt_of
from service.app.effects import IdempotentRoute
from service.app.external_attempts import ExternalAttempts
from service.app.local_attempts import LocalAttempts
from service.app.ports import LatePort, LeasePort, SettlementPort
from service.domain.payouts import ProviderClient
from service.domain.principals import Principal
from service.failpoints import Failpoints
from service.leases import Lease
from service.store.settlement import ClaimOutcome
from service.telemetry import Metrics

__all__ = ["Attempts"]


class Attempts:
    def __init__(
        self,
        *,
        store: SettlementPort,
        leases: LeasePort,
        late: LatePort,
        failpoints: Failpoints,
        provider_timeout: float,
        late_response_window: float,
        metrics: Metrics | None = None,
        provider: ProviderClient | None = None,
    ) -> None:
        """``provider``: what external effects call (None: this server has none)."""
        self._metrics = metrics or Metrics()
        self._provider = provider
        keeper = LeaseKeeper(leases, failpoints)
        self._local = LocalAttempts(
            store=store, keeper=keeper, failpoints=failpoints, metrics=self._metrics
        )
        self._external = ExternalAttempts(
            store=store,
            keeper=keeper,
            late=late,
            failpoints=failpoints,
            provider_timeout=provider_timeout,
            late_response_window=late_response_window,
        )
        # a scope with no row, a local route with a statement form: claim, run and settle in
        # one statement (None: claim, then settle under the row's lock)
        self.run_new_local = self._local.run_new_local

    async def run(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        body: Any,
        claimed: ClaimOutcome,
        lease: Lease,
    ) -> Answer:
        """Run the claimed attempt under ``lease`` and say what its client is told."""
        started = time.perf_counter()
        attempt, context = attempt_of(claimed, principal, self._provider)
        try:
            if spec.external is not None:
                return await self._external.run(spec, spec.external, context, attempt, body, lease)
            assert spec.statement is not None
            return await self._local.run(spec, spec.statement, context, attempt, body, lease)
        finally:
            self._metrics.on_attempt(spec.route, time.perf_counter() - started)
