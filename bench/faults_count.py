"""What the fault bench counts (``python -m bench.faults``): the database's word on what each
key did (the ground truth), and the answers' word on what each client learnt.

From the database (one run's own database, SQL on ``operations``, ``transfers`` and
``accounts``): the transfer rows of each key. The server's operation row holds the key itself
(its scope is unique); a peer's holds ``<Idempotency-Key>/<operation id>``, one row per
execution (``bench.peer_transfer``), so the key is the part before the first ``/`` in both
(the bench's keys hold no ``/``). A key whose intended action moved money more than once has
more than one transfer row. The accounts say how much money left the sources and reached the
destinations: it must equal the transfers' sum (a ledger that disagrees is reported).

From the answers: the status of each key's first request, of its retry and, for a key whose
retry got no definitive answer, of its late retry (``0`` when no answer came: the connection
was reset or closed, or the request timed out). An answer is **definitive** when it is a 2xx
or a problem that closes the request: a 4xx other than 408, 409, 425 and 429 (those four say
"not now, ask again": in progress, conflict with a request in flight, too early, too many).
A key's **final answer** is its last retry's. An **answer lost** is a key whose final answer
is not definitive (no answer, a 5xx, or one of those four 4xx): its client does not know
whether its money moved. It is split by what the database says: lost with the transfer made
(money moved, the client was not told) and lost without it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from bench.fixtures import BALANCE, TENANT

__all__ = [
    "NOT_YET",
    "Figures",
    "Ledger",
    "definitive",
    "ledger",
    "tally",
    "transfers_by_key",
]

# 4xx answers that say "not now, ask again", never what became of the request.
NOT_YET = frozenset({408, 409, 425, 429})

_TRANSFERS_BY_KEY = """
SELECT split_part(o.idempotency_key, '/', 1) AS key, count(t.id) AS transfers
  FROM operations o JOIN transfers t ON t.operation_id = o.id
 WHERE o.tenant = $1 AND o.route = $2
 GROUP BY 1
"""
_LEDGER = """
SELECT coalesce(sum($2::bigint - balance) FILTER (WHERE balance < $2), 0) AS left_sources,
       coalesce(sum(balance - $2::bigint) FILTER (WHERE balance > $2), 0) AS reached,
       (SELECT coalesce(sum(amount), 0) FROM transfers WHERE tenant = $1) AS transferred
  FROM accounts WHERE tenant = $1
"""


def definitive(status: int) -> bool:
    """Whether an answer tells its client what became of the request."""
    return 200 <= status < 300 or (400 <= status < 500 and status not in NOT_YET)


async def transfers_by_key(database_url: str, route: str) -> dict[str, int]:
    """Transfer rows per key of ``route``'s operations (keys without one are absent)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(_TRANSFERS_BY_KEY, TENANT, route)
    finally:
        await conn.close()
    return {str(row["key"]): int(row["transfers"]) for row in rows}


@dataclass(frozen=True)
class Ledger:
    """Money moved, by the accounts (every account started at ``BALANCE``) and by the
    transfer rows."""

    left_sources: int
    reached_destinations: int
    transferred: int

    @property
    def agrees(self) -> bool:
        return self.left_sources == self.reached_destinations == self.transferred


async def ledger(database_url: str) -> Ledger:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(_LEDGER, TENANT, BALANCE)
    finally:
        await conn.close()
    assert row is not None
    return Ledger(int(row["left_sources"]), int(row["reached"]), int(row["transferred"]))


@dataclass(frozen=True)
class Figures:
    """One system under one fault. Counts of keys unless named otherwise."""

    keys_sent: int
    transfers_made: int  # transfer rows of the keys sent
    keys_moved: int  # keys with at least one transfer
    keys_moved_twice: int  # keys with more than one transfer
    extra_transfers: int  # transfer rows beyond the first of each key
    answers_lost: int  # by the final answer
    lost_with_transfer: int
    lost_without_transfer: int
    lost_at_retry: int  # by the retry's answer, before the late retry
    told_but_not_moved: int  # a 2xx final answer, no transfer row: must be 0
    first_no_answer: int  # first requests that got no answer (the fault's own doing)
    first_5xx: int
    retry_5xx: int  # 5xx answers to the retries and the late retries
    first_statuses: dict[str, int]
    retry_statuses: dict[str, int]
    late_statuses: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tally(
    keys: Iterable[str],
    first: Mapping[str, int],
    retry: Mapping[str, int],
    transfers: Mapping[str, int],
    late: Mapping[str, int] | None = None,
) -> Figures:
    """The figures of one run: ``first``, ``retry`` and ``late`` (the late retries, of some
    keys) are each key's answer status (0: none), ``transfers`` its transfer rows (absent:
    none)."""
    sent = list(keys)
    late = late or {}
    final = {**retry, **late}
    made = [transfers.get(key, 0) for key in sent]
    lost = [key for key in sent if not definitive(final.get(key, 0))]
    return Figures(
        keys_sent=len(sent),
        transfers_made=sum(made),
        keys_moved=sum(1 for n in made if n > 0),
        keys_moved_twice=sum(1 for n in made if n > 1),
        extra_transfers=sum(n - 1 for n in made if n > 1),
        answers_lost=len(lost),
        lost_with_transfer=sum(1 for key in lost if transfers.get(key, 0) > 0),
        lost_without_transfer=sum(1 for key in lost if transfers.get(key, 0) == 0),
        lost_at_retry=sum(1 for key in sent if not definitive(retry.get(key, 0))),
        told_but_not_moved=sum(
            1 for key in sent if 200 <= final.get(key, 0) < 300 and transfers.get(key, 0) == 0
        ),
        first_no_answer=sum(1 for key in sent if first.get(key, 0) == 0),
        first_5xx=sum(1 for key in sent if first.get(key, 0) >= 500),
        retry_5xx=sum(1 for answers in (retry, late) for key in answers if answers[key] >= 500),
        first_statuses=_statuses(first.get(key, 0) for key in sent),
        retry_statuses=_statuses(retry.get(key, 0) for key in sent),
        late_statuses=_statuses(late.values()),
    )


def _statuses(statuses: Iterable[int]) -> dict[str, int]:
    """How many of each status (``"none"``: no answer), in status order."""
    counts = Counter(statuses)
    return {("none" if s == 0 else str(s)): counts[s] for s in sorted(counts)}
