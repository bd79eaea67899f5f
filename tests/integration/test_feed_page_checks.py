"""Checks on the pages other than the main one, and on the client: an answer that breaks the
contract is no page (C15, the real FeedClient against a real local HTTP source); a tie group
larger than the largest page stalls (T7); the audit's and the reconciliation's pages get the
main page's checks (A5, A10) and the audit's own tie stall (A6). Real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_events import event_digest
from service.app.observer import AUDIT_EVERY, MAX_PAGE, PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.core import OperationState
from service.domain.feeds import (
    MAX_PAGE_BYTES,
    CursorPage,
    FeedClient,
    FeedUnavailable,
    RawEvent,
    TimestampPage,
)
from service.store.feed_tables import feed_receipts
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    ScriptedFeed,
    event,
    foreign,
    observer,
    promised,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)

pytestmark = pytest.mark.integration

# The client's timeout in these tests: short, so a source that never answers costs little.
TIMEOUT = 0.2
# A trickling source sends its body in this many pieces, TIMEOUT / 4 apart: 4 timeouts in all.
DRIP_PIECES = 16


digest_of = event_digest  # the digest the observer keeps of an event as served


async def settled_receipts(engine: AsyncEngine, feed: str, served: list[RawEvent]) -> None:
    """Final receipts of events already decided, as the observer would have written them
    (their place, the digest of their content)."""
    now = datetime.now(UTC)
    async with engine.begin() as conn:
        await conn.execute(
            feed_receipts.insert(),
            [
                {
                    "feed": feed,
                    "event_id": raw.event_id,
                    "event_order": raw.position if raw.position is not None else raw.timestamp,
                    "state": "quarantined",
                    "reason": "unknown-operation",
                    "digest": digest_of(raw),
                    "first_seen_at": now,
                    "decided_at": now,
                }
                for raw in served
            ],
        )


async def alarms_of(feed_store: FeedStore, feed: str) -> dict[str, tuple[str, int]]:
    """kind -> (detail, count) of the feed's alarms (one event per kind in these tests)."""
    return {a.kind: (a.detail, a.count) for a in await feed_store.alarms.recent(feed)}


# -- C15: an answer that breaks the contract is no page -------------------------------------------


