"""The reliability run's feed rules: every provider payment against both observers' receipts
and checkpoints, each rule a pure function of rows (``tests/reliability/test_checker.py``
drives them; :mod:`tests.reliability.feeds` reads the rows and applies them):

* **receipts**: every payment the provider committed (event ``evt_<reference>``) has exactly
  one receipt on each feed, and it is final (applied, ignored, quarantined); no feed has a
  receipt for an event the provider never served;
* **holds**: no receipt stays ``held`` longer than the hold limit (the unknown grace, one
  poll interval, and slack for an observer's downtime after a kill);
* **passed**: no checkpoint passes an event without a final receipt: on the cursor feed every
  event at or below ``applied_position``, on the timestamp feed every event at or before
  ``closed_through_timestamp``. An event inserted late (behind one inserted before it in that
  feed's order: a backfill) may have been passed before it existed, so during the run it is
  exempt; at the end it too must have its final receipt;
* **caught up**: at the end each checkpoint reaches what the feed's promises let it prove:
  the cursor feed's last position; on the timestamp feed (``later-timestamp`` only), the
  second before its last timestamp.

During the run (:func:`sample_violations`) only the holds and passed rules apply, late
events exempt; at the end (:func:`final_violations`) all four, late events included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "FINAL",
    "Checkpoint",
    "Event",
    "Receipt",
    "Snapshot",
    "Violation",
    "capped",
    "caught_up",
    "final_violations",
    "hold_violations",
    "late",
    "passed_violations",
    "receipt_violations",
    "render",
    "sample_violations",
]

FINAL = frozenset({"applied", "ignored", "quarantined"})
# Violations shown per rule and feed; the rest are counted.
SHOWN = 10


@dataclass(frozen=True)
class Event:
    """A payment the provider committed, as its feeds serve it."""

    event_id: str
    position: int
    timestamp: int
    inserted: int  # the simulator's rowid: the order the rows were committed in
    backfill: bool = False

    def place(self, kind: str) -> int:
        return self.position if kind == "cursor" else self.timestamp


@dataclass(frozen=True)
class Receipt:
    feed: str
    event_id: str
    state: str
    reason: str = ""
    age: float = 0.0  # seconds since first seen, on the database's clock


@dataclass(frozen=True)
class Checkpoint:
    feed: str
    kind: str
    applied_position: int | None = None
    closed_through: int | None = None

    def passed(self, event: Event) -> bool:
        if self.kind == "cursor":
            return self.applied_position is not None and event.position <= self.applied_position
        return self.closed_through is not None and event.timestamp <= self.closed_through


@dataclass(frozen=True)
class Violation:
    rule: str  # receipts | holds | passed | caught-up
    feed: str
    event_id: str
    detail: str

    def __str__(self) -> str:
        about = f" {self.event_id}" if self.event_id else ""
        return f"feed {self.feed}{about}: {self.detail}"


@dataclass
class Snapshot:
    """What one reading saw: the provider's payments first, then each checkpoint, then the
    receipts (read after the checkpoints, so a receipt the checkpoint relied on is there)."""

    events: list[Event]
    checkpoints: dict[str, Checkpoint]
    receipts: list[Receipt]
    alarms: Counter[tuple[str, str]] = field(default_factory=Counter)  # (feed, kind): events


def late(events: Iterable[Event], kind: str) -> frozenset[str]:
    """The events inserted behind one inserted before them in the ``kind`` feed's order (a
    lower position, an earlier timestamp): backfills, which a checkpoint may have passed
    before they existed. Equal timestamps are a tie, not late."""
    found: set[str] = set()
    highest: int | None = None
    for event in sorted(events, key=lambda e: e.inserted):
        place = event.place(kind)
        if highest is not None and place < highest:
            found.add(event.event_id)
        highest = place if highest is None else max(highest, place)
    return frozenset(found)


def receipt_violations(
    feed: str, events: Sequence[Event], receipts: Sequence[Receipt]
) -> list[Violation]:
    """Every event has exactly one receipt on ``feed``, a final one; no receipt on ``feed``
    is for an event the provider never served."""
    on_feed = [r for r in receipts if r.feed == feed]
    by_event: dict[str, list[Receipt]] = {}
    for receipt in on_feed:
        by_event.setdefault(receipt.event_id, []).append(receipt)
    found: list[Violation] = []
    for event in events:
        mine = by_event.get(event.event_id, [])
        where = _where(event)
        if not mine:
            found.append(Violation("receipts", feed, event.event_id, f"no receipt ({where})"))
        elif len(mine) > 1:
            states = sorted(r.state for r in mine)
            found.append(
                Violation("receipts", feed, event.event_id, f"{len(mine)} receipts {states}")
            )
        elif mine[0].state not in FINAL:
            found.append(
                Violation(
                    "receipts",
                    feed,
                    event.event_id,
                    f"receipt not final: {mine[0].state} {mine[0].reason} ({where})",
                )
            )
    served = {e.event_id for e in events}
    for event_id in sorted(set(by_event) - served):
        never = "a receipt for an event the provider never served"
        found.append(Violation("receipts", feed, event_id, never))
    return found


def hold_violations(receipts: Iterable[Receipt], limit: float) -> list[Violation]:
    """Every receipt held for longer than ``limit`` seconds."""
    return [
        Violation(
            "holds",
            r.feed,
            r.event_id,
            f"held ({r.reason}) for {r.age:.1f} s, more than {limit:.1f} s",
        )
        for r in receipts
        if r.state == "held" and r.age > limit
    ]


def passed_violations(
    checkpoint: Checkpoint,
    events: Iterable[Event],
    receipts: Iterable[Receipt],
    exempt: frozenset[str] = frozenset(),
) -> list[Violation]:
    """Every event the checkpoint has passed (but those ``exempt``) without a final receipt
    on its feed."""
    final = {r.event_id for r in receipts if r.feed == checkpoint.feed and r.state in FINAL}
    mark = (
        f"applied_position {checkpoint.applied_position}"
        if checkpoint.kind == "cursor"
        else f"closed_through_timestamp {checkpoint.closed_through}"
    )
    return [
        Violation(
            "passed",
            checkpoint.feed,
            e.event_id,
            f"the checkpoint ({mark}) passed it ({_where(e)}) without a final receipt",
        )
        for e in events
        if checkpoint.passed(e) and e.event_id not in final and e.event_id not in exempt
    ]


def caught_up(checkpoint: Checkpoint | None, events: Sequence[Event]) -> bool:
    """The checkpoint is as far as the feed lets it be proven: the last position (cursor);
    the second before the last timestamp, which only a later event could close (timestamp
    feeds that promise ``later-timestamp`` only)."""
    if not events:
        return True
    if checkpoint is None:
        return False
    if checkpoint.kind == "cursor":
        last = max(e.position for e in events)
        return checkpoint.applied_position is not None and checkpoint.applied_position >= last
    newest = max(e.timestamp for e in events)
    return checkpoint.closed_through is not None and checkpoint.closed_through >= newest - 1


def sample_violations(snap: Snapshot, feeds: dict[str, str], hold_limit: float) -> list[Violation]:
    """What a reading during the run may already show: a hold past its limit, a checkpoint
    past an event (not a late one) that has no final receipt."""
    found = hold_violations(snap.receipts, hold_limit)
    for feed, kind in feeds.items():
        checkpoint = snap.checkpoints.get(feed)
        if checkpoint is not None:
            exempt = late(snap.events, kind)
            found += passed_violations(checkpoint, snap.events, snap.receipts, exempt)
    return found


def final_violations(snap: Snapshot, feeds: dict[str, str], hold_limit: float) -> list[Violation]:
    """Every rule at the end, late events included."""
    found = hold_violations(snap.receipts, hold_limit)
    for feed in feeds:
        found += receipt_violations(feed, snap.events, snap.receipts)
        checkpoint = snap.checkpoints.get(feed)
        if checkpoint is not None:
            found += passed_violations(checkpoint, snap.events, snap.receipts)
        if not caught_up(checkpoint, snap.events):
            found.append(Violation("caught-up", feed, "", f"not caught up: {checkpoint}"))
    return found


def render(snap: Snapshot, feeds: dict[str, str]) -> list[str]:
    """One line per feed: its receipts per state (quarantines per reason), its checkpoint
    against the feed's end, its alarms per kind (events alarmed)."""
    lines: list[str] = []
    backfills = sum(e.backfill for e in snap.events)
    lines.append(f"provider events {len(snap.events)} (backfilled by the simulator {backfills})")
    for feed, kind in feeds.items():
        receipts = [r for r in snap.receipts if r.feed == feed]
        states = Counter(r.state for r in receipts)
        reasons = Counter(r.reason for r in receipts if r.state == "quarantined")
        said = ", ".join(f"{s} x{n}" for s, n in sorted(states.items())) or "none"
        if reasons:
            said += " (quarantined: " + ", ".join(f"{k} x{n}" for k, n in sorted(reasons.items()))
            said += ")"
        checkpoint = snap.checkpoints.get(feed)
        if kind == "cursor":
            end = max((e.position for e in snap.events), default=None)
            at = None if checkpoint is None else checkpoint.applied_position
            where = f"applied_position {at} (last position {end})"
        else:
            end = max((e.timestamp for e in snap.events), default=None)
            at = None if checkpoint is None else checkpoint.closed_through
            where = f"closed_through {at} (last timestamp {end})"
        alarms = sorted((k, n) for (f, k), n in snap.alarms.items() if f == feed)
        alarmed = ", ".join(f"{k} x{n}" for k, n in alarms) or "none"
        lines.append(f"feed {feed} ({kind}): receipts {said}; {where}; alarms {alarmed}")
    return lines


def _where(event: Event) -> str:
    backfill = ", a backfill" if event.backfill else ""
    return f"position {event.position}, timestamp {event.timestamp}{backfill}"


def capped(violations: Sequence[Violation]) -> list[str]:
    """The violations as lines, at most ``SHOWN`` per rule and feed, the rest counted."""
    groups: dict[tuple[str, str], list[Violation]] = {}
    for v in violations:
        groups.setdefault((v.rule, v.feed), []).append(v)
    lines: list[str] = []
    for (rule, feed), found in groups.items():
        lines += [str(v) for v in found[:SHOWN]]
        if len(found) > SHOWN:
            lines.append(f"feed {feed}: {len(found) - SHOWN} more {rule} violations")
    return lines
