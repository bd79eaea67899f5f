"""GET /problems/{slug}: what each problem ``type`` link means, for the person reading it.

One short page per problem type the server can send (:mod:`service.problem_types`):
what happened, whether retrying the same request with the same Idempotency-Key is the right
next step, and what to do. HTML by default; JSON on ``Accept: application/json``.

``retry_with_same_key_safe`` is true when sending the same request again with the same key
cannot run the effect twice and may get a different answer (so retrying is the next step);
false when the same retry gets the same answer until something changes first.
"""

from __future__ import annotations

import html
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.params import FromPath

from service.http.problems import problem_response
from service.problem_types import PROBLEM_TYPES

__all__ = ["PAGES", "ProblemPage", "problem_page"]


class ProblemPage(msgspec.Struct):
    slug: str
    status: int
    title: str
    what_happened: str
    retry_with_same_key_safe: bool
    what_to_do: str


# slug -> its page, for every problem type (service.problem_types)
PAGES: dict[str, ProblemPage] = {
    slug: ProblemPage(
        slug,
        problem.status,
        problem.title,
        problem.what_happened,
        problem.retry_safe,
        problem.what_to_do,
    )
    for slug, problem in sorted(PROBLEM_TYPES.items())
}

_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} ({status})</title></head>
<body>
<h1>{title}</h1>
<p><code>/problems/{slug}</code> &middot; HTTP {status}</p>
<h2>What happened</h2>
<p>{what_happened}</p>
<h2>Retry with the same Idempotency-Key?</h2>
<p>{retry}</p>
<h2>What to do</h2>
<p>{what_to_do}</p>
</body></html>
"""


def _html(page: ProblemPage) -> bytes:
    retry = (
        "Yes: the same request with the same key cannot run the effect twice, and may succeed."
        if page.retry_with_same_key_safe
        else "Not as it is: the same request with the same key gets this answer again."
    )
    fields = {k: html.escape(str(v)) for k, v in msgspec.structs.asdict(page).items()}
    return _HTML.format(**{**fields, "retry": html.escape(retry)}).encode()


# What a problem page is served as, the first one the default (a browser's */*).
_PAGE_TYPES = ["text/html", "application/json"]


@get(
    "/problems/{slug:str}",
    operation_id="getProblemPage",
    summary="What a problem type means (no authentication)",
    media_type="text/html",
)
async def problem_page(request: Request[Any, Any, Any], slug: FromPath[str]) -> Response[bytes]:
    page = PAGES.get(slug)
    if page is None:
        return problem_response("not-found", f"no problem type {slug[:64]!r}")
    # Accept's weights and wildcards, as Litestar reads them
    if request.accept.best_match(_PAGE_TYPES, default="text/html") == "application/json":
        return Response(msgspec.json.encode(page), media_type="application/json")
    return Response(_html(page), media_type="text/html; charset=utf-8")
