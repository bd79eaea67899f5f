"""The console's read pages (GET): every one works without JavaScript. Each calls the same
use cases the admin API does; a refusal is a page naming what was refused."""

from __future__ import annotations

import re
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from litestar.params import FromPath
from litestar.response import Template

from service.app.answers import Problem
from service.app.console import ConsoleSession, supersede_advice
from service.app.status import OperationView
from service.http.console.render import page, problem_page, refusal
from service.http.console.security import safe_next, session_of, sign_in_cookie, signed_in
from service.http.console.timeline import (
    observations_before,
    pretty_body,
    request_facts,
    timeline,
)
from service.http.deps import Services

__all__ = [
    "feeds_page",
    "operation_page",
    "principals_page",
    "sign_in_page",
    "stylesheet",
    "work_page",
]

WORK_STATES = ("unknown", "conflict", "in_progress")
# Operations per page of the work list.
WORK_PAGE = 50
# Longest ``older`` filter, in minutes (a year).
MAX_AGE_MINUTES = 525_600
# The ``older`` filter as sent: ASCII digits, no more than MAX_AGE_MINUTES has.
_MINUTES = re.compile(rf"[0-9]{{1,{len(str(MAX_AGE_MINUTES))}}}")
STATIC = Path(__file__).resolve().parent / "static"
# A settled hold's new state as the feeds page announces it after a decision.
DECIDED_STATES = ("quarantined", "held", "applied", "ignored")


@cache
def _css() -> bytes:
    return (STATIC / "console.css").read_bytes()


@get("/static/console.css", include_in_schema=False, media_type="text/css")
async def stylesheet() -> Response[bytes]:
    return Response(_css(), media_type="text/css")


@get("/sign-in", include_in_schema=False)
async def sign_in_page(request: Request[Any, Any, Any], settlement: Services) -> Template:
    """The sign-in form (a fresh form token each time); already signed in, it still shows."""
    token, cookie = sign_in_cookie(request)
    session = await settlement.console.session(session_of(request))
    return page(
        "sign_in.html",
        session,
        cookies=[cookie],
        form_token=token,
        next=safe_next(request.query_params.get("next")),
        error=None,
    )


def _query(request: Request[Any, Any, Any], name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value else None


@get("/", include_in_schema=False)
async def work_page(request: Request[Any, Any, Any], settlement: Services) -> Template:
    """The work list: unknown, conflict and in-progress operations with counts per state,
    filtered by tenant, route, state and age, a page at a time (the admin API's cursor)."""
    session = await signed_in(request, settlement)
    admin = session.principal
    state = _query(request, "state") or "unknown"
    tenant, route, after = (
        _query(request, "tenant"),
        _query(request, "route"),
        _query(request, "after"),
    )
    older = _query(request, "older")
    if state not in WORK_STATES:
        return refusal(
            session, 400, "Invalid filter", f"state must be one of {', '.join(WORK_STATES)}"
        )
    if route is not None and route not in settlement.routes:
        return refusal(session, 400, "Invalid filter", "route must be one of the server's routes")
    minutes: int | None = None
    if older is not None:
        # ASCII digits only, and few (str.isdigit takes "²", and int() of 5,000 digits raises)
        if not _MINUTES.fullmatch(older) or int(older) > MAX_AGE_MINUTES:
            return refusal(
                session,
                400,
                "Invalid filter",
                f"age must be a whole number of minutes, 0 to {MAX_AGE_MINUTES}",
            )
        minutes = int(older)
    if after is not None and "\x00" in after:
        return refusal(session, 400, "Invalid filter", "malformed cursor")
    counts = await settlement.admin.work_counts(admin, tenant, route)
    if isinstance(counts, Problem):
        return problem_page(session, counts)
    found = await settlement.admin.work_list(
        admin,
        state,
        tenant,
        WORK_PAGE,
        after,
        route=route,
        older_than=None if minutes is None else minutes * 60.0,
    )
    if isinstance(found, Problem):
        return problem_page(session, found)
    filters = {"state": state, "tenant": tenant or "", "route": route or "", "older": older or ""}
    return page(
        "work.html",
        session,
        items=found.items,
        next=found.next,
        counts=counts,
        filters=filters,
        states=WORK_STATES,
        routes=sorted(settlement.routes),
        paged=after is not None,
    )


async def operation_context(
    settlement: Services, session: ConsoleSession, view: OperationView
) -> dict[str, Any]:
    """What the operation page shows of ``view``: what was asked, its timeline and what a
    supersede does."""
    receipts = await settlement.console.receipts(session.principal, view.id)
    spec = settlement.routes.get(view.route)
    live = view.lease is not None and view.lease.expires_at is not None
    return {
        "op": view,
        "entries": timeline(view, receipts),
        "receipts_shown": receipts is not None,
        "advice": supersede_advice(
            view.state, external=spec is not None and spec.external is not None, lease_live=live
        ),
        "result_body": None if view.result is None else pretty_body(view.result.body),
        "request_facts": request_facts(view),
    }


@get("/operations/{operation_id:str}", include_in_schema=False)
async def operation_page(
    request: Request[Any, Any, Any], settlement: Services, operation_id: FromPath[str]
) -> Template:
    """Everything the status resource knows of one operation, as a timeline, with the
    supersede form."""
    session = await signed_in(request, settlement)
    try:
        ident = uuid.UUID(operation_id)
    except ValueError:
        return refusal(session, 404, "Not found", "no such operation")
    try:
        before = observations_before(request.query_params.get("observations_before"))
    except ValueError as exc:
        return refusal(session, 400, "Invalid page", str(exc))
    view = await settlement.status.by_id(session.principal, ident, before)
    if isinstance(view, Problem):
        return problem_page(session, view)
    context = await operation_context(settlement, session, view)
    return page("operation.html", session, error=None, paged=before is not None, **context)


@get("/feeds", include_in_schema=False)
async def feeds_page(request: Request[Any, Any, Any], settlement: Services) -> Template:
    """Per feed: its checkpoint, lag, open holds (quarantine / retry), alarms and the source
    contract it was configured with. Only an all-tenant admin sees feeds."""
    session = await signed_in(request, settlement)
    listed = await settlement.feed_admin.list(session.principal)
    if isinstance(listed, Problem):
        return problem_page(session, listed)
    decided_state = request.query_params.get("state")
    notice = None
    if decided_state in DECIDED_STATES and request.query_params.get("event"):
        notice = f"Event {request.query_params['event'][:255]} is now {decided_state}."
    return page("feeds.html", session, feeds=listed.items, notice=notice)


@get("/principals", include_in_schema=False)
async def principals_page(request: Request[Any, Any, Any], settlement: Services) -> Template:
    """The principals this admin manages, with create, rotate and revoke, newest first, a
    page at a time (``before``: the cursor of the page before), of one tenant (``tenant``)
    or, for an all-tenant admin, of every tenant."""
    session = await signed_in(request, settlement)
    tenant, before = _query(request, "tenant"), _query(request, "before")
    listed = await settlement.console.principals(session.principal, tenant, before)
    if isinstance(listed, Problem):
        return problem_page(session, listed)
    return page(
        "principals.html",
        session,
        principals=listed.items,
        next=listed.next,
        tenant=tenant or "",
        paged=before is not None,
        notice=None,
        error=None,
    )
