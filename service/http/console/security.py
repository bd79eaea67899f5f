"""The console's safety rules: the session cookie, the form tokens, where a sign-in may send
the operator next, and the headers every console answer carries.

* The session cookie holds a random id (the database keeps only its SHA-256): ``HttpOnly``,
  ``SameSite=Strict``, ``Path=/console``, ``Secure`` when the request came over https, and an
  expiry. A sign-in always makes a new id (no session fixation).
* Every state-changing form carries the session's token, compared in constant time. The
  sign-in form, which has no session yet, carries a token also set in a short-lived cookie
  (double submit), so a page elsewhere cannot sign an operator in under its own key.
* A form's body is at most FORM_LIMIT bytes (413 before it is read), and sign-ins are
  counted per client address (:class:`service.app.console.SignInThrottle`).
* ``next`` after a sign-in is only ever a path under ``/console``: no ``%`` before its query,
  no dot segment, decoded or not.
"""

from __future__ import annotations

import hmac
import posixpath
import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from litestar import Request
from litestar.datastructures import Cookie
from litestar.enums import ScopeType
from litestar.response import Redirect
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service.app.console import ConsoleSession
from service.app.root import Settlement

__all__ = [
    "CONSOLE_PATH",
    "FORM_LIMIT",
    "ConsoleHeaders",
    "SignInRequired",
    "client_address",
    "form_token_ok",
    "safe_next",
    "session_cookie",
    "session_of",
    "sign_in_cookie",
    "signed_in",
    "to_sign_in",
]

CONSOLE_PATH = "/console"
SESSION_COOKIE = "console_session"
SIGN_IN_COOKIE = "console_sign_in"
# How long a sign-in form stays usable: long enough to find and paste a key.
SIGN_IN_FORM_LIFETIME = 1800
# Longest ``next`` path kept across a sign-in.
MAX_NEXT = 1024
# Largest body of a console form, in bytes: the largest form (a supersede's 500-character
# reason, each character percent-encoded UTF-8) fits; a larger body is refused with 413
# before it is read, so a form of 100,000 fields costs nothing to parse.
FORM_LIMIT = 8_192

# Every console answer: no framing (clickjacking), no third-party anything, no Referer
# leaving with an operation id, nothing cached (pages show keys once and live state).
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
)
_REPLACED = {name for name, _ in SECURITY_HEADERS}
# A path the console serves: no scheme, no host, no backslash, no control character, no
# dot segment, no doubled slash, and no percent sign before the query (no console path needs
# one, and a browser decodes ``%2e%2e`` into a dot segment that leaves /console).
_SAFE_PATH = re.compile(r"^/console(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*(?:\?[\x21-\x7e]*)?$")


class ConsoleHeaders:
    """ASGI wrapper: the security headers on every answer under ``/console`` (its 404s and
    refusals too)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "") if scope["type"] in ("http", ScopeType.HTTP) else ""
        if not (path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/")):
            await self._app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in _REPLACED
                ]
                message["headers"] = headers + list(SECURITY_HEADERS)
            await send(message)

        await self._app(scope, receive, stamped)


class SignInRequired(Exception):
    """No live session: the operator is sent to sign in, then back to ``next``."""

    def __init__(self, next_path: str | None) -> None:
        super().__init__("sign in required")
        self.next_path = next_path


def to_sign_in(request: Request[Any, Any, Any], exc: SignInRequired) -> Redirect:
    target = f"{CONSOLE_PATH}/sign-in"
    if exc.next_path and safe_next(exc.next_path) == exc.next_path != CONSOLE_PATH:
        target += "?next=" + quote(exc.next_path, safe="")
    return Redirect(path=target, status_code=303, cookies=[expired(SESSION_COOKIE, request)])


def safe_next(raw: str | None) -> str:
    """Where to go after signing in: ``raw`` when it is a path of the console, else the
    console's home (never another site, never a path outside /console)."""
    if not raw or len(raw) > MAX_NEXT or not _SAFE_PATH.match(raw):
        return CONSOLE_PATH
    parts = urlsplit(raw)
    # decoded once more and normalised, whatever the pattern let through: still a console
    # path with no dot segment (the pattern already refuses ``%``; this is the second lock)
    decoded = unquote(parts.path)
    segments = decoded.split("/")
    if (
        parts.scheme
        or parts.netloc
        or decoded != posixpath.normpath(decoded)
        or not (decoded == CONSOLE_PATH or decoded.startswith(CONSOLE_PATH + "/"))
        or {".", ".."} & set(segments)
        or "" in segments[1:]
    ):
        return CONSOLE_PATH
    return raw


def _secure(request: Request[Any, Any, Any]) -> bool:
    return request.url.scheme == "https"


def session_cookie(request: Request[Any, Any, Any], session_id: str, lifetime: float) -> Cookie:
    return Cookie(
        key=SESSION_COOKIE,
        value=session_id,
        path=CONSOLE_PATH,
        max_age=int(lifetime),
        httponly=True,
        secure=_secure(request),
        samesite="strict",
    )


def sign_in_cookie(request: Request[Any, Any, Any]) -> tuple[str, Cookie]:
    """A fresh sign-in form token and the cookie that carries it too."""
    token = secrets.token_urlsafe(32)
    return token, Cookie(
        key=SIGN_IN_COOKIE,
        value=token,
        path=CONSOLE_PATH,
        max_age=SIGN_IN_FORM_LIFETIME,
        httponly=True,
        secure=_secure(request),
        samesite="strict",
    )


def expired(name: str, request: Request[Any, Any, Any]) -> Cookie:
    """A cookie that removes ``name`` from the browser."""
    return Cookie(
        key=name,
        value="",
        path=CONSOLE_PATH,
        max_age=0,
        httponly=True,
        secure=_secure(request),
        samesite="strict",
    )


def client_address(request: Request[Any, Any, Any]) -> str:
    """The address the connection came from, as the server reports it (the sign-in limit
    counts per address)."""
    client = request.client
    return client.host if client is not None and client.host else "unknown"


def session_of(request: Request[Any, Any, Any]) -> str:
    return request.cookies.get(SESSION_COOKIE, "")


def sign_in_token_of(request: Request[Any, Any, Any]) -> str:
    return request.cookies.get(SIGN_IN_COOKIE, "")


def form_token_ok(expected: str, form: Mapping[str, Any]) -> bool:
    """The form's ``csrf`` field is ``expected``, compared in constant time."""
    sent = form.get("csrf")
    if not expected or not isinstance(sent, str):
        return False
    return hmac.compare_digest(sent.encode("utf-8", "replace"), expected.encode())


async def signed_in(request: Request[Any, Any, Any], settlement: Settlement) -> ConsoleSession:
    """The live session of the request's cookie; SignInRequired (back here after) if none."""
    session = await settlement.console.session(session_of(request))
    if session is None:
        back = request.url.path
        if request.url.query:
            back += "?" + request.url.query
        raise SignInRequired(back if request.method == "GET" else None)
    return session
