"""How a console page is answered: a template with the operator and the session's form
token, or a refusal page; Jinja's filters for times and durations."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from litestar.datastructures import Cookie
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.template.config import TemplateConfig

from service.app.answers import Problem
from service.app.console import ConsoleSession
from service.problem_types import PROBLEM_TYPES

__all__ = ["page", "problem_page", "problem_status", "refusal", "template_config"]

TEMPLATES = Path(__file__).resolve().parent / "templates"


def page(
    name: str,
    session: ConsoleSession | None,
    *,
    status: int = 200,
    cookies: list[Cookie] | None = None,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> Template:
    """``name`` rendered for the operator of ``session`` (None: signed out)."""
    return Template(
        template_name=name,
        context={
            "user": None if session is None else session.principal,
            "csrf": "" if session is None else session.csrf_token,
            **context,
        },
        status_code=status,
        cookies=cookies,
        headers=headers,
        media_type="text/html",
    )


def refusal(session: ConsoleSession | None, status: int, title: str, detail: str) -> Template:
    """A page saying what was refused and why; nothing was done."""
    return page("refused.html", session, status=status, title=title, detail=detail)


def problem_page(session: ConsoleSession | None, problem: Problem) -> Template:
    """A use case's refusal as a page, with the status the API answers it with."""
    known = PROBLEM_TYPES.get(problem.slug)
    title = known.title if known else "Refused"
    return refusal(session, problem_status(problem), title, problem.detail)


def problem_status(problem: Problem) -> int:
    """The status the API answers ``problem`` with (400 for a slug it does not know)."""
    known = PROBLEM_TYPES.get(problem.slug)
    return known.status if known else 400


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _unix(seconds: int | None) -> str:
    """A feed's Unix seconds (its contract's timestamps) as readable UTC."""
    if seconds is None:
        return ""
    try:
        return _when(datetime.fromtimestamp(seconds, UTC))
    except (OverflowError, OSError, ValueError):  # out of any calendar: the number as it is
        return str(seconds)


def _instant(value: datetime) -> str:
    """A timeline's moment, to the millisecond (its entries are often the same second)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def _age(value: datetime | None) -> str:
    if value is None:
        return ""
    return _duration((datetime.now(UTC) - value).total_seconds())


def _configure(engine: JinjaTemplateEngine) -> None:
    engine.engine.filters.update(
        when=_when, instant=_instant, duration=_duration, age=_age, unix=_unix
    )


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(
        directory=TEMPLATES, engine=JinjaTemplateEngine, engine_callback=_configure
    )