class Source:
    """A feed source on 127.0.0.1: every request gets ``answer`` (status, body), or no answer
    at all when it is None; ``asked`` keeps each request's query."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] | None = (200, b"")
        # seconds between the body's pieces (DRIP_PIECES of them), None: all at once
        self.drip: float | None = None
        self.asked: list[dict[str, list[str]]] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/feed"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.asked.append(parse_qs(urlsplit(head.split(b" ")[1].decode()).query))
            if self.answer is None:
                await reader.read()  # nothing, until the client gives up and hangs up
                return
            status, body = self.answer
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            )
            if self.drip is None:
                writer.write(body)
            else:  # a source that trickles its answer: each piece well within the timeout
                size = -(-len(body) // DRIP_PIECES)
                for piece in range(0, len(body), size):
                    await writer.drain()
                    await asyncio.sleep(self.drip)
                    writer.write(body[piece : piece + size])
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up first (a page too large)
        finally:
            writer.close()
            self._handlers.discard(task)


@pytest.fixture
async def source() -> AsyncIterator[Source]:
    served = Source()
    await served.start()
    yield served
    await served.stop()


def page_body(kind: str, events: list[RawEvent], pad: int = 0) -> bytes:
    """A page of ``kind``, valid but for ``pad`` bytes of an unknown field (ignored)."""
    if kind == "cursor":
        page: dict[str, Any] = {"events": events, "next_cursor": "C8"}
    else:
        page = {"events": events, "finality_watermark": 2000}
    body = msgspec.json.encode(page)
    if not pad:
        return body
    head, tail = body[:-1] + b',"pad":"', b'"}'
    return head + b"x" * (pad - len(head) - len(tail)) + tail


# what the client says of each answer (so each is refused for its own reason)
REFUSED = {
    "error-status": "HTTP 503",
    "not-json": "not a feed page",
    "wrong-shape": "not a feed page",
    "no-order": "an event without a (position|timestamp)",
    "silent": "no whole page in time",
    "too-large": "page too large",
}


def contract_break(kind: str, answer: str, good: RawEvent) -> tuple[int, bytes] | None:
    """What the source answers: each breaks the contract, around an event that is good."""
    order = "position" if kind == "cursor" else "timestamp"
    match answer:
        case "error-status":
            return 503, page_body(kind, [good])
        case "not-json":
            return 200, b"<html>busy</html>"
        case "wrong-shape":
            return 200, msgspec.json.encode({"items": [good], "cursor": "C8"})
        case "no-order":
            return 200, page_body(kind, [good, msgspec.structs.replace(good, **{order: None})])
        case "silent":
            return None
        case "too-large":
            body = page_body(kind, [good], pad=MAX_PAGE_BYTES + 1)
            assert len(body) == MAX_PAGE_BYTES + 1
            return 200, body
    raise AssertionError(answer)


async def ask(client: FeedClient, kind: str) -> CursorPage | TimestampPage:
    if kind == "cursor":
        return await client.cursor_page("C7", 10)
    return await client.timestamp_page(1000, 10)


async def start(engine: AsyncEngine, name: str, kind: str) -> None:
    if kind == "cursor":
        await set_checkpoint(engine, name, kind, resume_cursor="C7", applied_position=0)
    else:
        await set_checkpoint(engine, name, kind, closed_through_timestamp=1000)


@pytest.mark.parametrize("answer", list(REFUSED))
@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
async def test_an_answer_that_breaks_the_contract_is_no_page_and_moves_nothing(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    source: Source,
    kind: str,
    answer: str,
) -> None:
    """An error status, a body that is not the page's shape, an event without its order, no
    answer within the timeout, or a body over MAX_PAGE_BYTES: the client raises
    FeedUnavailable, and the observer reports UNAVAILABLE, decides nothing about the good
    event in it, moves no checkpoint and backs off."""
    spec = FeedSpec(feed_name, kind, source.url, promised(kind))
    op = await unknown_payout(store, principal_id, clock)
    good = event(op, "good", position=1) if kind == "cursor" else event(op, "good", timestamp=1001)
    source.answer = contract_break(kind, answer, good)
    await start(engine, feed_name, kind)
    before = await feed_store.checkpoints.checkpoint(feed_name, kind)
    client = FeedClient(spec, timeout=TIMEOUT)
    watcher = observer(spec, cast(ScriptedFeed, client), store, feed_store, engine, clock)
    try:
        with pytest.raises(FeedUnavailable, match=REFUSED[answer]):
            await ask(client, kind)
        page = await watcher.run_once()
    finally:
        await watcher.close()
    assert page.result is PageResult.UNAVAILABLE
    assert watcher.wait_after(page) == 1.0  # backs off as on any page without progress
    assert await feed_store.checkpoints.checkpoint(feed_name, kind) == before
    assert await receipt_states(engine, feed_name) == {}
    assert await feed_store.alarms.recent(feed_name) == []
    assert (await store.reads.get(uuid.UUID(op.operation_id))).state is OperationState.UNKNOWN  # type: ignore[union-attr]
    expected = {"cursor": ["C7"]} if kind == "cursor" else {"after": ["1000"]}
    assert source.asked == [{**expected, "limit": ["10"]}] * 2  # both reached the source


async def test_an_answer_trickled_past_the_timeout_is_no_page(
    store: SettlementStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    source: Source,
) -> None:
    spec = FeedSpec(feed_name, "cursor", source.url)
    op = await unknown_payout(store, principal_id, clock)
    source.answer = (200, page_body("cursor", [event(op, "good", position=1)]))
    source.drip = TIMEOUT / 4
    client = FeedClient(spec, timeout=TIMEOUT)
    try:
        with pytest.raises(FeedUnavailable):
            await client.cursor_page("C7", 10)
    finally:
        await client.close()


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
async def test_a_page_of_exactly_the_largest_size_is_a_page(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    source: Source,
    kind: str,
) -> None:
    """The control of the case above: the same source and client, a valid page of exactly
    MAX_PAGE_BYTES, settles its event and moves the checkpoint."""
    spec = FeedSpec(feed_name, kind, source.url, promised(kind))
    op = await unknown_payout(store, principal_id, clock)
    good = event(op, "good", position=1) if kind == "cursor" else event(op, "good", timestamp=1001)
    body = page_body(kind, [good], pad=MAX_PAGE_BYTES)
    assert len(body) == MAX_PAGE_BYTES
    source.answer = (200, body)
    await start(engine, feed_name, kind)
    client = FeedClient(spec, timeout=TIMEOUT)
    watcher = observer(spec, cast(ScriptedFeed, client), store, feed_store, engine, clock)
    try:
        assert [e.event_id for e in (await ask(client, kind)).events] == ["good"]
        assert (await watcher.run_once()).result is PageResult.PROMOTED
    finally:
        await watcher.close()
    assert await receipt_states(engine, feed_name) == {"good": "applied"}
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, kind)
    if kind == "cursor":
        assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C8", 1)
    else:
        assert checkpoint.closed_through_timestamp == 2000


# -- T7: a tie group larger than the largest page -----------------------------------------------


async def test_a_tie_group_larger_than_the_largest_page_stalls_and_skips_nothing(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """501 events at 10:01 (each decided at once: its operation is not here, grace 0), then
    one at 10:02 and a watermark at 10:02: the page grows 125 -> 250 -> 500, and a full page
    of one timestamp at 500 stalls the feed with a tie-stall alarm. Nothing closes, though
    every event served has a final receipt: the 501st was never served."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/ts", TIMESTAMP_PROMISES)
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=1000)
    feed = ScriptedFeed(spec)
    feed.events = [foreign(f"t{n:03d}", timestamp=1001) for n in range(MAX_PAGE + 1)]
    feed.events.append(foreign("after", timestamp=1002))
    feed.watermark = 1002
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, page_size=125)
    pages = [await watcher.run_once() for _ in range(4)]
    assert [p.result for p in pages] == [
        PageResult.GROW, PageResult.GROW, PageResult.STUCK, PageResult.STUCK
    ]  # fmt: skip
    assert [p.processed for p in pages] == [125, 125, 250, 0]
    assert [limit for _, limit in feed.asked] == [125, 250, MAX_PAGE, MAX_PAGE]
    assert watcher.wait_after(pages[-1]) > 0  # a stall is no progress: the observer backs off
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 1000
    states = await receipt_states(engine, feed_name)
    assert len(states) == MAX_PAGE and set(states.values()) == {"quarantined"}
    assert f"t{MAX_PAGE:03d}" not in states and "after" not in states
    stall = await alarms_of(feed_store, feed_name)
    assert stall == {"tie-stall": (f"more than {MAX_PAGE} events at timestamp 1001", 2)}


