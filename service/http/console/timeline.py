"""An operation's history as one timeline for the console: what the status resource knows
(attempts with their fencing tokens, observations, epochs, the lease, the final answer) and
the feed receipts that touched it, in the order it happened. Pure: views in, entries out.

Observations come a page at a time, as the status resource lists them (the newest, or those
before ``?observations_before=``, and always the one that settled the operation)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from service.app.console import ReceiptRow
from service.app.status import MAX_OBSERVATION_ID, OperationView

__all__ = ["Entry", "observations_before", "request_facts", "timeline"]

# ?observations_before= as sent: an observation id in ASCII digits (int() of 5,000 digits
# raises, and str.isdigit takes "²")
_ID = re.compile(r"[1-9][0-9]{0,18}")


def observations_before(raw: str | None) -> int | None:
    """The page of observations the console's operation page asks for: None for the newest;
    ValueError when ``raw`` is not an observation id."""
    if raw is None or raw == "":
        return None
    if not _ID.fullmatch(raw) or int(raw) > MAX_OBSERVATION_ID:
        raise ValueError("observations_before must be an observation id")
    return int(raw)


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: str
    """attempt, observation, epoch, receipt or operation: the entry's marker"""
    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    tone: str = "neutral"
    """neutral, good, bad or warn: how the marker is drawn"""


_TONES = {
    "completed": "good",
    "applied": "good",
    "strengthened": "good",
    "failed": "bad",
    "conflict": "bad",
    "quarantined": "warn",
    "unknown": "warn",
    "held": "warn",
}


def _tone(*words: str | None) -> str:
    for word in words:
        if word in _TONES:
            return _TONES[word]
    return "neutral"


def timeline(view: OperationView, receipts: list[ReceiptRow] | None) -> list[Entry]:
    """Every entry, oldest first (ties keep the order listed here)."""
    entries = [
        Entry(
            view.created_at,
            "operation",
            "Operation created",
            [("route", view.route), ("key", view.key), ("tenant", view.tenant)],
        )
    ]
    for attempt in view.attempts:
        entries.append(
            Entry(
                attempt.started_at,
                "attempt",
                f"Attempt started (fencing token {attempt.fencing_token})",
                [
                    ("attempt", str(attempt.id)),
                    ("epoch", str(attempt.binding_generation)),
                    ("fencing token", str(attempt.fencing_token)),
                ],
            )
        )
        if attempt.finished_at is not None:
            facts = [("outcome", attempt.outcome or "none")]
            if attempt.response_status is not None:
                facts.append(("answered", str(attempt.response_status)))
            if attempt.error:
                facts.append(("error", attempt.error))
            entries.append(
                Entry(
                    attempt.finished_at,
                    "attempt",
                    f"Attempt ended: {attempt.outcome or 'no outcome'} "
                    f"(fencing token {attempt.fencing_token})",
                    facts,
                    _tone(attempt.outcome),
                )
            )
    for seen in view.observations:
        facts = [
            ("source", seen.source),
            ("stage", seen.stage),
            ("disposition", seen.disposition),
            ("verified", "yes" if seen.verified else "no"),
        ]
        if seen.reason:
            facts.append(("reason", seen.reason))
        if seen.revision_before is not None or seen.revision_after is not None:
            facts.append(("revision", f"{seen.revision_before} -> {seen.revision_after}"))
        title = f"Observation from {seen.source}: {seen.kind}, {seen.disposition}"
        if seen.admin_name is not None:
            facts.append(("admin", _named(seen.admin_name, (seen.detail or {}).get("admin_id"))))
        if (seen.detail or {}).get("error"):
            facts.append(("why", str((seen.detail or {})["error"])))
        resolution = (seen.detail or {}).get("resolution")
        if resolution is not None:
            facts.extend(_resolution_facts(seen.detail or {}))
            title = f"Operator resolution: {resolution}, {seen.disposition}"
        entries.append(
            Entry(
                seen.created_at,
                "observation",
                title,
                facts,
                # an applied observation is as good or bad as what it reported
                _tone(seen.kind if seen.disposition == "applied" else seen.disposition),
            )
        )
    for epoch in view.epochs:
        facts = [
            ("closed epoch", str(epoch.binding_generation)),
            ("its final state", epoch.final_state),
            ("reason", epoch.reason),
        ]
        if epoch.result_digest:
            facts.append(("result digest", epoch.result_digest))
        if epoch.superseded_by is not None:
            facts.append(("by admin", _named(epoch.superseded_by_name, epoch.superseded_by)))
        entries.append(
            Entry(
                epoch.superseded_at,
                "epoch",
                f"Epoch {epoch.binding_generation} superseded: "
                f"epoch {epoch.binding_generation + 1} began",
                facts,
                "warn",
            )
        )
    for receipt in receipts or []:
        entries.append(
            Entry(
                receipt.first_seen_at,
                "receipt",
                f"Feed {receipt.feed}: event {receipt.event_id} {receipt.state}",
                [
                    ("feed", receipt.feed),
                    ("event", receipt.event_id),
                    ("place in feed", str(receipt.event_order)),
                    ("reason", receipt.reason),
                    ("decided at", readable_utc(receipt.decided_at)),
                ],
                _tone(receipt.state),
            )
        )
    entries.sort(key=lambda entry: entry.at)
    return entries


def _resolution_facts(detail: dict[str, Any]) -> list[tuple[str, str]]:
    """Why the operator resolved it, and on what evidence (the observation's detail); who:
    the observation's admin."""
    return [
        ("why", str(detail.get("reason"))),
        ("provider reference", str(detail.get("provider_reference"))),
        ("state before", str(detail.get("state_before"))),
    ]


def pretty_body(body: object) -> str:
    """A stored answer's body as a person reads it."""
    if isinstance(body, str):
        return body
    return msgspec.json.format(msgspec.json.encode(body), indent=2).decode()


def readable_utc(value: datetime) -> str:
    """A moment as an operator reads it: ``2026-12-05 06:31:07 UTC``."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _named(name: str | None, ident: object) -> str:
    """A principal by name, its id beside it (the id alone when it has no name)."""
    return str(ident) if name is None else f"{name} ({ident})"


# the request fields that are amounts, in minor units of the request's currency
_AMOUNTS = ("amount", "opening_balance")


def request_facts(view: OperationView) -> list[tuple[str, str]] | None:
    """What was asked, field by field (amounts in minor units of the currency, as the API
    takes them); None: the request was not recorded (claimed before migration 0017)."""
    if view.request is None:
        return None
    currency = view.request.get("currency")
    facts: list[tuple[str, str]] = []
    for name, value in {**(view.request_path or {}), **view.request}.items():
        if value is None:
            continue
        shown = str(value)
        if name in _AMOUNTS and isinstance(value, int) and currency:
            shown = f"{value} {currency} minor units"
        facts.append((name.replace("_", " "), shown))
    return facts
