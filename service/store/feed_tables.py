"""The feed observer's tables (docs/design.md §8), on the store's metadata
(:mod:`service.store.tables`): the schema, ``service.app.routes.SCHEMA``, is both.

They stay local to the coordinator on Citus (docs/scaling.md): a feed is the provider's, not
a tenant's, and one observer reads it.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    LargeBinary,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import UUID

from service.store.tables import citus, metadata, one_of

__all__ = [
    "FEED_KINDS",
    "RECEIPT_STATES",
    "feed_alarms",
    "feed_checkpoints",
    "feed_promotions",
    "feed_receipts",
    "metadata",
]

FEED_KINDS = ("cursor", "timestamp")
RECEIPT_STATES = ("applied", "ignored", "quarantined", "held")

feed_checkpoints = Table(
    "feed_checkpoints",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    # cursor feeds: the cursor to ask with next ('' is the start), and the highest position
    # every event up to which has a final receipt
    Column("resume_cursor", Text, nullable=False, server_default=text("''")),
    Column("applied_position", BigInteger),
    # timestamp feeds: every event at or before it has a final receipt
    Column("closed_through_timestamp", BigInteger),
    Column("version", BigInteger, nullable=False, server_default=text("1")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # the last time a page came back with nothing new (the observer was caught up)
    Column("caught_up_at", DateTime(timezone=True)),
    # where the walk behind the checkpoint reads next (NULL: a new walk): the cursor of a
    # cursor feed's reconciliation pass, the ``after`` of a timestamp feed's audit (-1: the
    # feed's start); progress markers, moved without the version
    Column("walk_cursor", Text),
    Column("walk_after", BigInteger),
    # cursor feeds: the cursor a page was last promoted to ('' the feed's start, written when
    # the row is made); an empty page's adopted token moves ``resume_cursor`` only, never this.
    # An observer's reconciliation passes start from it (NULL: a row written before
    # migration 0013, whose ``resume_cursor`` stands in)
    Column("promoted_cursor", Text),
    CheckConstraint(one_of("kind", FEED_KINDS), name="kind"),
    CheckConstraint("version >= 1", name="version"),
    info=citus("local"),
)

# a cursor feed's checkpoint was promoted to applied_position at promoted_at (its first
# promotion there: written with the CAS that won it); the retention purge takes a receipt of a
# no-backfill feed only once the checkpoint has been past it for the retention
# (docs/design.md §9)
feed_promotions = Table(
    "feed_promotions",
    metadata,
    Column("feed", String(64), primary_key=True),
    Column("applied_position", BigInteger, primary_key=True),
    Column("promoted_at", DateTime(timezone=True), nullable=False),
    Index("ix_feed_promotions_feed_promoted_at", "feed", "promoted_at"),
    info=citus("local"),
)

feed_receipts = Table(
    "feed_receipts",
    metadata,
    Column("feed", String(64), primary_key=True),
    Column("event_id", String(255), primary_key=True),
    # the event's place in its feed: a position (cursor feeds) or a timestamp (timestamp feeds)
    Column("event_order", BigInteger, nullable=False),
    Column("operation_id", UUID(as_uuid=True)),
    Column("state", String(16), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("observation_id", BigInteger),
    # SHA-256 of the event's evidence and signature as served: the same event id served
    # again with other content is a conflicting identity
    Column("digest", String(64), nullable=False, server_default=text("''")),
    Column("first_seen_at", DateTime(timezone=True), nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=False),
    # the event as served (its evidence bytes and signature), kept while it is held so the
    # hold can be decided again whether or not the feed serves it again; cleared when final
    Column("evidence", LargeBinary),
    Column("signature", String(256)),
    # false once an operator accepted a conflicting identity of the event: its outcome
    # stays, its place and content are no longer held against what the feed serves, until
    # a page that passes serves the event: true again, at the place and content served
    Column("pinned", Boolean, nullable=False, server_default=text("true")),
    CheckConstraint(one_of("state", RECEIPT_STATES), name="state"),
    info=citus("local"),
)
Index("ix_feed_receipts_feed_event_order", feed_receipts.c.feed, feed_receipts.c.event_order)
# the retention purge looks for the receipts decided longest ago (without reading the young)
Index("ix_feed_receipts_decided_at", feed_receipts.c.decided_at)
# the console's operation page lists the receipts that touched one operation
Index("ix_feed_receipts_operation_id", feed_receipts.c.operation_id)
Index("ix_feed_receipts_held", feed_receipts.c.feed, postgresql_where=text("state = 'held'"))

feed_alarms = Table(
    "feed_alarms",
    metadata,
    Column("feed", String(64), primary_key=True),
    Column("kind", String(32), primary_key=True),
    # the event it is about ('' for the feed as a whole): one row per (feed, kind, event)
    Column("event_id", String(255), primary_key=True),
    Column("detail", Text, nullable=False),
    # where the page served the event, for a conflicting identity (its acceptance unpins
    # the receipt holding that place too)
    Column("event_order", BigInteger),
    Column("count", BigInteger, nullable=False, server_default=text("1")),
    Column("first_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    info=citus("local"),
)