# -- A5, A10: the audit's and the reconciliation's pages get the main page's checks ---------------


Serves = Callable[[RawEvent, RawEvent], list[RawEvent]]
# break -> (what the page serves, given the settled event "a" and the unknown "b"; the
# alarm's kind; the start of its detail)
AUDIT_BREAKS: dict[str, tuple[Serves, str, str]] = {
    "moved": (lambda a, b: [b, msgspec.structs.replace(a, timestamp=1950)],
              "conflicting-identity", "audit: event seen at timestamp 1900, now at 1950"),
    "changed": (lambda a, b: [foreign("a", timestamp=1900), b],
                "conflicting-identity", "audit: event served again with other content"),
    "twice": (lambda a, b: [b, foreign("c", timestamp=1945), foreign("c", timestamp=1945)],
              "conflicting-identity", "audit: served twice in one page: at 1945 and at 1945"),
    "regression": (lambda a, b: [b, foreign("y", timestamp=1920)],
                   "regression", "audit: timestamp 1920 after 1940 in one page"),
}  # fmt: skip


@pytest.mark.parametrize("broken", list(AUDIT_BREAKS))
async def test_an_audit_page_that_breaks_order_or_identity_is_alarmed_and_processes_nothing(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    broken: str,
) -> None:
    """Closed through 2000, "a" settled at 1900: the audit (every AUDIT_EVERY-th request)
    reads the window behind 2000 and finds a page that breaks the main page's checks: an
    alarm ("audit: ..."), no receipt or late-event alarm for the unknown "b" on the page
    (even before the break), the checkpoint stays, and the walk starts again."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/ts", TIMESTAMP_PROMISES)
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=2000)
    a, b = foreign("a", timestamp=1900), foreign("b", timestamp=1940)
    await settled_receipts(engine, feed_name, [a])
    serves, kind, detail = AUDIT_BREAKS[broken]
    feed = ScriptedFeed(spec)
    feed.events = serves(a, b)  # as listed: all behind the closed timestamp
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, audit_window=300)
    for _ in range(2 * AUDIT_EVERY):
        assert (await watcher.run_once()).result is PageResult.CAUGHT_UP
    alarms = await alarms_of(feed_store, feed_name)
    assert set(alarms) == {kind}
    assert alarms[kind][0].startswith(detail) and alarms[kind][1] == 2
    assert await receipt_states(engine, feed_name) == {"a": "quarantined"}
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 2000
    audits = [asked for asked in feed.asked if asked[1] == MAX_PAGE]
    assert audits == [(1699, MAX_PAGE)] * 2  # the walk started again where it starts


RECONCILIATION_BREAKS: dict[str, tuple[Serves, str, str]] = {
    "moved": (lambda a, b: [b, msgspec.structs.replace(a, position=15)],
              "conflicting-identity", "reconciliation: event seen at position 10, now at 15"),
    "taken": (lambda a, b: [b, foreign("c", position=10)],
              "conflicting-identity", "reconciliation: position 10 already holds event a"),
    "changed": (lambda a, b: [b, foreign("a", position=10)],
                "conflicting-identity", "reconciliation: event served again with other content"),
    "twice": (lambda a, b: [b, foreign("c", position=12), foreign("c", position=12)],
              "conflicting-identity", "reconciliation: served twice in one page: at 12 and at 12"),
    "regression": (lambda a, b: [b, foreign("y", position=3)],
                   "regression", "reconciliation: position 3 after 5 in one page"),
}  # fmt: skip


@pytest.mark.parametrize("broken", list(RECONCILIATION_BREAKS))
async def test_a_reconciliation_page_that_breaks_order_or_identity_is_alarmed_and_processes_nothing(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    broken: str,
) -> None:
    """A cursor feed that may backfill, applied through 50, "a" settled at 10: the
    reconciliation pass (every AUDIT_EVERY-th request) reads it again from its start and finds
    a page that breaks the main page's checks: an alarm ("reconciliation: ..."), no receipt or
    backfill alarm for the unknown "b" at 5 (before the break), the checkpoint stays, and the
    pass starts again from the start."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C50", applied_position=50)
    a, b = foreign("a", position=10), foreign("b", position=5)
    await settled_receipts(engine, feed_name, [a])
    serves, kind, detail = RECONCILIATION_BREAKS[broken]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=serves(a, b), next_cursor="C20")
    feed.cursor_pages["C50"] = CursorPage(events=[], next_cursor="C50")  # caught up
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    for _ in range(2 * AUDIT_EVERY):
        assert (await watcher.run_once()).result is PageResult.CAUGHT_UP
    alarms = await alarms_of(feed_store, feed_name)
    assert set(alarms) == {kind}
    assert alarms[kind][0].startswith(detail) and alarms[kind][1] == 2
    assert await receipt_states(engine, feed_name) == {"a": "quarantined"}
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C50", 50)
    assert [asked for asked in feed.asked if asked[1] == MAX_PAGE] == [("", MAX_PAGE)] * 2


