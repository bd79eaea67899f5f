"""The console's state-changing forms (POST). Each checks the session and its form token
(constant time) before anything else, then calls the same use case the admin API does; a
refusal is a page naming what was refused, with nothing done."""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

import msgspec
from litestar import Request, post
from litestar.params import FromPath
from litestar.response import Redirect, Template

from service.app.admin import PrincipalExists, PrincipalRequest, ResolveBody, SupersedeBody
from service.app.answers import Problem
from service.app.console import ConsoleSession
from service.app.feeds import ConflictAction, HoldAction
from service.http.console.pages import ACCEPTED, operation_context, revoke_confirmation
from service.http.console.render import page, problem_page, refusal
from service.http.console.security import (
    CONSOLE_PATH,
    SESSION_COOKIE,
    SIGN_IN_COOKIE,
    client_address,
    expired,
    form_token_ok,
    safe_next,
    session_cookie,
    session_of,
    sign_in_cookie,
    sign_in_token_of,
    signed_in,
)
from service.http.deps import Services

__all__ = [
    "accept_conflict",
    "create_principal",
    "decide_hold",
    "principal_action",
    "resolve",
    "sign_in",
    "sign_out",
    "supersede",
]

_STALE = (
    "The form's token is missing or does not belong to this session (a form from another "
    "page, or an old one). Nothing was done: reload the page and submit it again."
)


async def _form(request: Request[Any, Any, Any]) -> dict[str, str]:
    """The form's text fields (a field sent twice: its first value; files: ignored)."""
    fields: dict[str, str] = {}
    for name, value in (await request.form()).multi_items():
        if isinstance(value, str) and name not in fields:
            fields[name] = value
    return fields


async def _checked(
    request: Request[Any, Any, Any], settlement: Services
) -> tuple[ConsoleSession, dict[str, str]] | Template:
    """The session and the form, or the refusal when the form's token is not the session's."""
    session = await signed_in(request, settlement)
    form = await _form(request)
    if not form_token_ok(session.csrf_token, form):
        return refusal(session, 403, "Form refused", _STALE)
    return session, form


@post("/sign-in", include_in_schema=False, status_code=303)
async def sign_in(request: Request[Any, Any, Any], settlement: Services) -> Redirect | Template:
    """An admin API key for a new session (a new id every time: any session the browser
    held is ended), then on to ``next`` (a console path only). The key is never shown.
    An address past its sign-in attempts is refused (429) before its form is read."""
    address = client_address(request)
    wait = settlement.console.admit(address)
    if wait is not None:
        token, cookie = sign_in_cookie(request)
        seconds = math.ceil(wait)
        return page(
            "sign_in.html", None, status=429, cookies=[cookie], form_token=token,
            headers={"Retry-After": str(seconds)}, next=CONSOLE_PATH,
            error=f"Too many sign-in attempts from this address: try again in {seconds} s.",
        )  # fmt: skip
    form = await _form(request)
    next_path = safe_next(form.get("next"))
    if not form_token_ok(sign_in_token_of(request), form):
        token, cookie = sign_in_cookie(request)
        expired_form = "The sign-in form expired or came from another page: sign in again."
        return page(
            "sign_in.html", None, status=403, cookies=[cookie], form_token=token,
            next=next_path, error=expired_form,
        )  # fmt: skip
    await settlement.console.sign_out(session_of(request))
    opened = await settlement.console.sign_in(form.get("api_key", "").strip(), address)
    if isinstance(opened, Problem):
        token, cookie = sign_in_cookie(request)
        return page(
            "sign_in.html", None, status=401, cookies=[cookie], form_token=token,
            next=next_path, error="That is not a live admin API key.",
        )  # fmt: skip
    session_id, _ = opened
    lifetime = settlement.settings.console_session_lifetime
    return Redirect(
        path=next_path,
        status_code=303,
        cookies=[session_cookie(request, session_id, lifetime), expired(SIGN_IN_COOKIE, request)],
    )


@post("/sign-out", include_in_schema=False, status_code=303)
async def sign_out(request: Request[Any, Any, Any], settlement: Services) -> Redirect | Template:
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    await settlement.console.sign_out(session_of(request))
    return Redirect(
        path="/console/sign-in", status_code=303, cookies=[expired(SESSION_COOKIE, request)]
    )


