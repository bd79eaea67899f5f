"""Admin routes of the feed observers: checkpoints, holds, alarms, and hold decisions. A
refusal raised here (authentication, a body that is not the action's) is a ProblemError,
answered as problem+json by the app's exception handlers."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.params import JSONBody, Parameter, QueryParameter

from service.app.feeds import ConflictAction, HoldAction
from service.domain.principals import Role
from service.http.auth import authenticate_admin
from service.http.bodies import StrictJson
from service.http.deps import Services
from service.http.guards import caller, caller_of
from service.http.query import refuse_undeclared_query
from service.http.render import render_json_or_problem

__all__ = ["accept_conflict", "decide_hold", "get_feed", "list_feeds", "list_holds"]

FeedName = Annotated[str, Parameter(max_length=64)]
EventId = Annotated[str, Parameter(max_length=255)]
# Largest page of a feed's holds.
MAX_HOLDS_PAGE = 500


@get(
    "/admin/v1/feeds",
    operation_id="listFeeds",
    summary="Feed observers: checkpoints, holds, alarms (admin)",
)
async def list_feeds(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    admin = await authenticate_admin(request, settlement.principals)
    return render_json_or_problem(await settlement.feed_admin.list(admin))


@get("/admin/v1/feeds/{name:str}", operation_id="getFeed", summary="One feed observer (admin)")
async def get_feed(
    request: Request[Any, Any, Any], settlement: Services, name: FeedName
) -> Response[bytes]:
    admin = await authenticate_admin(request, settlement.principals)
    return render_json_or_problem(await settlement.feed_admin.show(admin, name))


@get(
    "/admin/v1/feeds/{name:str}/holds",
    operation_id="listFeedHolds",
    summary="Every open hold of a feed, oldest first, a page at a time (admin)",
)
async def list_holds(
    request: Request[Any, Any, Any],
    settlement: Services,
    name: FeedName,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_HOLDS_PAGE)] = 100,
    after: Annotated[str | None, QueryParameter(max_length=512)] = None,
) -> Response[bytes]:
    """``limit`` and ``after`` are checked (400) by their declared types."""
    admin = await authenticate_admin(request, settlement.principals)
    refuse_undeclared_query(request)
    return render_json_or_problem(await settlement.feed_admin.holds(admin, name, limit, after))


@post(
    "/admin/v1/feeds/{name:str}/holds/{event_id:str}",
    status_code=200,
    operation_id="decideFeedHold",
    summary="Decide a held feed event: quarantine or retry (admin)",
    guards=[caller(Role.ADMIN, body=True)],
    dto=StrictJson[HoldAction],
    return_dto=None,
)
async def decide_hold(
    request: Request[Any, Any, Any],
    settlement: Services,
    name: FeedName,
    event_id: EventId,
    data: JSONBody[HoldAction],
) -> Response[bytes]:
    decided = await settlement.feed_admin.decide(caller_of(request), name, event_id, data)
    return render_json_or_problem(decided)


@post(
    "/admin/v1/feeds/{name:str}/conflicts/{event_id:str}",
    status_code=200,
    operation_id="acceptFeedConflict",
    summary="Accept a feed's conflicting identity after review (admin)",
    guards=[caller(Role.ADMIN, body=True)],
    dto=StrictJson[ConflictAction],
    return_dto=None,
)
async def accept_conflict(
    request: Request[Any, Any, Any],
    settlement: Services,
    name: FeedName,
    event_id: EventId,
    data: JSONBody[ConflictAction],
) -> Response[bytes]:
    accepted = await settlement.feed_admin.accept_conflict(caller_of(request), name, event_id, data)
    return render_json_or_problem(accepted)
