"""The provider simulator's two event feeds, over HTTP from a real process: every committed
payment is one event with the evidence its answer carried; cursor pages cover each event once
in commit order under deterministic, opaque tokens; the timestamp feed orders ties by position
and its finality watermark holds; every feed fault does what it says; a restart changes
nothing."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from devstack.provider.cursors import CursorCodec
from devstack.provider.faults import MAX_FAULT_COUNT
from devstack.provider.feeds import BACKFILL_REACH, MAX_LIMIT, PAGE_CAP_EVENTS, WATERMARK_LIE
from service.evidence import SignedEvidence, verify
from tests.e2e.provider import CALL_TIMEOUT, SECRET, ProviderProcess

HEX64 = re.compile(r"[0-9a-f]{64}")
# After this many seconds a watermark that has not passed a timestamp never will.
WATERMARK_DEADLINE = 4.0
# Concurrent-commit test: payers, and how long they pay (long enough to cross a second, so
# watermarks close some of their events), at most so many payments each (one page holds all).
PAYERS = 2
PAYING_SECONDS = 1.5
MAX_PAYMENTS_EACH = 200
# A timestamp far in the future: a page after it is empty, and says the watermark.
FAR_FUTURE = 10**11

Event = dict[str, Any]


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderProcess]:
    with ProviderProcess(tmp_path_factory.mktemp("feeds") / "provider.sqlite3") as proc:
        yield proc


@pytest.fixture(autouse=True)
def _no_faults_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "provider" in request.fixturenames:
        provider: ProviderProcess = request.getfixturevalue("provider")
        provider.clear_feed_faults()
        provider.clear_faults()


# -- helpers -------------------------------------------------------------------------------------


def page(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    return body


def cursor_page(provider: ProviderProcess, cursor: str, limit: int = MAX_LIMIT) -> dict[str, Any]:
    return page(provider.cursor_feed(cursor, limit))


def timestamp_page(
    provider: ProviderProcess, after: int | None, limit: int = MAX_LIMIT
) -> dict[str, Any]:
    return page(provider.timestamp_feed(after, limit))


def tail(provider: ProviderProcess) -> str:
    """The cursor after every event committed so far."""
    cursor = ""
    while events := (got := cursor_page(provider, cursor))["events"]:
        assert events
        cursor = got["next_cursor"]
    return cursor


def watermark(provider: ProviderProcess) -> int:
    mark = timestamp_page(provider, FAR_FUTURE, 1)["finality_watermark"]
    assert isinstance(mark, int)
    return mark


def pay(provider: ProviderProcess, *, decline: bool = False) -> Event:
    """A new payment; its event as the feeds should serve it, without position or timestamp."""
    if decline:
        provider.arm("decline")
    answer = provider.pay_new()
    assert answer.status_code == (402 if decline else 201), answer.text
    data = answer.json()
    return {
        "event_id": f"evt_{data['reference']}",
        "evidence": data["evidence"],
        "signature": data["signature"],
    }


def same_payment(event: Event, expected: Event) -> bool:
    return all(event[name] == expected[name] for name in ("event_id", "evidence", "signature"))


def ours(events: list[Event], paid: list[Event]) -> list[Event]:
    """The events of these payments, in page order (the timestamp feed may also show events
    of an earlier test committed in the same second)."""
    ids = {p["event_id"] for p in paid}
    return [event for event in events if event["event_id"] in ids]


def signed_of(event: Event) -> SignedEvidence:
    picked = {"evidence": event["evidence"], "signature": event["signature"]}
    return msgspec.json.decode(msgspec.json.encode(picked), type=SignedEvidence)


def armed(provider: ProviderProcess) -> list[tuple[str, int]]:
    return [(fault["mode"], fault["count"]) for fault in provider.feed_faults()]


def timestamp_of(provider: ProviderProcess, event: Event, after: int) -> int:
    found = [e for e in timestamp_page(provider, after)["events"] if same_payment(e, event)]
    assert len(found) == 1, found
    timestamp: int = found[0]["timestamp"]
    return timestamp


# -- the cursor feed -----------------------------------------------------------------------------


def test_cursor_pages_cover_every_event_once_in_commit_order(provider: ProviderProcess) -> None:
    start = tail(provider)
    paid = [pay(provider, decline=n % 3 == 1) for n in range(7)]

    served: list[Event] = []
    cursor, sizes = start, []
    while events := (got := cursor_page(provider, cursor, 3))["events"]:
        served += events
        sizes.append(len(events))
        cursor = got["next_cursor"]
    everything = cursor_page(provider, "")["events"]

    assert sizes == [3, 3, 1]
    assert len(served) == len(paid)
    for event, expected in zip(served, paid, strict=True):
        assert same_payment(event, expected)
        assert set(event) == {"event_id", "position", "evidence", "signature"}
        assert verify(signed_of(event), SECRET)
    positions = [e["position"] for e in everything]
    assert positions == sorted(set(positions)), "positions strictly increase, each once"
    assert len({e["event_id"] for e in everything}) == len(everything)
    assert [e for e in everything if e["event_id"] in {p["event_id"] for p in paid}] == served
    assert [signed_of(e).evidence.outcome for e in served] == [
        "failed" if n % 3 == 1 else "completed" for n in range(7)
    ]


def test_an_empty_page_answers_the_request_cursor_unchanged(provider: ProviderProcess) -> None:
    pay(provider)
    end = tail(provider)

    assert cursor_page(provider, end) == {"events": [], "next_cursor": end}


def test_tokens_are_deterministic_and_opaque(provider: ProviderProcess) -> None:
    start = tail(provider)
    first = pay(provider)
    pay(provider)

    once = cursor_page(provider, start, 1)
    twice = cursor_page(provider, start, 1)
    whole = cursor_page(provider, start)

    assert once == twice
    assert same_payment(once["events"][0], first)
    token = once["next_cursor"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{19}", token), token
    assert not token.isdigit() and str(once["events"][0]["position"]) not in token
    assert CursorCodec(SECRET).decode(token)[0] == once["events"][0]["position"]
    assert whole["next_cursor"] == CursorCodec(SECRET).encode(whole["events"][-1]["position"])


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "0"},
        {"cursor": "10"},
        {"cursor": "A" * 19},
        {"cursor": "not a cursor"},
        {"cursor": CursorCodec("another secret").encode(10)},
        {"cursor": "x" * 65},
        {"limit": "0"},
        {"limit": str(MAX_LIMIT + 1)},
        {"limit": "-1"},
        {"limit": "ten"},
        {"limit": "1.5"},
        {"limit": ""},
    ],
    ids=lambda p: "-".join(f"{k}={v[:12]}" for k, v in p.items()),
)
def test_a_bad_cursor_or_limit_is_400(provider: ProviderProcess, params: dict[str, str]) -> None:
    response = httpx.get(f"{provider.base_url}/feeds/cursor", params=params, timeout=CALL_TIMEOUT)

    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"}


def test_a_token_with_a_character_changed_or_given_twice_is_400(
    provider: ProviderProcess,
) -> None:
    pay(provider)
    token = tail(provider)
    forged = token[:5] + ("B" if token[5] != "B" else "C") + token[6:]
    url = f"{provider.base_url}/feeds/cursor"

    assert provider.cursor_feed(forged).status_code == 400
    twice = httpx.get(f"{url}?cursor={token}&cursor={token}", timeout=CALL_TIMEOUT)
    assert twice.status_code == 400
    limits = httpx.get(f"{url}?limit=1&limit=2", timeout=CALL_TIMEOUT)
    assert limits.status_code == 400


# -- the timestamp feed --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [{"after": "-1"}, {"after": "soon"}, {"after": ""}, {"after": "1" * 13}, {"limit": "0"}],
)
def test_a_bad_after_or_limit_is_400(provider: ProviderProcess, params: dict[str, str]) -> None:
    url = f"{provider.base_url}/feeds/timestamp"
    response = httpx.get(url, params=params, timeout=CALL_TIMEOUT)

    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"}


def test_the_timestamp_feed_serves_events_after_a_second_in_order(
    provider: ProviderProcess,
) -> None:
    before = watermark(provider)
    paid = [pay(provider, decline=n == 1) for n in range(4)]

    got = timestamp_page(provider, before)
    cut = timestamp_page(provider, before, 2)

    mine = ours(got["events"], paid)
    assert [same_payment(e, p) for e, p in zip(mine, paid, strict=True)] == [True] * 4
    keys = [e["timestamp"] for e in got["events"]]
    assert keys == sorted(keys) and all(key > before for key in keys)
    assert all(set(e) == {"event_id", "timestamp", "evidence", "signature"} for e in got["events"])
    assert all(verify(signed_of(e), SECRET) for e in got["events"])
    assert cut["events"] == got["events"][:2]
    assert isinstance(got["finality_watermark"], int)
    assert got["finality_watermark"] >= before
    everything = timestamp_page(provider, None)["events"]
    orders = [(e["timestamp"], e["event_id"]) for e in everything]
    assert len(orders) == len(set(orders))


def test_a_big_tie_is_ordered_by_position_cut_at_limit_and_holds_the_watermark(
    provider: ProviderProcess,
) -> None:
    start, before = tail(provider), watermark(provider)
    provider.arm_feed("big_tie", 3)
    first, second = pay(provider), pay(provider)
    tie = timestamp_of(provider, first, before)
    # the provider stamps by this machine's clock: once it has left the tie's second, an
    # untied watermark would be at least the tie's second
    while time.time() < tie + 1:
        time.sleep(0.01)
    assert watermark(provider) == tie - 1  # two of three: the group may still grow
    third = pay(provider)

    # events of an earlier test may share the tie's second: they come first, by position
    group = [e for e in timestamp_page(provider, tie - 1)["events"] if e["timestamp"] == tie]
    cut = timestamp_page(provider, tie - 1, len(group) - 1)["events"]
    whole = ours(group, [first, second, third])

    assert cut == group[:-1]  # a group larger than the page is cut
    assert timestamp_page(provider, tie - 1, len(group))["events"] == group
    assert [same_payment(e, p) for e, p in zip(whole, (first, second, third), strict=True)] == [
        True
    ] * 3
    assert group[-3:] == whole
    positions = {e["event_id"]: e["position"] for e in cursor_page(provider, start)["events"]}
    in_tie = [positions[e["event_id"]] for e in whole]
    assert in_tie == sorted(in_tie)
    deadline = time.monotonic() + WATERMARK_DEADLINE
    while watermark(provider) < tie:
        assert time.monotonic() < deadline, "the watermark never passed a complete tie"
        time.sleep(0.1)
    assert armed(provider) == []
    assert timestamp_of(provider, pay(provider), tie - 1) > tie


def test_the_watermark_is_honest_under_concurrent_payments(provider: ProviderProcess) -> None:
    """Pages (events and watermark read together) are taken while payments commit. Once all
    are in, every event at or below a page's watermark must have been in that page."""
    before = watermark(provider)
    paid: list[Event] = []
    until = time.monotonic() + PAYING_SECONDS

    def payer() -> None:
        for _ in range(MAX_PAYMENTS_EACH):
            paid.append(pay(provider))
            if time.monotonic() > until:
                return

    snapshots: list[tuple[int, set[str]]] = []
    threads = [threading.Thread(target=payer) for _ in range(PAYERS)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        got = timestamp_page(provider, before)
        snapshots.append((got["finality_watermark"], {e["event_id"] for e in got["events"]}))
    for thread in threads:
        thread.join()
    final = timestamp_page(provider, before)["events"]

    assert len(ours(final, paid)) == len(paid)
    marks = [mark for mark, _ in snapshots]
    assert marks == sorted(marks)
    closed_any = False
    for mark, seen in snapshots:
        closed = {e["event_id"] for e in final if e["timestamp"] <= mark}
        assert closed <= seen, f"events appeared at or below a served watermark {mark}"
        closed_any = closed_any or bool(ours([e for e in final if e["event_id"] in closed], paid))
    assert closed_any, "no page closed any of the payments: the test proved nothing"


# -- feed faults ---------------------------------------------------------------------------------


def test_overlap_repeats_served_events_before_the_cursor(provider: ProviderProcess) -> None:
    start = tail(provider)
    pay(provider)
    pay(provider)
    pay(provider)
    head = cursor_page(provider, start, 2)
    everything_before = cursor_page(provider, "")["events"]
    assert armed(provider) == []

    provider.arm_feed("overlap")
    faulted = cursor_page(provider, head["next_cursor"])
    plain = cursor_page(provider, head["next_cursor"])

    repeated = faulted["events"][: len(faulted["events"]) - len(plain["events"])]
    assert faulted["events"][len(repeated) :] == plain["events"]
    assert faulted["next_cursor"] == plain["next_cursor"]
    assert 1 <= len(repeated) <= 3
    assert repeated[-len(head["events"]) :] == head["events"]
    assert all(event in everything_before for event in repeated)
    assert armed(provider) == []


def test_overlap_on_the_timestamp_feed_repeats_events_at_or_before_after(
    provider: ProviderProcess,
) -> None:
    before = watermark(provider)
    pay(provider)
    pay(provider)
    served = timestamp_page(provider, before)["events"]
    after = served[-1]["timestamp"]
    provider.arm_feed("overlap")

    faulted = timestamp_page(provider, after)
    plain = timestamp_page(provider, after)

    repeated = faulted["events"][: len(faulted["events"]) - len(plain["events"])]
    assert faulted["events"][len(repeated) :] == plain["events"]
    assert 1 <= len(repeated) <= 3
    assert repeated[-1] == served[-1]
    assert all(event["timestamp"] <= after for event in repeated)


def test_overlap_from_the_start_does_not_apply_and_stays_armed(
    provider: ProviderProcess,
) -> None:
    pay(provider)
    provider.arm_feed("overlap")

    from_start = cursor_page(provider, "", 1)  # nothing was served before the start
    everything = timestamp_page(provider, None, 1)  # nor before the beginning of time

    assert from_start["events"] == cursor_page(provider, "", 1)["events"] != []
    assert len(everything["events"]) == 1
    assert armed(provider) == [("overlap", 1)]


def test_stuck_token_with_nothing_pending_does_not_apply_and_stays_armed(
    provider: ProviderProcess,
) -> None:
    pay(provider)
    end = tail(provider)
    provider.arm_feed("stuck_token")

    at_end = cursor_page(provider, end)

    assert at_end == {"events": [], "next_cursor": end}
    assert armed(provider) == [("stuck_token", 1)]


def test_backfill_puts_a_new_event_between_served_positions(provider: ProviderProcess) -> None:
    start = tail(provider)
    first, second = pay(provider), pay(provider)
    served = cursor_page(provider, start)
    declines = provider.counts()["declines"]
    provider.arm_feed("backfill")

    faulted = cursor_page(provider, served["next_cursor"])
    again = cursor_page(provider, start)["events"]

    assert faulted == {"events": [], "next_cursor": served["next_cursor"]}
    assert same_payment(again[0], first) and same_payment(again[2], second)
    new = again[1]
    assert served["events"][0]["position"] < new["position"] < served["events"][1]["position"]
    assert new["event_id"] not in {e["event_id"] for e in served["events"]}
    assert new in cursor_page(provider, "")["events"]  # served to whoever reads from the start
    signed = signed_of(new)
    assert verify(signed, SECRET)
    assert (signed.evidence.outcome, signed.evidence.result.status) == ("failed", 402)
    assert provider.counts()["declines"] == declines + 1
    assert armed(provider) == []


def test_backfill_on_the_timestamp_feed_lands_at_or_before_after(
    provider: ProviderProcess,
) -> None:
    # the new event lands at min(after, watermark): never below the watermark served now
    before = watermark(provider)
    paid = pay(provider)
    known = timestamp_page(provider, before - 1)["events"]
    after = timestamp_of(provider, paid, before)
    provider.arm_feed("backfill")

    faulted = timestamp_page(provider, after)
    plain = timestamp_page(provider, after)
    new = [e for e in timestamp_page(provider, before - 1)["events"] if e not in known]

    assert faulted["events"] == plain["events"]
    assert len(new) == 1 and before <= new[0]["timestamp"] <= after
    signed = signed_of(new[0])
    assert verify(signed, SECRET) and signed.evidence.outcome == "failed"
    assert new[0] not in faulted["events"] + plain["events"]
    assert armed(provider) == []


def test_backfill_on_the_timestamp_feed_waits_for_a_page_near_the_watermark(
    provider: ProviderProcess,
) -> None:
    """A page that reads far back (as an observer's audit does) does not take the fault: a
    backfill lands shortly behind what was served."""
    far_back = watermark(provider) - BACKFILL_REACH - 1
    provider.arm_feed("backfill")

    timestamp_page(provider, far_back)

    assert armed(provider) == [("backfill", 1)]
    timestamp_page(provider, watermark(provider))
    assert armed(provider) == []


def test_empty_advance_gives_a_new_token_for_the_same_position(provider: ProviderProcess) -> None:
    start = tail(provider)
    pending = pay(provider)
    provider.arm_feed("empty_advance", 2)

    faulted = cursor_page(provider, start)
    renamed = faulted["next_cursor"]
    again = cursor_page(provider, renamed)  # the second unit, from the new token
    resumed = cursor_page(provider, again["next_cursor"])
    plain = cursor_page(provider, start)

    assert faulted["events"] == [] and renamed != start
    assert again["events"] == [] and again["next_cursor"] != renamed
    assert resumed == plain
    assert same_payment(plain["events"][0], pending)


def test_empty_advance_from_the_start_skips_nothing(provider: ProviderProcess) -> None:
    provider.arm_feed("empty_advance")

    faulted = cursor_page(provider, "", 1)

    assert faulted["events"] == [] and faulted["next_cursor"] != ""
    assert cursor_page(provider, faulted["next_cursor"], 1) == cursor_page(provider, "", 1)


def test_skip_advance_answers_empty_with_a_token_past_the_waiting_events(
    provider: ProviderProcess,
) -> None:
    start = tail(provider)
    for _ in range(2):
        pay(provider)
    provider.arm_feed("skip_advance")

    skipped = cursor_page(provider, start)

    assert skipped["events"] == [] and skipped["next_cursor"] != start
    assert skipped["next_cursor"] == tail(provider)  # past both payments
    assert cursor_page(provider, skipped["next_cursor"])["events"] == []
    assert len(cursor_page(provider, start)["events"]) == 2
    assert armed(provider) == []


def test_stuck_token_answers_empty_with_the_same_cursor_while_events_wait(
    provider: ProviderProcess,
) -> None:
    start = tail(provider)
    pending = pay(provider)
    provider.arm_feed("stuck_token", 2)

    stuck = [cursor_page(provider, start) for _ in range(2)]
    freed = cursor_page(provider, start)

    assert stuck == [{"events": [], "next_cursor": start}] * 2
    assert same_payment(freed["events"][0], pending)
    assert armed(provider) == []


def test_stuck_token_on_the_timestamp_feed_holds_the_watermark_at_after(
    provider: ProviderProcess,
) -> None:
    before = watermark(provider)
    pending = pay(provider)
    provider.arm_feed("stuck_token")

    stuck = timestamp_page(provider, before)
    freed = timestamp_page(provider, before)

    assert stuck == {"events": [], "finality_watermark": before}
    assert len(ours(freed["events"], [pending])) == 1


def test_conflicting_identity_reports_another_event_at_a_served_position(
    provider: ProviderProcess,
) -> None:
    start = tail(provider)
    below, at, pending = pay(provider), pay(provider), pay(provider)
    served = cursor_page(provider, start, 2)
    provider.arm_feed("conflicting_identity")

    faulted = cursor_page(provider, served["next_cursor"])
    plain = cursor_page(provider, served["next_cursor"])

    clash, *rest = faulted["events"]
    assert rest == plain["events"] and same_payment(rest[0], pending)
    assert clash["position"] == served["events"][1]["position"]
    assert same_payment(served["events"][1], at)
    assert same_payment(clash, below)  # another payment's event_id, evidence and signature
    assert clash["event_id"] != at["event_id"]
    assert faulted["next_cursor"] == plain["next_cursor"]


def test_conflicting_identity_on_the_timestamp_feed_gives_a_served_event_other_evidence(
    provider: ProviderProcess,
) -> None:
    before = watermark(provider)
    earlier, latest = pay(provider), pay(provider)
    after = timestamp_of(provider, latest, before)
    provider.arm_feed("conflicting_identity")

    faulted = timestamp_page(provider, after)
    plain = timestamp_page(provider, after)

    clash, *rest = faulted["events"]
    assert rest == plain["events"]
    assert clash["event_id"] == latest["event_id"] and clash["timestamp"] == after
    assert (clash["evidence"], clash["signature"]) == (earlier["evidence"], earlier["signature"])


@pytest.mark.parametrize("feed", ["cursor", "timestamp"])
def test_bad_signature_corrupts_one_event_of_the_page(provider: ProviderProcess, feed: str) -> None:
    start, before = tail(provider), watermark(provider)
    first, second = pay(provider), pay(provider)
    provider.arm_feed("bad_signature")

    def read() -> list[Event]:
        if feed == "cursor":
            events: list[Event] = cursor_page(provider, start)["events"]
        else:
            events = timestamp_page(provider, before)["events"]
        return events

    faulted, plain = read(), read()

    assert ours(plain, [first, second]) == plain[-2:]
    assert faulted[1:] == plain[1:]
    bad, good = faulted[0], plain[0]
    assert (bad["event_id"], bad["evidence"]) == (good["event_id"], good["evidence"])
    assert bad["signature"] != good["signature"] and HEX64.fullmatch(bad["signature"])
    assert not verify(signed_of(bad), SECRET)
    assert verify(signed_of(good), SECRET)


def test_page_cap_cuts_the_page_silently_below_the_limit(provider: ProviderProcess) -> None:
    before = watermark(provider)
    paid = [pay(provider) for _ in range(PAGE_CAP_EVENTS + 1)]
    provider.arm_feed("page_cap")

    capped = timestamp_page(provider, before)
    plain = timestamp_page(provider, before)

    assert len(ours(plain["events"], paid)) == len(paid)
    assert capped["events"] == plain["events"][:PAGE_CAP_EVENTS]
    assert isinstance(capped["finality_watermark"], int)  # as if the page were whole
    assert capped["finality_watermark"] >= max(e["timestamp"] for e in plain["events"]) - 1
    assert armed(provider) == []


def test_page_cap_on_a_short_page_does_not_apply_and_stays_armed(provider: ProviderProcess) -> None:
    before = watermark(provider)
    [pay(provider) for _ in range(PAGE_CAP_EVENTS + 1)]
    provider.arm_feed("page_cap")

    served = timestamp_page(provider, before, PAGE_CAP_EVENTS)

    assert len(served["events"]) == PAGE_CAP_EVENTS
    assert armed(provider) == [("page_cap", 1)]


def test_lying_watermark_is_ahead_and_the_next_payment_lands_below_it(
    provider: ProviderProcess,
) -> None:
    true = watermark(provider)
    provider.arm_feed("lying_watermark")

    lie = watermark(provider)
    late = pay(provider)
    honest = watermark(provider)

    assert lie >= true + WATERMARK_LIE
    assert timestamp_of(provider, late, true - 1) <= lie  # the promise broken
    assert honest < lie  # the lie is not remembered as served
    assert armed(provider) == []


def test_late_tie_commits_an_event_at_a_served_watermark(provider: ProviderProcess) -> None:
    closed = watermark(provider)
    provider.arm_feed("late_tie")

    late = pay(provider)

    assert timestamp_of(provider, late, closed - 1) == closed
    assert ours(timestamp_page(provider, closed)["events"], [late]) == []
    assert armed(provider) == []


def test_feed_fault_control_validates_its_input(provider: ProviderProcess) -> None:
    url = f"{provider.base_url}/_sim/feed-faults"
    for bad in (
        {"mode": "explode", "count": 1},
        {"mode": "overlap", "count": 0},
        {"mode": "overlap", "count": MAX_FAULT_COUNT + 1},
        {"mode": "overlap"},
        {"mode": "overlap", "count": 1, "delay_ms": 5},
        {"count": 1},
    ):
        response = httpx.post(url, json=bad, timeout=CALL_TIMEOUT)
        assert response.status_code == 400, (bad, response.text)
    assert httpx.post(url, content=b"not json", timeout=CALL_TIMEOUT).status_code == 400
    assert armed(provider) == []

    most = {"mode": "bad_signature", "count": MAX_FAULT_COUNT}
    assert httpx.post(url, json=most, timeout=CALL_TIMEOUT).json() == {"armed": [most]}
    assert provider.arm_feed("big_tie", 2) == [most, {"mode": "big_tie", "count": 2}]
    assert httpx.delete(url, timeout=CALL_TIMEOUT).json() == {"armed": []}


# -- restarts and old files ----------------------------------------------------------------------


def test_a_restart_keeps_positions_timestamps_and_tokens(tmp_path: Path) -> None:
    db_path = tmp_path / "provider.sqlite3"
    with ProviderProcess(db_path) as first:
        assert cursor_page(first, "") == {"events": [], "next_cursor": ""}
        empty = timestamp_page(first, None)
        assert empty["events"] == [] and isinstance(empty["finality_watermark"], int)
        for _ in range(3):
            pay(first)
        tokens_before = [cursor_page(first, "", n)["next_cursor"] for n in (1, 2, 3)]
        cursor_before = cursor_page(first, "")
        timestamp_before = timestamp_page(first, None)
        mark_before = watermark(first)

    with ProviderProcess(db_path) as second:
        tokens_after = [cursor_page(second, "", n)["next_cursor"] for n in (1, 2, 3)]
        assert tokens_after == tokens_before
        assert cursor_page(second, "") == cursor_before
        assert timestamp_page(second, None)["events"] == timestamp_before["events"]
        new = pay(second)
        after_restart = cursor_page(second, cursor_before["next_cursor"])
        assert len(after_restart["events"]) == 1 and same_payment(after_restart["events"][0], new)
        assert after_restart["events"][0]["position"] > cursor_before["events"][-1]["position"]
        assert timestamp_of(second, new, mark_before) > mark_before