@post("/operations/{operation_id:uuid}/supersede", include_in_schema=False, status_code=200)
async def supersede(
    request: Request[Any, Any, Any], settlement: Services, operation_id: FromPath[uuid.UUID]
) -> Template:
    """Supersede with the API's safety rules; force must be confirmed by typing the id."""
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    session, form = checked
    force = form.get("force") == "on"
    error = None
    if force and form.get("confirm", "").strip().lower() != str(operation_id):
        error = "Force was not confirmed: type the operation id exactly to confirm it."
    try:
        body = msgspec.convert(
            {"reason": form.get("reason", "").strip(), "force": force}, SupersedeBody
        )
    except msgspec.ValidationError:
        error = error or "Give a reason (1 to 500 characters) for the new epoch."
    if error is None:
        done = await settlement.admin.supersede(session.principal, operation_id, body)
        if not isinstance(done, Problem):
            return page(
                "superseded.html",
                session,
                op=done.operation,
                effect_may_run_again=done.effect_may_run_again,
                fenced=done.fenced_live_attempt,
            )
        if done.slug == "not-found":
            return problem_page(session, done)
        error = done.detail
    view = await settlement.status.by_id(session.principal, operation_id)
    if isinstance(view, Problem):
        return problem_page(session, view)
    context = await operation_context(settlement, session, view)
    superseding = {  # the refused form, as typed, but for the confirmation of force: the
        # page now shows the advice as it is now, and forcing must be confirmed against it
        "reason": form.get("reason", ""),
        "force": force,
        "confirm": "",
    }
    return page(
        "operation.html", session, status=409, error=error, superseding=superseding, **context
    )


# the fields of the resolve form, kept and shown again when it is refused
_RESOLVE_FIELDS = ("outcome", "status", "body", "provider_reference", "reason")
# A resolution's status as typed: three ASCII digits (int() takes "²" and " 2_0_1 ").
_STATUS = re.compile(r"[1-5][0-9]{2}")


