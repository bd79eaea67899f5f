"""Where a console sign-in sends the operator next (service.http.console.security.safe_next):
whatever ``next`` is, a browser that follows the redirect stays under /console. The browser
is modelled as the URL standard has it: a backslash is a slash, and ``%2e`` is a dot when it
makes up a dot segment."""

from __future__ import annotations

from urllib.parse import urlsplit

from hypothesis import given
from hypothesis import strategies as st

from service.http.console.security import CONSOLE_PATH, safe_next

DOTS = {".": ".", "%2e": "."}
DOUBLE_DOTS = {"..", ".%2e", "%2e.", "%2e%2e"}


def followed(location: str) -> tuple[str, str]:
    """(host, path) a browser at http://h/console/page ends up at after ``location``."""
    raw = location.replace("\\", "/")
    parts = urlsplit(raw)
    if parts.scheme or raw.startswith("//"):
        return parts.netloc or "elsewhere", parts.path
    path = parts.path if parts.path.startswith("/") else "/console/" + parts.path
    resolved: list[str] = []
    for segment in path.split("/")[1:]:
        lowered = segment.lower()
        if lowered in DOUBLE_DOTS:
            if resolved:
                resolved.pop()
        elif lowered not in DOTS:
            resolved.append(segment)
    return "h", "/" + "/".join(resolved)


def stays_in_console(location: str) -> bool:
    host, path = followed(location)
    return host == "h" and (path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/"))


PIECES = ["/", ".", "..", "%2e", "%2E", "%2f", "%5c", "\\", "?", "#", ":", "//", "console",
          "/console", "/console/", "a", "%", "%25", "x.y", "@", "metrics", "\t", "\n"]  # fmt: skip


@given(st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
def test_next_never_leads_out_of_the_console(raw: str) -> None:
    kept = safe_next(raw)
    assert kept in (CONSOLE_PATH, raw)
    assert stays_in_console(kept), (raw, kept)


SEGMENT = st.lists(
    st.sampled_from([".", "%2e", "%2E", "a", "%2f", "%5c", "\\", "%25", "@", ":"]),
    min_size=1,
    max_size=3,
).map("".join)


@given(st.lists(SEGMENT, min_size=1, max_size=4), st.sampled_from(["", "?x=1", "?a=%2e%2e"]))
def test_no_console_path_with_any_segments_leads_out(segments: list[str], query: str) -> None:
    raw = "/console/" + "/".join(segments) + query
    kept = safe_next(raw)
    assert kept in (CONSOLE_PATH, raw)
    assert stays_in_console(kept), (raw, kept)


@given(st.text(max_size=60))
def test_any_text_as_next_stays_in_the_console(raw: str) -> None:
    assert stays_in_console(safe_next(raw))


def test_the_dot_segments_of_the_review_are_refused_and_plain_paths_kept() -> None:
    for raw in (
        "/console/%2e%2e/metrics",
        "/console/%2E%2E/x",
        "/console/.%2e/x",
        "/console/%2e/x",
    ):
        assert safe_next(raw) == CONSOLE_PATH
    for raw in ("/console", "/console/feeds?x=1", "/console?route=POST+%2Fv1%2Ftransfers"):
        assert safe_next(raw) == raw
