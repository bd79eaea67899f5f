"""Settings: read once from ``SETTLEMENT_*`` variables into one frozen object, passed down.

Nothing reads the environment at import time. ``Settings.from_env()`` validates every value
and raises :class:`ConfigError` naming the variable, so a bad value fails at start.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from service.core import TerminalPolicy

__all__ = ["ConfigError", "FeedSpec", "Settings", "parse_feeds"]

T = TypeVar("T")

PREFIX = "SETTLEMENT_"


class ConfigError(ValueError):
    """A ``SETTLEMENT_*`` variable holds a value the server cannot run with."""


def _setting(default: Any, why: str, *, secret: bool = False) -> Any:
    """A field with the reason it exists; a ``secret`` one (or a URL that may carry a
    password) is left out of the settings' repr, so no log or traceback shows it."""
    return field(default=default, repr=not secret, metadata={"why": why})


@dataclass(frozen=True, slots=True)
class Settings:
    """Every TTL, timeout and limit of the server, each with the reason it exists."""

    database_url: str | None = _setting(
        None, "PostgreSQL URL; unset means the embedded server under data_dir.", secret=True
    )
    redis_url: str | None = _setting(
        None, "Redis URL; unset means the embedded redis-server under data_dir.", secret=True
    )
    data_dir: str = _setting(".data", "where the embedded PostgreSQL and Redis keep their files.")
    bootstrap_admin_key: str | None = _setting(
        None, "guarantees an all-tenant admin principal with this key at start.", secret=True
    )
    lease_ttl: float = _setting(
        10.0, "a crashed worker's operation is retryable at most this long after it died."
    )
    sweep_interval: float = _setting(5.0, "period of the lease sweeper and purge loop.")
    max_wait: float = _setting(10.0, "cap for Prefer: wait, so a client cannot pin a worker.")
    body_limit: int = _setting(1_048_576, "largest request body read into memory, in bytes.")
    provider_url: str | None = _setting(None, "downstream provider base URL for payouts.")
    provider_secret: str | None = _setting(
        None, "HMAC key for provider evidence and, derived from it, for payment calls.", secret=True
    )
    provider_timeout: float = _setting(
        2.0, "per-attempt provider call timeout; past it the outcome is unknown."
    )
    late_response_window: float = _setting(
        60.0, "how long a timed-out provider call may still deliver a late answer."
    )
    sim_token: str | None = _setting(
        None,
        "bearer token of the provider simulator's /_sim controls; needed off loopback.",
        secret=True,
    )
    feeds: str = _setting(
        "", "provider event feeds the observer consumes: name=cursor|timestamp:url,..."
    )
    feed_promises: str = _setting(
        "",
        "what each feed's source promises, name=promise+promise,... (timestamp: "
        "later-timestamp, watermark, short-page-end; cursor: no-backfill, empty-advance); unnamed: "
        "later-timestamp only for a timestamp feed, nothing for a cursor feed.",
    )
    feed_page_size: int = _setting(
        100, "events asked per feed page; a tie group larger than this doubles it, up to 500."
    )
    feed_poll_interval: float = _setting(
        1.0, "wait after a feed page with nothing new; doubled each time, up to the max."
    )
    feed_max_backoff: float = _setting(
        30.0, "longest wait between feed requests while a feed is idle, stuck or failing."
    )
    feed_unknown_grace: float = _setting(
        60.0, "an event about an operation not (yet) here is held this long, then quarantined."
    )
    feed_timeout: float = _setting(5.0, "each feed page request; past it, retry later.")
    feed_audit_window: float = _setting(
        300.0,
        "how far back a feed is read again for events that arrived behind its checkpoint "
        "(timestamp feeds: behind the closed timestamp; no-backfill cursor feeds: from the "
        "checkpoint of this long ago).",
    )
    retention: float = _setting(86_400.0, "how long terminal results are kept for replay.")
    tombstone_retention: float = _setting(
        2_592_000.0, "how long an expired key is remembered (410) before it is new again."
    )
    feed_retention: float = _setting(
        2_592_000.0,
        "how long a final feed receipt no page can serve again, and a feed alarm not raised "
        "again, are kept.",
    )
    db_connect_timeout: float = _setting(
        5.0, "a database that does not accept a connection by then is reported down."
    )
    db_statement_timeout: float = _setting(
        15.0, "no single statement may hold a connection and its locks longer than this."
    )
    db_lock_timeout: float = _setting(
        5.0, "a row lock not granted by then fails the phase instead of queueing forever."
    )
    db_hot_lock_timeout: float = _setting(
        1.0, "hot-path row locks (accounts, its operation row): 503 beats a queue behind them."
    )
    db_pool_size: int = _setting(
        10,
        "hot-path connections (asyncpg) per worker process: requests, local effects and the "
        "status views.",
    )
    max_running_per_principal: int = _setting(
        8, "idempotent requests one principal runs at once per worker; more wait, then 429."
    )
    db_cold_pool_size: int = _setting(
        5,
        "SQLAlchemy connections per worker: admin, tombstone reads, sweeps, observations, retries.",
    )
    redis_timeout: float = _setting(
        2.0, "socket timeout of every Redis call; Redis is liveness, so fail fast."
    )
    redis_lease_connections: int = _setting(
        32,
        "lease commands' own Redis connections per worker; past them a command waits for one "
        "(within SETTLEMENT_REDIS_TIMEOUT) rather than failing.",
    )
    health_timeout: float = _setting(2.0, "each dependency check of GET /health.")
    settle_max_retries: int = _setting(
        16, "CAS retries of one settlement before it gives up (revision kept moving)."
    )
    terminal_policy: TerminalPolicy = _setting(
        TerminalPolicy.CONFLICT, "completed vs failed under one tuple: conflict or completed_wins."
    )
    enable_failpoints: bool = _setting(
        False, "arms SETTLEMENT_FAILPOINTS; off in production so a stray variable does nothing."
    )
    failpoints: str = _setting("", "name=crash|sleep:S|error,... for crash tests.")
    log_format: str = _setting("json", "json or text.")
    metrics_role: str = _setting(
        "none", "who may read /metrics: none (anyone: a scraper on a private network) or a role."
    )
    access_log: bool = _setting(
        False, "one JSON access line per request; off by default, a line per request costs CPU."
    )
    otel_exporter: str = _setting(
        "none", "traces: none (no tracing work at all), console (spans on stdout) or otlp."
    )
    metrics_dir: str | None = _setting(
        None,
        "directory the server's worker processes share for /metrics (settlement serve makes "
        "a fresh one when unset); without it each process counts alone.",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``environ`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = PREFIX + f.name.upper()
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            values[f.name] = _PARSERS.get(f.name, _parse_str)(name, raw)
        values.update(overrides)
        settings = cls(**values)
        settings.validate()
        return settings

    def described(self) -> list[tuple[str, str, str]]:
        """(variable, effective value, why) per setting; a secret's value is masked, and a
        URL shows everything but its password."""
        rows = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                shown = "unset"
            elif not f.repr:  # a secret (see _setting)
                shown = _masked(str(value))
            else:
                shown = str(value.value if isinstance(value, TerminalPolicy) else value)
            rows.append((PREFIX + f.name.upper(), shown, f.metadata["why"]))
        return rows

    def feed_specs(self) -> list[FeedSpec]:
        """The feeds of ``SETTLEMENT_FEEDS`` with what their sources promise
        (``SETTLEMENT_FEED_PROMISES``), checked at start by :meth:`validate`."""
        return parse_feeds(self.feeds, self.feed_promises)

    def validate(self) -> None:
        positive = (
            "lease_ttl",
            "sweep_interval",
            "provider_timeout",
            "db_connect_timeout",
            "db_statement_timeout",
            "db_lock_timeout",
            "db_hot_lock_timeout",
            "redis_timeout",
            "feed_poll_interval",
            "feed_max_backoff",
            "feed_timeout",
            "health_timeout",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be > 0")
        for name in (
            "max_wait",
            "late_response_window",
            "retention",
            "tombstone_retention",
            "feed_retention",
            "feed_unknown_grace",
            "feed_audit_window",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be >= 0")
        at_least_one = (
            "body_limit",
            "db_pool_size",
            "db_cold_pool_size",
            "max_running_per_principal",
            "settle_max_retries",
            "redis_lease_connections",
        )
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ConfigError(f"{PREFIX}{name.upper()} must be >= 1")
        if not 1 <= self.feed_page_size <= 500:
            raise ConfigError(f"{PREFIX}FEED_PAGE_SIZE must be 1-500")
        if self.feed_retention <= self.feed_audit_window:
            # a receipt the audit may still read again must never be purged
            raise ConfigError(f"{PREFIX}FEED_RETENTION must be more than {PREFIX}FEED_AUDIT_WINDOW")
        try:
            parse_feeds(self.feeds)
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}FEEDS: {exc}") from None
        try:
            parse_feeds(self.feeds, self.feed_promises)
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}FEED_PROMISES: {exc}") from None
        if self.terminal_policy not in set(TerminalPolicy):
            raise ConfigError(f"{PREFIX}TERMINAL_POLICY must be one of {', '.join(TerminalPolicy)}")
        if self.log_format not in ("json", "text"):
            raise ConfigError(f"{PREFIX}LOG_FORMAT must be json or text")
        if self.metrics_role not in ("none", "admin", "observer", "client"):
            raise ConfigError(f"{PREFIX}METRICS_ROLE must be none, admin, observer or client")
        if self.otel_exporter not in ("none", "console", "otlp"):
            raise ConfigError(f"{PREFIX}OTEL_EXPORTER must be none, console or otlp")
        for name in ("database_url", "redis_url"):
            value = getattr(self, name)
            if value is not None and "://" not in value:
                raise ConfigError(f"{PREFIX}{name.upper()} must be a URL (scheme://...)")


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


def _masked(value: str) -> str:
    """A URL without its password; any other secret as stars."""
    parts = urlsplit(value)
    if parts.scheme and parts.hostname:
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        if parts.password:
            user = f"{parts.username or ''}:***@"
        else:
            user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=user + host))
    return "***"


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
            raise ValueError(f"feed {name}: {url!r} is not an http(s) URL")
        if any(spec.name == name for spec in specs):
            raise ValueError(f"feed {name} is named twice")
        specs.append(FeedSpec(name=name, kind=kind, url=url))
    return specs


def _parse_str(name: str, raw: str) -> str:
    return raw


def _number(kind: Callable[[str], T], what: str) -> Callable[[str, str], T]:
    def parse(name: str, raw: str) -> T:
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{name} must be {what}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {raw!r}")
        return value

    return parse


_seconds = _number(float, "a number of seconds")
_integer = _number(int, "an integer")


def _flag(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")


def _policy(name: str, raw: str) -> TerminalPolicy:
    try:
        return TerminalPolicy(raw.strip())
    except ValueError:
        raise ConfigError(
            f"{name} must be one of {', '.join(TerminalPolicy)}, got {raw!r}"
        ) from None


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "terminal_policy": _policy,
    "enable_failpoints": _flag,
    "access_log": _flag,
    "lease_ttl": _seconds,
    "sweep_interval": _seconds,
    "max_wait": _seconds,
    "provider_timeout": _seconds,
    "late_response_window": _seconds,
    "retention": _seconds,
    "tombstone_retention": _seconds,
    "feed_retention": _seconds,
    "db_connect_timeout": _seconds,
    "db_statement_timeout": _seconds,
    "db_lock_timeout": _seconds,
    "db_hot_lock_timeout": _seconds,
    "feed_page_size": _integer,
    "feed_poll_interval": _seconds,
    "feed_max_backoff": _seconds,
    "feed_unknown_grace": _seconds,
    "feed_timeout": _seconds,
    "feed_audit_window": _seconds,
    "redis_timeout": _seconds,
    "health_timeout": _seconds,
    "body_limit": _integer,
    "db_pool_size": _integer,
    "db_cold_pool_size": _integer,
    "max_running_per_principal": _integer,
    "settle_max_retries": _integer,
    "redis_lease_connections": _integer,
}