@post("/operations/{operation_id:uuid}/resolve", include_in_schema=False, status_code=200)
async def resolve(
    request: Request[Any, Any, Any], settlement: Services, operation_id: FromPath[uuid.UUID]
) -> Template:
    """Settle an unknown or conflict operation as the operator says (the API's use case: the
    settlement core decides); a refused form is shown again with what was typed."""
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    session, form = checked
    typed = {name: form.get(name, "").strip() for name in _RESOLVE_FIELDS}
    error = None
    try:
        if not _STATUS.fullmatch(typed["status"]):
            raise ValueError("the status must be an HTTP status code, three digits")
        body = msgspec.convert(
            {
                "outcome": typed["outcome"],
                "provider_reference": typed["provider_reference"],
                "reason": typed["reason"],
                "result": {
                    "status": int(typed["status"]),
                    "body": msgspec.json.decode(typed["body"].encode() or b"null"),
                },
            },
            ResolveBody,
        )
    except (ValueError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        error = f"Not resolved: {exc or 'invalid form'}"
    status, notice = 400, None
    if error is None:
        done = await settlement.admin.resolve(session.principal, operation_id, body)
        if isinstance(done, Problem) and done.slug == "not-found":
            return problem_page(session, done)
        if isinstance(done, Problem):
            status, error = 409, done.detail
        else:
            status, typed = 200, {}
            notice = f"Resolved as {done.operation.state} ({done.disposition})."
    view = await settlement.status.by_id(session.principal, operation_id)
    if isinstance(view, Problem):
        return problem_page(session, view)
    context = await operation_context(settlement, session, view)
    return page(
        "operation.html",
        session,
        status=status,
        resolve_error=error,
        resolve_notice=notice,
        typed=typed,
        **context,
    )


@post("/feeds/{name:str}/holds", include_in_schema=False, status_code=303)
async def decide_hold(
    request: Request[Any, Any, Any], settlement: Services, name: FromPath[str]
) -> Redirect | Template:
    """Quarantine a held event, or decide it again now (``retry``)."""
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    session, form = checked
    event_id = form.get("event_id", "")
    try:
        action = msgspec.convert({"action": form.get("action")}, HoldAction)
    except msgspec.ValidationError:
        action = None
    if action is None or not event_id or len(event_id) > 255:
        return refusal(session, 400, "Invalid form", "a held event id and quarantine or retry")
    decided = await settlement.feed_admin.decide(session.principal, name[:64], event_id, action)
    if isinstance(decided, Problem):
        return problem_page(session, decided)
    return Redirect(
        path="/console/feeds",
        query_params={"event": decided.event_id, "state": decided.state},
        status_code=303,
    )


@post("/feeds/{name:str}/conflicts", include_in_schema=False, status_code=303)
async def accept_conflict(
    request: Request[Any, Any, Any], settlement: Services, name: FromPath[str]
) -> Redirect | Template:
    """After review, accept the feed's account of an event whose identity conflicted with
    the receipts (the admin API's use case: the page that stopped the feed may pass)."""
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    session, form = checked
    event_id = form.get("event_id", "")
    if not event_id or len(event_id) > 255:
        return refusal(
            session, 400, "Invalid form", "the id of the event whose identity conflicted"
        )
    accepted = await settlement.feed_admin.accept_conflict(
        session.principal, name[:64], event_id, ConflictAction(action="accept")
    )
    if isinstance(accepted, Problem):
        return problem_page(session, accepted)
    return Redirect(
        path="/console/feeds",
        query_params={"event": accepted.event_id, "state": ACCEPTED},
        status_code=303,
    )


@post("/principals", include_in_schema=False, status_code=200)
async def create_principal(request: Request[Any, Any, Any], settlement: Services) -> Template:
    """A new principal; its API key is shown on this answer only."""
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    session, form = checked
    fields = {name: form.get(name, "").strip() for name in ("tenant", "name", "role")}
    try:
        body = msgspec.convert(fields, PrincipalRequest)
    except msgspec.ValidationError as exc:
        return await _principals(
            settlement, session, error=f"Not created: {exc}", status=400, typed=fields
        )
    try:
        created = await settlement.admin.create_principal(session.principal, body)
    except PrincipalExists as exc:
        return await _principals(settlement, session, error=str(exc), status=409, typed=fields)
    if isinstance(created, Problem) and created.slug in ("principal-limit", "forbidden"):
        status = 403 if created.slug == "forbidden" else 409
        return await _principals(
            settlement, session, error=f"Not created: {created.detail}", status=status,
            typed=fields,
        )  # fmt: skip
    if isinstance(created, Problem):
        return problem_page(session, created)
    return page("key_shown.html", session, created=created, verb="created")


@post("/principals/{principal_id:uuid}/{action:str}", include_in_schema=False, status_code=200)
async def principal_action(
    request: Request[Any, Any, Any],
    settlement: Services,
    principal_id: FromPath[uuid.UUID],
    action: FromPath[str],
) -> Template | Redirect:
    """``rotate`` (the new key shown once; the old one stops at once) or ``revoke``, once
    confirmed (``confirm=revoke``, the confirmation page's form; without it, that page).
    Revoking the key this session signed in with ends the session: back to sign-in."""
    checked = await _checked(request, settlement)
    if isinstance(checked, Template):
        return checked
    session, form = checked
    if action == "rotate":
        rotated = await settlement.admin.rotate_principal(session.principal, principal_id)
        if isinstance(rotated, Problem):
            return problem_page(session, rotated)
        return page("key_shown.html", session, created=rotated, verb="rotated")
    if action == "revoke":
        if form.get("confirm") != "revoke":
            return await revoke_confirmation(settlement, session, principal_id)
        revoked = await settlement.admin.revoke_principal(session.principal, principal_id)
        if isinstance(revoked, Problem):
            return problem_page(session, revoked)
        if principal_id == session.principal.id:  # its sessions ended with its key
            return Redirect(
                path="/console/sign-in",
                status_code=303,
                cookies=[expired(SESSION_COOKIE, request)],
            )
        notice = f"Revoked {revoked.name} ({revoked.tenant}): its key stopped working."
        return await _principals(settlement, session, notice=notice)
    return refusal(session, 404, "Not found", "no such action: rotate or revoke")


async def _principals(
    settlement: Services,
    session: ConsoleSession,
    *,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
    typed: dict[str, str] | None = None,
) -> Template:
    """The principals page after a form: ``typed``, what a refused create form held."""
    listed = await settlement.console.principals(session.principal)
    if isinstance(listed, Problem):  # the first page of its own reach: never refused
        return problem_page(session, listed)
    return page(
        "principals.html",
        session,
        status=status,
        principals=listed.items,
        next=listed.next,
        tenant="",
        paged=False,
        notice=notice,
        error=error,
        typed=typed or {},
    )