# -- A6: a tie group larger than the audit's page ------------------------------------------------


async def test_more_than_the_largest_page_at_one_timestamp_in_the_audit_window_stalls_the_audit(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """Closed through 2000, 501 settled events at 1900 and one event that arrived late at
    1950: the audit's walk (from 1699) reaches 1900, finds a full page of that one timestamp
    and raises tie-stall ("audit: ..."), then goes on past it and finds the late event."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/ts", TIMESTAMP_PROMISES)
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=2000)
    tie = [foreign(f"t{n:03d}", timestamp=1900) for n in range(MAX_PAGE + 1)]
    await settled_receipts(engine, feed_name, tie)
    feed = ScriptedFeed(spec)
    feed.events = [*tie, foreign("late", timestamp=1950)]
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, audit_window=300)
    for _ in range(2 * AUDIT_EVERY):
        await watcher.run_once()
    stall = await alarms_of(feed_store, feed_name)
    assert stall == {"tie-stall": (f"audit: more than {MAX_PAGE} events at timestamp 1900", 1)}
    assert "late" not in await receipt_states(engine, feed_name)
    for _ in range(AUDIT_EVERY):
        await watcher.run_once()
    assert [asked for asked in feed.asked if asked[1] == MAX_PAGE] == [
        (1699, MAX_PAGE), (1899, MAX_PAGE), (1900, MAX_PAGE)
    ]  # fmt: skip
    assert (await receipt_states(engine, feed_name))["late"] == "quarantined"
    alarms = await alarms_of(feed_store, feed_name)
    assert set(alarms) == {"tie-stall", "late-event"}
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 2000
