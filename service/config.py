"""Settings: read once from ``SETTLEMENT_*`` variables into one frozen object, passed down.

Each setting is declared once below, as a field made by :func:`service.setting.setting` (its
default, the rule its value keeps, why it exists); reading, checking, ``settlement config``
and the settings table of docs/operations.md all come from that declaration. Rules that
join settings are :meth:`Settings.validate`'s. Nothing reads the environment at import time.
``Settings.from_env()`` checks every value and raises :class:`ConfigError` naming the
variable, so a bad value fails at start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.core import TerminalPolicy
from service.feed_specs import (
    CURSOR_PROMISES,
    DEFAULT_TIMESTAMP_PROMISES,
    FEED_KINDS,
    FEED_NAME,
    PROMISES,
    TIMESTAMP_PROMISES,
    FeedSpec,
    parse_feeds,
)
from service.setting import (
    PREFIX,
    ConfigError,
    Setting,
    above,
    at_least,
    between,
    declared,
    is_url,
    one_of,
    setting,
    strong_key,
)

# the feed specs are service.feed_specs', here too for the settings' users
__all__ = [
    "CURSOR_PROMISES",
    "DEFAULT_TIMESTAMP_PROMISES",
    "FEED_KINDS",
    "FEED_NAME",
    "PROMISES",
    "SETTINGS",
    "TIMESTAMP_PROMISES",
    "ConfigError",
    "FeedSpec",
    "Settings",
    "parse_feeds",
]

POSITIVE = above(0)
NOT_NEGATIVE = at_least(0)
AT_LEAST_ONE = at_least(1)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every TTL, timeout and limit of the server, each with the reason it exists.

    A field's type says how its variable is read (``float``: seconds, decimals allowed);
    an empty variable is the same as an unset one."""

    database_url: str | None = setting(
        None,
        "PostgreSQL URL (postgresql://..., used with the asyncpg driver); unset: --embedded "
        "starts one under the data dir.",
        rule=is_url,
        secret=True,
        urls=True,
    )
    redis_url: str | None = setting(
        None,
        "Redis URL (redis+cluster://host:port,host:port,... for a Redis Cluster); unset: "
        "--embedded starts one under the data dir.",
        rule=is_url,
        secret=True,
        urls=True,
    )
    data_dir: str = setting(".data", "where the embedded PostgreSQL and Redis keep their files.")
    bootstrap_admin_key: str | None = setting(
        None,
        "guarantees an all-tenant admin principal with this key at start (make run: one "
        "generated into .data/admin.key).",
        rule=strong_key,
        secret=True,
    )
    lease_ttl: float = setting(
        10.0,
        "a crashed worker's operation is retryable at most this long after it died.",
        rule=POSITIVE,
    )
    sweep_interval: float = setting(
        5.0, "period of the lease sweeper and purge loop.", rule=POSITIVE
    )
    max_wait: float = setting(
        10.0, "cap for Prefer: wait, so a client cannot pin a worker.", rule=NOT_NEGATIVE
    )
    host: str = setting(
        "127.0.0.1",
        "address `settlement serve` listens on (--host overrides); 0.0.0.0 for every interface.",
    )
    port: int = setting(
        8000, "TCP port `settlement serve` listens on (--port overrides).", rule=between(1, 65535)
    )
    workers: int = setting(
        1,
        "worker processes of `settlement serve` (--workers overrides); each holds its own "
        "database pool (SETTLEMENT_DB_POOL_SIZE connections).",
        rule=AT_LEAST_ONE,
    )
    body_limit: int = setting(
        1_048_576,
        "largest request body read into memory, in bytes; a larger one gets 413.",
        rule=AT_LEAST_ONE,
    )
    header_limit: int = setting(
        65_536,
        "largest request header block, in bytes (a key, a cookie and tracing headers take a few "
        "KiB); a larger one gets 431 at a cost bounded by it.",
        rule=at_least(8192),
    )
    header_timeout: float = setting(
        10.0,
        "deadline for a request's whole header block, from connection open (or from the last "
        "answer on a kept-alive connection); past it the connection is closed.",
        rule=between(1, 60),
    )
    body_timeout: float = setting(
        20.0,
        "deadline for a request's whole body, from its headers; past it 408 and the connection "
        "closes (a body at the limit needs 52 KB/s).",
        rule=POSITIVE,
    )
    forwarded_allow_ips: str = setting(
        "127.0.0.1",
        "comma-separated peers whose X-Forwarded-Proto and X-Forwarded-For are believed (a "
        "TLS-terminating proxy on this host); * believes anyone.",
    )
    connection_limit: int = setting(
        1000,
        "open connections per worker process; more wait in the kernel's queue and hold no "
        "descriptor of ours (lowered to the process's descriptor limit less a reserve).",
        rule=AT_LEAST_ONE,
    )
    provider_url: str | None = setting(
        None, "downstream provider base URL for payouts.", secret=True, urls=True
    )
    provider_secret: str | None = setting(
        None, "HMAC key for provider evidence and, derived from it, for payment calls.", secret=True
    )
    provider_timeout: float = setting(
        2.0, "per-attempt provider call timeout; past it the outcome is unknown.", rule=POSITIVE
    )
    late_response_window: float = setting(
        60.0,
        "how long a timed-out provider call may still deliver a late answer.",
        rule=NOT_NEGATIVE,
    )
    sim_token: str | None = setting(
        None,
        "bearer token of the provider simulator's /_sim controls; unset, they are open and the "
        "simulator binds only a loopback address.",
        secret=True,
    )
    feeds: str = setting(
        "",
        "provider event feeds, name=cursor|timestamp:URL,...: the ones settlement observer run "
        "--feed NAME may consume (make run: the simulator's two).",
        secret=True,
        urls=True,
    )
    feed_promises: str = setting(
        "",
        "what each feed's source promises, name=promise+promise,... (timestamp: "
        "later-timestamp, watermark, short-page-end; cursor: no-backfill, empty-advance); unnamed: "
        "later-timestamp only for a timestamp feed, nothing for a cursor feed (make run: "
        "payments-ts=later-timestamp+watermark+short-page-end).",
    )
    feed_page_size: int = setting(
        100,
        "events asked per feed page; a tie group larger than this doubles it, up to 500.",
        rule=between(1, 500),
    )
    feed_poll_interval: float = setting(
        1.0,
        "wait after a feed page with nothing new; doubled each time, up to the max.",
        rule=POSITIVE,
    )
    feed_max_backoff: float = setting(
        30.0,
        "longest wait between feed requests while a feed is idle, stuck or failing.",
        rule=POSITIVE,
    )
    feed_unknown_grace: float = setting(
        60.0,
        "an event about an operation not (yet) here is held this long, then quarantined.",
        rule=NOT_NEGATIVE,
    )
    feed_timeout: float = setting(
        5.0,
        "each feed page request, from its start to its last byte; past it, retry later.",
        rule=POSITIVE,
    )
    feed_audit_window: float = setting(
        300.0,
        "how far back a feed is read again for events that arrived behind its checkpoint "
        "(timestamp feeds: behind the closed timestamp; no-backfill cursor feeds: from the "
        "checkpoint of this long ago).",
        rule=NOT_NEGATIVE,
    )
    retention: float = setting(
        86_400.0, "how long terminal results are kept for replay.", rule=NOT_NEGATIVE
    )
    tombstone_retention: float = setting(
        2_592_000.0,
        "how long an expired key is remembered (410) before it is new again.",
        rule=NOT_NEGATIVE,
    )
    feed_retention: float = setting(
        2_592_000.0,
        "how long a final feed receipt no page can serve again, and a feed alarm not raised "
        "again, are kept; more than the audit window.",
        rule=NOT_NEGATIVE,
    )
    orphan_retention: float = setting(
        2_592_000.0,
        "how long an observation about an operation that was never here (an observer's "
        "evidence, a feed event past its grace) is kept, for whoever looks into it.",
        rule=NOT_NEGATIVE,
    )
    evidence_quarantine_limit: int = setting(
        100,
        "evidence of one observer that may be quarantined (refused, or stopped at the tuple "
        "gate) within SETTLEMENT_EVIDENCE_QUARANTINE_WINDOW; past it, its evidence gets 429.",
        rule=AT_LEAST_ONE,
    )
    evidence_quarantine_window: float = setting(
        3600.0,
        "how far back an observer's quarantined evidence counts against its limit.",
        rule=POSITIVE,
    )
    db_connect_timeout: float = setting(
        5.0,
        "a database that does not accept a connection by then is reported down; also the "
        "longest wait for a principal's slot (after it the lease is renewed, or taken anew if "
        "it ran out; 409 if a duplicate holds it by then).",
        rule=POSITIVE,
    )
    db_start_wait: float = setting(
        30.0,
        "a server or observer started while PostgreSQL cannot be reached (a restart, a "
        "failover) retries for this long before it exits with the error; 0: exits at once.",
        rule=NOT_NEGATIVE,
    )
    db_plan_cache_mode: str = setting(
        "force_generic_plan",
        "PostgreSQL's plan_cache_mode on every connection: one generic plan per statement saves "
        "planning on the hot path; on Citus use auto (docs/scaling.md).",
        rule=one_of("force_generic_plan", "auto", "force_custom_plan"),
    )
    db_claim_settle: str = setting(
        "statement",
        "how a new operation's one statement is sent: as is, or as a call of a function per "
        "effect taking the tenant first, which Citus sends whole to the tenant's node "
        "(docs/scaling.md); function creates them at start.",
        rule=one_of("statement", "function"),
    )
    db_statement_timeout: float = setting(
        15.0,
        "no single statement may hold a connection and its locks longer than this.",
        rule=POSITIVE,
    )
    db_lock_timeout: float = setting(
        1.0,
        "every row lock (accounts, an operation row while an effect runs, a sweep's, an "
        "admin's): a row held longer answers 503 or 409 (retry) rather than a queue behind it.",
        rule=POSITIVE,
    )
    db_pool_size: int = setting(
        10,
        "database connections per worker process, one pool for every use: requests, local "
        "effects, status views and the cold paths (admin, sweeps, observations, retries).",
        rule=AT_LEAST_ONE,
    )
    key_tenants: int = setting(
        10_000,
        "API keys whose tenant one worker remembers (least recently used forgotten first; 0: "
        "none), so a request's first statement is given its tenant (one shard on Citus); a key "
        "not remembered costs one indexed read more. A tenant never changes, and whether the "
        "key is still live is read anew by every request.",
        rule=NOT_NEGATIVE,
    )
    max_running_per_principal: int = setting(
        8,
        "idempotent requests one principal runs at once per worker, so one client cannot take "
        "the whole pool; more wait for a slot, then get 429.",
        rule=AT_LEAST_ONE,
    )
    redis_timeout: float = setting(
        2.0,
        "bound of every Redis call (a lease command's as a whole, its wait for a connection "
        "included); Redis is liveness, so fail fast.",
        rule=POSITIVE,
    )
    redis_lease_connections: int = setting(
        32,
        "lease commands' own Redis connections per worker; past them a command waits for one "
        "(within SETTLEMENT_REDIS_TIMEOUT) rather than failing.",
        rule=AT_LEAST_ONE,
    )
    health_timeout: float = setting(
        2.0, "each dependency check of GET /health and GET /readyz.", rule=POSITIVE
    )
    settle_max_retries: int = setting(
        16,
        "CAS retries of one settlement before it gives up (revision kept moving).",
        rule=AT_LEAST_ONE,
    )
    terminal_policy: TerminalPolicy = setting(
        TerminalPolicy.CONFLICT,
        "how completed vs failed under one tuple resolves: a conflict, or completed wins.",
        rule=one_of(*TerminalPolicy),
    )
    enable_failpoints: bool = setting(
        False, "arms SETTLEMENT_FAILPOINTS; off in production so a stray variable does nothing."
    )
    failpoints: str = setting("", "name=crash|sleep:S|error,... for crash tests.")
    log_format: str = setting(
        "json",
        "log lines on stderr: one JSON object each, or one plain line.",
        rule=one_of("json", "text"),
    )
    metrics_role: str = setting(
        "admin",
        "who may read /metrics (business volume): keys of this role and admins; none: anyone.",
        rule=one_of("none", "admin", "observer", "client"),
    )
    feed_figures_interval: float = setting(
        15.0, "how often one worker reads the feeds' /metrics figures for scrapes.", rule=POSITIVE
    )
    feed_stall_after: float = setting(
        900.0,
        "a feed with no progress past a hold or an unknown for longer is flagged as stalled.",
        rule=POSITIVE,
    )
    access_log: bool = setting(
        False, "one JSON access line per request; off by default, a line per request costs CPU."
    )
    otel_exporter: str = setting(
        "none",
        "traces: none (no tracing work at all), console (spans on stdout) or otlp.",
        rule=one_of("none", "console", "otlp"),
    )
    console_session_lifetime: float = setting(
        28_800.0,
        "an operator's console session ends this long after sign-in (one on-call shift), "
        "whatever it did meanwhile.",
        rule=POSITIVE,
    )
    console_sign_in_attempts: int = setting(
        10, "console sign-ins per client address, window and worker; then 429.", rule=AT_LEAST_ONE
    )
    console_sign_in_window: float = setting(
        60.0, "the window SETTLEMENT_CONSOLE_SIGN_IN_ATTEMPTS counts sign-ins in.", rule=POSITIVE
    )
    max_principals_per_tenant: int = setting(
        1_000, "live principals one tenant may hold; one more is refused (409).", rule=AT_LEAST_ONE
    )
    api_reference: bool = setting(
        False, "serves Scalar's API reference (a pinned script, SRI) at /schema; off: links only."
    )
    metrics_dir: str | None = setting(
        None,
        "directory the server's worker processes share for /metrics (settlement serve makes "
        "a fresh one when unset); without it each process counts alone.",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``environ`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if environ is None else environ
        values = {
            one.name: one.parse(env[one.variable]) for one in SETTINGS if env.get(one.variable)
        }
        values.update(overrides)
        settings = cls(**values)
        settings.validate()
        return settings

    def described(self) -> list[tuple[str, str, str]]:
        """(variable, effective value, why) per setting; a secret's value is masked, and a
        URL shows everything but its password."""
        return [(one.variable, one.shown(getattr(self, one.name)), one.why) for one in SETTINGS]

    def feed_specs(self) -> list[FeedSpec]:
        """The feeds of ``SETTLEMENT_FEEDS`` with what their sources promise
        (``SETTLEMENT_FEED_PROMISES``), checked at start by :meth:`validate`."""
        return parse_feeds(self.feeds, self.feed_promises)

    def validate(self) -> None:
        """Each setting's own rule, then the rules that join settings."""
        for one in SETTINGS:
            one.check(getattr(self, one.name))
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


SETTINGS: tuple[Setting, ...] = declared(Settings)
"""Every setting, in the order declared: what the environment, ``settlement config`` and the
settings table of docs/operations.md go by."""
