"""The status resource: what happened to operation X? The owner or a tenant admin only.

Anyone else is told the operation does not exist (never reveal existence). Heartbeats extend
the lease in Redis, not in the row, so the lease shown is Redis's view.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from service.app.answers import Problem, expired
from service.app.explain import explain
from service.core import ReservationTuple, Scope
from service.domain.payouts import sink_key
from service.domain.principals import Principal, Role
from service.leases import LeaseManager, LeaseUnavailable
from service.store.pool import HotPool
from service.store.retention import RetentionStore
from service.store.status import MAX_OBSERVATION_ID, OperationView, find_by_key, operation_view

# the view HTTP renders and the bound of its page parameter, named where HTTP reaches them
__all__ = ["MAX_OBSERVATION_ID", "OperationView", "StatusQueries", "pinned_tenant"]

# A lease key without an expiry would read as infinite; no lease is shown as longer than a day.
MAX_SHOWN_LEASE = 86_400.0


class StatusQueries:
    def __init__(
        self,
        views: HotPool,
        leases: LeaseManager,
        tombstones: RetentionStore,
        *,
        clock: Callable[[], float],
        external_routes: frozenset[str] = frozenset(),
    ) -> None:
        self._views = views  # the HotPool the views are read on
        self._leases = leases
        self._tombstones = tombstones
        self._clock = clock
        self._external = external_routes  # whose operations are sent with a sink key

    async def by_id(
        self,
        principal: Principal,
        operation_id: uuid.UUID,
        observations_before: int | None = None,
    ) -> OperationView | Problem:
        """``observations_before``: list the page of observations older than this id."""
        tenant = pinned_tenant(principal)
        view = await operation_view(self._views, operation_id, observations_before, tenant=tenant)
        if view is None:
            tombstone = await self._tombstones.by_operation(operation_id, tenant)
            if tombstone is not None and _may_see(
                principal, tombstone.tenant, tombstone.principal_id
            ):
                return expired(tombstone)
        return await self._shown(principal, view, str(operation_id))

    async def by_key(
        self,
        principal: Principal,
        key: str,
        route: str | None,
        observations_before: int | None = None,
    ) -> OperationView | Problem:
        view = await find_by_key(
            self._views, principal.tenant, principal.id, key, route, observations_before
        )
        if view is None:
            tombstone = await self._tombstones.by_key(principal.tenant, principal.id, key, route)
            if tombstone is not None:
                return expired(tombstone)
        return await self._shown(principal, view, f"with key {key!r}")

    async def _shown(
        self, principal: Principal, view: OperationView | None, what: str
    ) -> OperationView | Problem:
        if view is None or not _may_see(principal, view.tenant, view.principal_id):
            return Problem("not-found", f"no operation {what}")
        if view.lease is not None:
            view.lease.expires_at = await self._lease_expiry(view)
        if view.route in self._external:  # computed, never stored: the provider's key
            view.sink_key = sink_key(
                ReservationTuple(str(view.id), view.request_fingerprint, view.binding_generation)
            )
        view.explanation = explain(view)
        return view

    async def _lease_expiry(self, view: OperationView) -> datetime | None:
        """Redis's view of the lease (None when it is gone); the row's claim-time value if
        Redis cannot be asked."""
        assert view.lease is not None
        scope = Scope(view.tenant, view.principal_id, view.route, view.key)
        try:
            remaining = await self._leases.remaining(scope.lease_name())
        except LeaseUnavailable:
            return view.lease.expires_at
        if remaining is None:
            return None
        now = datetime.fromtimestamp(self._clock(), UTC)
        return now + timedelta(seconds=min(remaining, MAX_SHOWN_LEASE))


def _may_see(principal: Principal, tenant: str, owner: uuid.UUID) -> bool:
    """The owner, or an admin of the tenant; anyone else is told it does not exist."""
    if owner == principal.id:
        return True
    return principal.role is Role.ADMIN and principal.may_act_in(tenant)


def pinned_tenant(principal: Principal) -> str | None:
    """The tenant a principal's reads by operation id are pinned to: its own (it sees no
    other: another tenant's operation is not found either way); None for an all-tenant
    admin, who may read any tenant's, and whose read first finds the operation's tenant."""
    return None if principal.all_tenants else principal.tenant
