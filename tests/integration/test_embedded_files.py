"""The development stack keeps its files to itself: no directory of anybody else's is opened
to the cluster's user, the cluster lives in a directory of that user's, and secrets and the
provider simulator's payments are readable by their owner only."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import stat
from pathlib import Path

import asyncpg
import pytest

from devstack import SYSTEM_USER, EmbeddedPostgres
from devstack.provider.store import PaymentStore

pytestmark = pytest.mark.integration

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the cluster's own user exists as root only")


def _modes(paths: list[Path]) -> dict[str, int]:
    return {str(path): path.lstat().st_mode for path in paths}


def _install_tree() -> list[Path]:
    """The wheel's PostgreSQL install, every entry, and the directories above it."""
    install = EmbeddedPostgres.bin_dir().parent
    tree = [Path(root, name) for root, dirs, files in os.walk(install) for name in dirs + files]
    return [*install.parents, install, *tree]


def _query(postgres: EmbeddedPostgres, sql: str) -> list[tuple[object, ...]]:
    async def run() -> list[tuple[object, ...]]:
        conn = await asyncpg.connect(postgres.url.replace("+asyncpg", ""))
        try:
            if ";" in sql:
                await conn.execute(sql)
                return []
            return [tuple(row) for row in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(run())


def test_no_directory_of_anybody_elses_is_opened_to_the_cluster(tmp_path: Path) -> None:
    """A data directory under a directory others cannot pass (as /root is): the cluster
    starts, and no mode changed above the data directory or in the virtualenv."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    data_dir = private / "data"
    watched = [*data_dir.parents, *_install_tree()]
    before = _modes(watched)

    postgres = EmbeddedPostgres(data_dir, durable=False)
    postgres.start()
    try:
        assert _query(postgres, "SELECT 1") == [(1,)]
    finally:
        postgres.stop()

    assert _modes(watched) == before
    if os.geteuid() == 0:
        link = data_dir / "postgres"
        assert link.is_symlink()
        cluster = link.resolve().stat()
        assert cluster.st_uid == pwd.getpwnam(SYSTEM_USER).pw_uid
        assert stat.S_IMODE(cluster.st_mode) == 0o700


@as_root
def test_the_cluster_of_a_deleted_data_directory_goes_at_the_next_start(tmp_path: Path) -> None:
    gone = EmbeddedPostgres(tmp_path / "gone", durable=False)
    gone.start()
    gone.stop()
    gone_cluster = (tmp_path / "gone" / "postgres").resolve()
    running = EmbeddedPostgres(tmp_path / "running", durable=False)
    running.start()
    try:
        running_cluster = (tmp_path / "running" / "postgres").resolve()
        shutil.rmtree(tmp_path / "gone")
        shutil.rmtree(tmp_path / "running")  # its server still runs: its cluster stays

        postgres = EmbeddedPostgres(tmp_path / "next", durable=False)
        postgres.start()
        try:
            assert _query(postgres, "SELECT 1") == [(1,)]
        finally:
            postgres.stop()
        assert not gone_cluster.exists()
        assert running_cluster.is_dir()
        assert _query(running, "SELECT 1") == [(1,)]
    finally:
        running.stop()


@as_root
def test_a_cluster_an_earlier_run_made_in_the_data_directory_moves_with_its_data(
    tmp_path: Path,
) -> None:
    postgres = EmbeddedPostgres(tmp_path, durable=False)
    postgres.start()
    _query(postgres, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
    postgres.stop()
    # what the data directory looked like before: the cluster in it, not a link
    link = tmp_path / "postgres"
    cluster = link.resolve()
    link.unlink()
    shutil.move(cluster, link)

    again = EmbeddedPostgres(tmp_path, durable=False)
    again.start()
    try:
        assert _query(again, "SELECT v FROM kept") == [("still here",)]
    finally:
        again.stop()
    assert link.is_symlink()


def test_the_simulators_payments_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "provider.sqlite3"
    with PaymentStore.open(path):
        files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
        assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {
            f.name: "0o600" for f in files
        }


def test_payment_files_an_earlier_run_left_open_are_narrowed(tmp_path: Path) -> None:
    path = tmp_path / "provider.sqlite3"
    with PaymentStore.open(path):
        pass
    files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    for f in files:
        f.touch()
        f.chmod(0o644)
    with PaymentStore.open(path):
        assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {
            f.name: "0o600" for f in files
        }
