"""A migration's DDL gives way to a long reader (service.store.online_ddl.briefly): while it
waits for the table's lock, a server's statements on the table are not queued behind it for
longer than its short lock wait, and it goes through once the reader ends."""

from __future__ import annotations

import threading

import psycopg
from sqlalchemy.engine import make_url

from service.store.migrate import upgrade
from tests.conftest import Services, fresh_database
from tests.e2e.client import until

# a server's statement bound here: above the DDL's lock wait (500 ms), below a queue's length
STATEMENT_TIMEOUT = "2s"

WAITING = """SELECT count(*) FROM pg_locks
             WHERE relation = 'operations'::regclass AND mode = 'AccessExclusiveLock'
               AND NOT granted"""


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_0017_gives_way_to_a_long_reader_and_goes_through_after_it(services: Services) -> None:
    url = fresh_database(services, "online_ddl")
    upgrade(url, "0016")
    dsn = _dsn(url)
    migrating = threading.Thread(target=upgrade, args=(url, "0017"))
    with (
        psycopg.connect(dsn) as reader,
        psycopg.connect(dsn, autocommit=True) as server,
    ):
        reader.execute("SELECT count(*) FROM operations").fetchone()  # holds its lock
        migrating.start()
        until(lambda: server.execute(WAITING).fetchone()[0], "0017 asks for the table's lock")
        server.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        for _ in range(5):  # a server's one-row reads go on meanwhile
            server.execute("SELECT 1 FROM operations WHERE id = gen_random_uuid()")
        assert migrating.is_alive()  # still giving way
        reader.rollback()  # the reader ends
        migrating.join(30)
        assert not migrating.is_alive()
        column = server.execute(
            "SELECT col_description('operations'::regclass, attnum) FROM pg_attribute "
            "WHERE attrelid = 'operations'::regclass AND attname = 'canonical_request'"
        ).fetchone()
        assert column is not None and column[0].startswith("What the request fingerprint")
