"""One feed event's outcome (docs/design.md §8): what the observer decides for each event of a page,
for each hold it decides again on its own, and for an operator's ``retry`` of a hold.

An event's outcome, each committed with its receipt in one transaction:

* evidence whose signature does not verify (or that is not evidence): **held**
  (``bad-signature``) for an operator (``POST /admin/v1/feeds/{name}/holds/{event_id}``);
* about an operation that is not here: held (``unknown-operation``) until
  ``SETTLEMENT_FEED_UNKNOWN_GRACE`` has passed since the event was first seen (on the
  database's clock), then **quarantined**; purged by retention: quarantined
  (``operation-expired``); about a local effect: quarantined (``not-external``);
* otherwise settled through the core as a ``feed`` observation: the receipt is **applied**,
  **ignored** (a replay) or **quarantined** (a tuple mismatch), as the core decided.

A hold keeps the event as served, so deciding it again needs nothing from the feed.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable

import msgspec

from service.core import Observation, Source
from service.core.feed import FeedEvent, ReceiptState, Seen
from service.domain.feeds import RawEvent, decode_signed
from service.evidence import observation_of, verify
from service.failpoints import Failpoints
from service.store.feed_receipts import Receipt
from service.store.feeds import FeedStore
from service.store.retention import RetentionStore
from service.store.rows import at
from service.store.settlement import SettlementStore

__all__ = ["FeedEvents", "event_digest", "event_order", "served_again"]

log = logging.getLogger("settlement.observer")


class FeedEvents:
    def __init__(
        self,
        feeds: FeedStore,
        store: SettlementStore,
        tombstones: RetentionStore,
        *,
        secret: str | None,
        external_routes: frozenset[str],
        failpoints: Failpoints,
        clock: Callable[[], float],
        unknown_grace: float,
    ) -> None:
        self._feeds = feeds
        self._store = store
        self._tombstones = tombstones
        self._secret = secret
        self._external = external_routes
        self._failpoints = failpoints
        self._clock = clock
        self._grace = unknown_grace

    async def decide(
        self,
        feed: str,
        event: FeedEvent,
        raw: RawEvent,
        known: Seen | None,
        *,
        operator: bool = False,
        held: Receipt | None = None,
    ) -> ReceiptState:
        """Give ``event`` its outcome (a final receipt or a hold) and say which.

        ``known``: its receipt, if it has one; ``held``: that receipt in full when the
        caller has it (else it is read here when it is a hold: its reason and its age; an
        event met for the first time has none, and its age is 0). A hold for an operator
        (``bad-signature``) stays as it is unless ``operator`` asks again (a ``retry``)."""
        now = self._clock()
        served = (bytes(raw.evidence), raw.signature)
        if held is None and known is not None and known.state is ReceiptState.HELD:
            held = await self._feeds.receipts.receipt(feed, event.event_id)
        if held is not None and held.reason == "bad-signature" and not operator:
            if event.digest and event.digest != held.digest:
                # served again with other content: the hold keeps the latest copy, which is
                # what an operator's retry decides
                await self._feeds.receipts.refuse_event(
                    feed, event.event_id, event.order, held.operation_id, None,
                    "held", "bad-signature", at(now), digest=event.digest, served=served,
                )  # fmt: skip
            return ReceiptState.HELD  # for an operator to decide, whatever comes now
        signed = decode_signed(raw)
        verified = signed is not None and self._secret is not None and verify(signed, self._secret)
        if signed is None or not verified:
            operation_id = None if signed is None else signed.evidence.operation_id
            observation = (
                None
                if signed is None
                else observation_of(signed.evidence, Source.FEED, verified=False)
            )
            receipt = await self._feeds.receipts.refuse_event(
                feed, event.event_id, event.order, operation_id, observation,
                "held", "bad-signature", at(now), digest=event.digest, served=served,
            )  # fmt: skip
            await self.alarm(
                feed, "bad-signature", event.event_id, "the event's evidence does not verify"
            )
            return ReceiptState(receipt.state)
        assert signed is not None
        operation_id = signed.evidence.operation_id
        observation = observation_of(signed.evidence, Source.FEED)
        owner = await self._store.reads.owner_of(operation_id)
        if owner is None:
            if await self._tombstones.by_operation(operation_id) is not None:
                return await self._quarantine(
                    feed, event, operation_id, observation, "operation-expired"
                )
            if (0.0 if held is None else held.age) >= self._grace:
                return await self._quarantine(
                    feed, event, operation_id, observation, "unknown-operation"
                )
            receipt = await self._feeds.receipts.refuse_event(
                feed, event.event_id, event.order, None, None,
                "held", "unknown-operation", at(now), digest=event.digest, served=served,
            )  # fmt: skip
            return ReceiptState(receipt.state)
        if owner[1] not in self._external:
            return await self._quarantine(feed, event, operation_id, observation, "not-external")
        receipt, found = await self._feeds.receipts.settle_event(
            feed,
            event.event_id,
            event.order,
            operation_id,
            observation,
            at(now),
            digest=event.digest,
            served=served,
            before_commit=lambda: self._failpoints.hit("observer.event.before_commit"),
        )
        await self._failpoints.hit("observer.event.after_commit")
        if found is not None:
            self._store.reports.settled(operation_id, found[0], found[1])
        return ReceiptState(receipt.state)

    async def redecide(self, feed: str, held: Receipt, *, operator: bool = False) -> ReceiptState:
        """Decide a hold again from the event it keeps; a hold that kept no event (written
        before holds kept them) stays as it is until its feed serves it again."""
        raw = served_again(held)
        if raw is None:
            return ReceiptState(held.state)
        event = FeedEvent(held.event_id, held.event_order, held.digest)
        known = Seen(order=held.event_order, state=ReceiptState(held.state), digest=held.digest)
        return await self.decide(feed, event, raw, known, operator=operator, held=held)

    async def redrive(self, feed: str, batch: int) -> int:
        """Decide up to ``batch`` of the feed's holds again on their own (those waiting for
        an operation, the least recently decided first); how many became final. A database
        error ends the pass: the next one retries."""
        finals = 0
        for held in await self._feeds.receipts.due_holds(feed, batch):
            try:
                state = await self.redecide(feed, held)
            except Exception as exc:
                log.warning(
                    "held feed event not decided again; the next pass retries it",
                    extra={"feed": feed, "event_id": held.event_id, "error": repr(exc)},
                )
                break
            finals += state.final
        if finals:
            log.info("feed holds decided", extra={"feed": feed, "final": finals})
        return finals

    async def _quarantine(
        self,
        feed: str,
        event: FeedEvent,
        operation_id: uuid.UUID,
        observation: Observation,
        reason: str,
    ) -> ReceiptState:
        await self._failpoints.hit("observer.quarantine.before")
        receipt = await self._feeds.receipts.refuse_event(
            feed,
            event.event_id,
            event.order,
            operation_id,
            observation,
            "quarantined",
            reason,
            at(self._clock()),
            digest=event.digest,
        )
        await self._failpoints.hit("observer.quarantine.after")
        log.warning(
            "feed event quarantined",
            extra={"feed": feed, "event_id": event.event_id, "reason": reason},
        )
        return ReceiptState(receipt.state)

    async def outcomes(
        self,
        feed: str,
        process: list[FeedEvent],
        served: list[RawEvent],
        seen: dict[str, Seen],
        alarms: list[tuple[str, FeedEvent, str]],
    ) -> tuple[dict[str, ReceiptState], int] | None:
        """Raise a page's alarms, then give ``process`` their outcomes, in order: every
        event's state after it and how many were processed, or None when an error stopped
        the page (the events after it are left for the page's next reading)."""
        for kind, event, detail in alarms:
            await self.alarm(feed, kind, event.event_id, detail)
        states = {event_id: s.state for event_id, s in seen.items()}
        raw = {e.event_id: e for e in served}
        done = 0
        for event in process:
            try:
                states[event.event_id] = await self.decide(
                    feed, event, raw[event.event_id], seen.get(event.event_id)
                )
            except Exception as exc:
                log.warning(
                    "feed event not settled; the page stops and will be retried",
                    extra={"feed": feed, "event_id": event.event_id, "error": repr(exc)},
                )
                return None
            done += 1
        return states, done

    async def repin(self, feed: str, served: list[FeedEvent], *, places: bool) -> None:
        """After a page that passed the checks is decided: pin again the unpinned receipts it
        served (the checks' ``repin``: an accepted conflict is accepted once, not for good).
        ``places``: a cursor feed, whose positions are one event's each."""
        pinned = await self._feeds.receipts.repin(feed, served, places=places)
        if pinned:
            log.info("feed receipts pinned again", extra={"feed": feed, "event_ids": pinned})

    async def alarm(
        self, feed: str, kind: str, event_id: str, detail: str, order: int | None = None
    ) -> None:
        """``order``: where the page served the event (kept for an operator's review)."""
        log.error(
            "feed alarm",
            extra={"feed": feed, "alarm": kind, "event_id": event_id, "detail": detail},
        )
        await self._feeds.alarms.alarm(feed, kind, event_id, detail, at(self._clock()), order)


def served_again(held: Receipt) -> RawEvent | None:
    """The event a hold keeps, as its feed served it; None when it kept none."""
    if held.evidence is None:
        return None
    return RawEvent(
        event_id=held.event_id,
        evidence=msgspec.Raw(held.evidence),
        signature=held.signature or "",
    )


def event_digest(event: RawEvent) -> str:
    """What the event says, as served: its evidence bytes and its signature."""
    return hashlib.sha256(bytes(event.evidence) + b"\n" + event.signature.encode()).hexdigest()


def event_order(value: int | None) -> int:
    """An event's position or timestamp (the client refuses a page with an event without)."""
    assert value is not None
    return value
