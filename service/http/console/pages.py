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
from litestar.response import Redirect, Template

from service.app.answers import Problem
from service.app.console import ConsoleSession, supersede_advice
from service.app.status import OperationView
from service.core.feed import twice_in_one_page
from service.http.console.render import page, problem_page, problem_status, refusal
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
    "revoke_page",
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
# An operation id typed into the search box: a UUID in its usual hyphenated form.
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
STATIC = Path(__file__).resolve().parent / "static"
# A settled hold's new state as the feeds page announces it after a decision.
DECIDED_STATES = ("quarantined", "held", "applied", "ignored")
# What the feeds page announces after an operator accepted a conflicting identity.
ACCEPTED = "conflict-accepted"


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
async def work_page(request: Request[Any, Any, Any], settlement: Services) -> Template | Redirect:
    """The work list: unknown, conflict and in-progress operations with counts per state,
    filtered by tenant, route, state and age, a page at a time (the admin API's cursor).
    ``key``: a search instead (:func:`_search`). A refused filter or search is the page
    again, with what was typed and why it was refused (400)."""
    session = await signed_in(request, settlement)
    admin = session.principal
    state = _query(request, "state") or "unknown"
    tenant, route, after = (
        _query(request, "tenant"),
        _query(request, "route"),
        _query(request, "after"),
    )
    older, searched = _query(request, "older"), _query(request, "key")
    filters = {"state": state, "tenant": tenant or "", "route": route or "", "older": older or ""}
    shown: dict[str, Any] = {
        "filters": filters,
        "searched": searched,
        "routes": sorted(settlement.routes),
    }
    error = _filter_error(state, route, older, after, settlement)
    if error is not None:
        return _refused(session, error, **shown)
    if searched is not None:
        return await _search(settlement, session, searched.strip(), tenant, after, shown)
    counts = await settlement.admin.work_counts(admin, tenant, route)
    if isinstance(counts, Problem):
        return _refused(session, counts, **shown)
    found = await settlement.admin.work_list(
        admin,
        state,
        tenant,
        WORK_PAGE,
        after,
        route=route,
        older_than=None if older is None else int(older) * 60.0,
    )
    if isinstance(found, Problem):
        return _refused(session, found, **shown)
    return page(
        "work.html",
        session,
        items=found.items,
        next=found.next,
        counts=counts,
        states=WORK_STATES,
        paged=after is not None,
        error=None,
        **shown,
    )


def _filter_error(
    state: str, route: str | None, older: str | None, after: str | None, settlement: Services
) -> str | None:
    """Why the work list's filters are refused, or None."""
    if state not in WORK_STATES:
        return f"state must be one of {', '.join(WORK_STATES)}"
    if route is not None and route not in settlement.routes:
        return "route must be one of the server's routes"
    # ASCII digits only, and few (str.isdigit takes "²", and int() of 5,000 digits raises)
    if older is not None and (not _MINUTES.fullmatch(older) or int(older) > MAX_AGE_MINUTES):
        return f"age must be a whole number of minutes, 0 to {MAX_AGE_MINUTES}"
    if after is not None and "\x00" in after:
        return "malformed cursor"
    return None


async def _search(
    settlement: Services,
    session: ConsoleSession,
    searched: str,
    tenant: str | None,
    after: str | None,
    shown: dict[str, Any],
) -> Template | Redirect:
    """An operation id goes to its page if the admin may see it; anything else (an id not
    seen included: keys are often UUIDs too) lists the operations in reach with that
    Idempotency-Key, any state, principal and route. An id that is neither is the usual
    not-found page: nothing says whether it exists elsewhere."""
    ident = _operation_id(searched)
    if ident is not None and after is None:
        view = await settlement.status.by_id(session.principal, ident)
        if not isinstance(view, Problem) or view.slug != "not-found":
            return Redirect(path=f"/console/operations/{ident}", status_code=303)
    found = await settlement.admin.key_search(session.principal, searched, tenant, WORK_PAGE, after)
    if isinstance(found, Problem):
        return _refused(session, found, **shown)
    if ident is not None and not found.items and after is None:
        return problem_page(session, Problem("not-found", f"no operation {ident}"))
    return page(
        "work.html",
        session,
        items=found.items,
        next=found.next,
        counts=None,
        states=WORK_STATES,
        paged=after is not None,
        error=None,
        **shown,
    )


def _operation_id(searched: str) -> uuid.UUID | None:
    """``searched`` as an operation id, if it is one (the hyphenated form, any case)."""
    if not _UUID.fullmatch(searched):
        return None
    return uuid.UUID(searched)


def _refused(session: ConsoleSession, refused: str | Problem, **shown: Any) -> Template:
    """The work list's form again, as typed, saying why it was refused; nothing listed."""
    status = 400
    if isinstance(refused, Problem):
        status, refused = problem_status(refused), refused.detail
    return page(
        "work.html",
        session,
        status=status,
        items=[],
        next=None,
        counts=None,
        states=WORK_STATES,
        paged=False,
        error=refused,
        **shown,
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
    """Per feed: whether it is stalled, its checkpoint, lag, open holds (quarantine / retry),
    alarms (a conflicting identity with its Accept) and the source contract it was configured
    with. Only an all-tenant admin sees feeds."""
    session = await signed_in(request, settlement)
    listed = await settlement.feed_admin.list(session.principal)
    if isinstance(listed, Problem):
        return problem_page(session, listed)
    stalls = await settlement.feed_admin.stalls(session.principal)
    if isinstance(stalls, Problem):
        return problem_page(session, stalls)
    decided_state = request.query_params.get("state")
    event = request.query_params.get("event", "")[:255]
    notice = None
    if decided_state in DECIDED_STATES and event:
        notice = f"Event {event} is now {decided_state}."
    elif decided_state == ACCEPTED and event:
        notice = (
            f"The feed's account of event {event} is accepted: its page may pass "
            "(the receipts' outcomes stay)."
        )
    # a conflicting identity an operator may accept (not an event twice in one page: only
    # the source serving the page in order resumes that one)
    acceptable = {
        (feed.name, alarm.event_id)
        for feed in listed.items
        for alarm in feed.alarms
        if alarm.kind == "conflicting-identity" and not twice_in_one_page(alarm.detail)
    }
    return page(
        "feeds.html",
        session,
        feeds=listed.items,
        stalls=stalls,
        acceptable=acceptable,
        notice=notice,
    )


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
        typed={},
    )


@get("/principals/{principal_id:uuid}/{action:str}", include_in_schema=False)
async def revoke_page(
    request: Request[Any, Any, Any],
    settlement: Services,
    principal_id: FromPath[uuid.UUID],
    action: FromPath[str],
) -> Template:
    """``revoke``: what a revoke does to this principal, and the form that does it (no
    script needed). The path is the revoke form's own (the POST), asked for with GET."""
    session = await signed_in(request, settlement)
    if action != "revoke":
        return refusal(session, 404, "Not found", "no such page")
    return await revoke_confirmation(settlement, session, principal_id)


async def revoke_confirmation(
    settlement: Services, session: ConsoleSession, principal_id: uuid.UUID
) -> Template:
    """The confirmation page of a revoke (the principal must be one the admin manages)."""
    target = await settlement.admin.managed_principal(session.principal, principal_id)
    if isinstance(target, Problem):
        return problem_page(session, target)
    return page("revoke.html", session, target=target, yourself=target.id == session.principal.id)
