"""The provider event feeds a server may consume (``SETTLEMENT_FEEDS``) and what each one's
source promises (``SETTLEMENT_FEED_PROMISES``): parsed and checked at start by
:meth:`service.config.Settings.validate`, passed down as :class:`FeedSpec`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.setting import masked

__all__ = [
    "CURSOR_PROMISES",
    "DEFAULT_TIMESTAMP_PROMISES",
    "FEED_KINDS",
    "FEED_NAME",
    "PROMISES",
    "TIMESTAMP_PROMISES",
    "FeedSpec",
    "parse_feeds",
]

# A feed's name: it keys the checkpoint and the receipts, and appears in admin URLs.
FEED_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}(?!\n)$")
FEED_KINDS = ("cursor", "timestamp")
# What a timestamp feed's source may promise; the observer relies on nothing else:
# * later-timestamp: an event at a later timestamp proves every earlier one was served
#   (nothing arrives late behind it);
# * watermark: no event at or below the page's finality_watermark appears later;
# * short-page-end: a page shorter than the limit asked is the whole answer (the source never
#   caps its pages below the limit silently).
TIMESTAMP_PROMISES = frozenset({"later-timestamp", "watermark", "short-page-end"})
# A timestamp feed no promise names: the order of its pages is all it is taken to promise.
DEFAULT_TIMESTAMP_PROMISES = frozenset({"later-timestamp"})
# What a cursor feed's source may promise:
# * no-backfill: no event is ever added behind a cursor already served (without it, the
#   observer re-reads the feed from its start, paced, to find such events);
# * empty-advance: an empty page may carry a new cursor to resume from (without it, such a
#   cursor is not adopted: the request's cursor is asked again).
CURSOR_PROMISES = frozenset({"no-backfill", "empty-advance"})
PROMISES = {"timestamp": TIMESTAMP_PROMISES, "cursor": CURSOR_PROMISES}


@dataclass(frozen=True)
class FeedSpec:
    name: str
    kind: str
    url: str
    promises: frozenset[str] = frozenset()
    """what the source promises (PROMISES of its kind)"""


def parse_feeds(raw: str, promises: str = "") -> list[FeedSpec]:
    """``name=kind:url,...`` as specs, with the promises ``name=a+b,...`` names for them
    (a timestamp feed not named gets DEFAULT_TIMESTAMP_PROMISES, a cursor feed none);
    ValueError naming what is wrong."""
    specs = _parse_feed_list(raw)
    declared = _parse_promises(promises)
    kinds = {spec.name: spec.kind for spec in specs}
    for name, named in declared.items():
        kind = kinds.get(name)
        if kind is None:
            raise ValueError(f"{name} is not a feed of SETTLEMENT_FEEDS")
        unknown = named - PROMISES[kind]
        if unknown:
            raise ValueError(
                f"{name}: unknown promise {sorted(unknown)[0]!r} of a {kind} feed "
                f"(known: {', '.join(sorted(PROMISES[kind]))})"
            )
        if kind == "timestamp" and not named & {"later-timestamp", "watermark"}:
            raise ValueError(
                f"{name}: a timestamp feed needs a finality proof, later-timestamp or watermark"
            )
    return [
        FeedSpec(
            spec.name,
            spec.kind,
            spec.url,
            declared.get(
                spec.name,
                DEFAULT_TIMESTAMP_PROMISES if spec.kind == "timestamp" else frozenset(),
            ),
        )
        for spec in specs
    ]


def _parse_promises(raw: str) -> dict[str, frozenset[str]]:
    found: dict[str, frozenset[str]] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, listed = item.partition("=")
        named = frozenset(filter(None, listed.split("+")))
        if not sep or not named:
            raise ValueError(f"{item!r} is not name=promise+promise")
        if name in found:
            raise ValueError(f"{name} is named twice")
        found[name] = named
    return found


def _parse_feed_list(raw: str) -> list[FeedSpec]:
    specs: list[FeedSpec] = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, rest = item.partition("=")
        kind, sep2, url = rest.partition(":")
        if not sep or not sep2:
            raise ValueError(f"{item!r} is not name=kind:url")
        if not FEED_NAME.match(name):
            raise ValueError(f"feed name {name!r} must match {FEED_NAME.pattern}")
        if kind not in FEED_KINDS:
            raise ValueError(f"feed {name}: kind must be cursor or timestamp, not {kind!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"feed {name}: {masked(url)!r} is not an http(s) URL")
        if any(spec.name == name for spec in specs):
            raise ValueError(f"feed {name} is named twice")
        specs.append(FeedSpec(name=name, kind=kind, url=url))
    return specs
