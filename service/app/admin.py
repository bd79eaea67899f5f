"""Admin use cases: principals, supersede (a new reservation epoch) and the work list.

An admin acts in its own tenant; the bootstrap admin (``all_tenants``) in every tenant.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.answers import Problem
from service.app.effects import IdempotentRoute
from service.app.fingerprint import canonical_request, fingerprint_of
from service.app.resolve import ResolveBody, Resolved, resolve
from service.app.status import pinned_tenant
from service.core import Refuse, RefuseReason, Scope
from service.domain.principals import Principal, Role
from service.leases import LeaseManager
from service.store.pool import HotPool
from service.store.principals import (
    BOOTSTRAP_TENANT,
    PrincipalExists,
    PrincipalLimit,
    PrincipalStore,
)
from service.store.settlement import SettlementStore
from service.store.status import OperationView, operation_view
from service.store.worklist import (
    BadCursor,
    WorkPage,
    count_operations,
    list_by_key,
    list_operations,
)

# PrincipalExists and WorkPage: what HTTP catches and renders, named where HTTP reaches them
__all__ = [
    "KEY_PATTERN",
    "Admin",
    "PrincipalCreated",
    "PrincipalExists",
    "PrincipalRequest",
    "ResolveBody",
    "Resolved",
    "SupersedeBody",
    "Superseded",
    "WorkPage",
]

Tenant = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,128}(?!\n)$")]
Name = Annotated[str, msgspec.Meta(pattern=r"^[\x20-\x7e]{1,256}(?!\n)$")]
Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=r"^[^\x00]*$")]
# An Idempotency-Key as stored: 1-255 printable ASCII characters (service.http.keys, unquoted).
KEY_PATTERN = r"^[\x20-\x7e]{1,255}(?!\n)$"
Key = Annotated[str, msgspec.Meta(pattern=KEY_PATTERN)]
_BAD_KEY = "key: an Idempotency-Key is 1 to 255 printable ASCII characters"


class PrincipalRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    tenant: Tenant
    name: Name
    role: Role


class PrincipalCreated(msgspec.Struct):
    id: uuid.UUID
    tenant: str
    name: str
    role: str
    credential_generation: int
    api_key: str


class PrincipalRevoked(msgspec.Struct):
    id: uuid.UUID
    tenant: str
    name: str
    revoked_at: datetime


class SupersedeBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    reason: Reason
    request: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    rebind: bool = True
    force: bool = False


class Superseded(msgspec.Struct):
    operation: OperationView
    effect_may_run_again: bool  # completed or in conflict before, or an external outcome unknown
    fenced_live_attempt: bool


_REFUSALS: dict[RefuseReason, tuple[str, str, str | None]] = {
    RefuseReason.OUTCOME_UNKNOWN_NEEDS_FORCE: (
        "supersede-needs-force",
        "the previous epoch's external effect may have happened (its outcome is "
        "unknown) and a new epoch uses a new sink key: pass force: true to accept "
        "that it may happen twice",
        None,
    ),
    RefuseReason.LIVE_ATTEMPT: (
        "operation-in-progress",
        "an attempt holds a live lease; pass force: true to fence it out",
        "in_progress",
    ),
    RefuseReason.CONFLICT_NEEDS_FORCE: (
        "supersede-needs-force",
        "the operation is in conflict: at least one observation says the effect happened, "
        "so superseding it may let the effect run again; pass force: true to do that",
        "conflict",
    ),
    RefuseReason.COMPLETED_NEEDS_FORCE: (
        "supersede-needs-force",
        "the operation is completed: superseding it lets the effect run again; "
        "pass force: true to do that",
        "completed",
    ),
}


class Admin:
    def __init__(
        self,
        *,
        principals: PrincipalStore,
        store: SettlementStore,
        reader: AsyncEngine,
        views: HotPool,
        leases: LeaseManager,
        routes: dict[str, IdempotentRoute],
        max_principals: int,
    ) -> None:
        self._max_principals = max_principals  # live principals per tenant
        self._principals = principals
        self._store = store
        self._reader = reader
        self._views = views  # the HotPool the operation views are read on
        self._leases = leases
        self._routes = routes

    async def create_principal(
        self, admin: Principal, body: PrincipalRequest
    ) -> PrincipalCreated | Problem:
        if body.tenant == BOOTSTRAP_TENANT:
            return Problem("forbidden", f"tenant {BOOTSTRAP_TENANT!r} is reserved")
        if not admin.may_act_in(body.tenant):
            return Problem("forbidden", f"this admin may not act in tenant {body.tenant!r}")
        try:
            principal, key = await self._principals.create(
                body.tenant, body.name, body.role, limit=self._max_principals
            )
        except PrincipalLimit as exc:
            return Problem("principal-limit", str(exc))
        return _created(principal, key)

    async def rotate_principal(
        self, admin: Principal, principal_id: uuid.UUID
    ) -> PrincipalCreated | Problem:
        if not await self._may_manage(admin, principal_id):
            return Problem("not-found", f"no principal {principal_id}")
        rotated = await self._principals.rotate(principal_id)
        if rotated is None:
            return Problem("not-found", f"no live principal {principal_id}")
        return _created(*rotated)

    async def revoke_principal(
        self, admin: Principal, principal_id: uuid.UUID
    ) -> PrincipalRevoked | Problem:
        """The principal's key stops working at once, for good (a new principal is made to
        replace it)."""
        if not await self._may_manage(admin, principal_id):
            return Problem("not-found", f"no principal {principal_id}")
        revoked = await self._principals.revoke(principal_id)
        if revoked is None:
            return Problem("not-found", f"no live principal {principal_id}")
        principal, at = revoked
        return PrincipalRevoked(
            id=principal.id, tenant=principal.tenant, name=principal.name, revoked_at=at
        )

    async def managed_principal(
        self, admin: Principal, principal_id: uuid.UUID
    ) -> Principal | Problem:
        """The principal, if this admin manages it (what a revoke's confirmation shows):
        an admin manages the principals of its tenant; an all-tenant principal (the
        bootstrap admin) only another all-tenant one does. Others are not found."""
        target = await self._principals.get(principal_id)
        if (
            target is None
            or not admin.may_act_in(target.tenant)
            or (target.all_tenants and not admin.all_tenants)
        ):
            return Problem("not-found", f"no principal {principal_id}")
        return target

    async def _may_manage(self, admin: Principal, principal_id: uuid.UUID) -> bool:
        return not isinstance(await self.managed_principal(admin, principal_id), Problem)

    async def supersede(
        self, admin: Principal, operation_id: uuid.UUID, body: SupersedeBody
    ) -> Superseded | Problem:
        """Start a new reservation epoch (the store decides under the row lock)."""
        view = await operation_view(self._views, operation_id, tenant=pinned_tenant(admin))
        if view is None or not admin.may_act_in(view.tenant):
            return Problem("not-found", f"no operation {operation_id}")
        edited = canonical = None
        if bytes(body.request) not in (b"", b"null"):
            spec = self._routes.get(view.route)
            if spec is None:
                return Problem("validation-error", f"route {view.route} has no schema")
            try:
                request = msgspec.json.decode(bytes(body.request), type=spec.body_type)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
                return Problem("validation-error", f"request: {exc or 'nested too deeply'}")
            covered = canonical_request(spec.route, {}, request)
            edited, canonical = fingerprint_of(covered), covered.decode()
        spec = self._routes.get(view.route)
        decision = await self._store.supersede(
            operation_id,
            reason=body.reason,
            admin_id=admin.id,
            request_fingerprint=edited,
            canonical_request=canonical,
            rebind=body.rebind,
            force=body.force,
            external=spec is not None and spec.external is not None,
            lease_remaining=self._lease_remaining,
            tenant=view.tenant,
        )
        if isinstance(decision, Refuse):
            slug, detail, state = _REFUSALS[decision.reason]
            return Problem(slug, detail, str(operation_id), state=state or view.state)
        if decision.fenced_live_attempt:
            scope = Scope(view.tenant, view.principal_id, view.route, view.key)
            await self._leases.revoke(scope.lease_name())
        after = await operation_view(self._views, operation_id, tenant=pinned_tenant(admin))
        assert after is not None
        return Superseded(
            operation=after,
            effect_may_run_again=decision.effect_may_run_again,
            fenced_live_attempt=decision.fenced_live_attempt,
        )

    async def resolve(
        self, admin: Principal, operation_id: uuid.UUID, body: ResolveBody
    ) -> Resolved | Problem:
        """Settle an ``unknown`` or ``conflict`` operation as the operator says
        (:mod:`service.app.resolve`)."""
        return await resolve(
            store=self._store,
            views=self._views,
            leases=self._leases,
            admin=admin,
            operation_id=operation_id,
            body=body,
        )

    async def _lease_remaining(self, scopes: list[Scope]) -> list[float | None]:
        return await self._leases.remaining_many([scope.lease_name() for scope in scopes])

    async def work_list(
        self,
        admin: Principal,
        state: str,
        tenant: str | None,
        limit: int,
        after: str | None,
        *,
        route: str | None = None,
        older_than: float | None = None,
        key: str | None = None,
    ) -> WorkPage | Problem:
        """``route`` and ``older_than`` (seconds since the row last changed) narrow the list
        further (the console's filters), ``key`` to one Idempotency-Key (the API's)."""
        scoped = _work_tenant(admin, tenant)
        if isinstance(scoped, Problem):
            return scoped
        if key is not None and not _is_key(key):
            return Problem("validation-error", _BAD_KEY)
        try:
            return await list_operations(
                self._reader,
                state=state,
                tenant=scoped,
                limit=limit,
                after=after,
                route=route,
                older_than=older_than,
                key=key,
            )
        except BadCursor as exc:
            return Problem("validation-error", str(exc))

    async def key_search(
        self, admin: Principal, key: str, tenant: str | None, limit: int, after: str | None
    ) -> WorkPage | Problem:
        """The operations in the admin's reach (of ``tenant`` if given) whose
        Idempotency-Key is ``key``: any state, any principal, any route, oldest first."""
        if not _is_key(key):
            return Problem("validation-error", _BAD_KEY)
        scoped = _work_tenant(admin, tenant)
        if isinstance(scoped, Problem):
            return scoped
        try:
            return await list_by_key(self._reader, key=key, tenant=scoped, limit=limit, after=after)
        except BadCursor as exc:
            return Problem("validation-error", str(exc))

    async def work_counts(
        self, admin: Principal, tenant: str | None, route: str | None = None
    ) -> dict[str, int] | Problem:
        """How many operations each state of the work list holds, in the admin's reach."""
        scoped = _work_tenant(admin, tenant)
        if isinstance(scoped, Problem):
            return scoped
        return await count_operations(self._reader, tenant=scoped, route=route)


def _is_key(key: str) -> bool:
    try:
        msgspec.convert(key, Key)
    except msgspec.ValidationError:
        return False
    return True


def _work_tenant(admin: Principal, tenant: str | None) -> str | Problem | None:
    """The tenant a work list reads (None: every tenant), or why it may not."""
    if tenant is not None:
        try:
            tenant = msgspec.convert(tenant, Tenant)
        except msgspec.ValidationError as exc:
            return Problem("validation-error", f"tenant: {exc}")
    if tenant is None and not admin.all_tenants:
        tenant = admin.tenant
    if tenant is not None and not admin.may_act_in(tenant):
        return Problem("forbidden", f"this admin may not act in tenant {tenant!r}")
    return tenant


def _created(principal: Principal, key: str) -> PrincipalCreated:
    return PrincipalCreated(
        id=principal.id,
        tenant=principal.tenant,
        name=principal.name,
        role=principal.role.value,
        credential_generation=principal.credential_generation,
        api_key=key,
    )
