"""Embedded PostgreSQL and Redis start for real, answer, stop cleanly, never outlive their owner."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psutil
import pytest
import redis

from devstack import (
    SYSTEM_USER,
    EmbeddedPostgres,
    EmbeddedServiceError,
    EmbeddedServices,
    ServerInUseError,
    ServiceEndpoints,
)
from devstack.ownership import OwnedServer

pytestmark = pytest.mark.integration

# The owner's servers must be gone this soon after the owner is killed.
GONE_TIMEOUT = 10.0
# A child owner runs initdb and starts both servers before it reports.
OWNER_START_TIMEOUT = 60.0
# A SIGINT'd owner stops both servers in order; well under a second in practice.
OWNER_EXIT_TIMEOUT = 30.0

# The owner is a shell job: a shell gives its foreground job the default SIGINT. A child
# inherits an ignored SIGINT, and something earlier in the suite leaves the test process
# ignoring SIGINT and SIGQUIT (seen under coverage after the e2e tests), so it is reset here.
OWNER = """
import json, signal, sys, time
from pathlib import Path
from devstack import EmbeddedServices

signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with EmbeddedServices(Path(sys.argv[1]), durable=False) as services:
        assert services.postgres is not None and services.redis is not None
        print(json.dumps({
            "postgres_pid": services.postgres.pid,
            "postgres_port": services.postgres.port,
            "postgres_url": services.postgres.url,
            "redis_pid": services.redis.pid,
            "redis_port": services.redis.port,
        }), flush=True)
        time.sleep(120)
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _cluster_pids(pgdata: Path) -> set[int]:
    """Live processes of the cluster: the postmaster, its helpers and backends (as root,
    ``data_dir/postgres`` links to the cluster, where they run)."""
    cluster = str(pgdata.resolve())
    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == cluster and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def _mentioning(path: Path) -> set[int]:
    """Live processes whose command line names ``path``."""
    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and any(str(path) in arg for arg in proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _query(url: str, sql: str) -> list[Any]:
    """Rows of one query, or [] after running a script of several statements."""

    async def run() -> list[Any]:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            if ";" in sql:
                await conn.execute(sql)
                return []
            return [tuple(row) for row in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(run())


def _busy_client(url: str) -> subprocess.Popen[bytes]:
    """A psql session whose backend sits in a long query."""
    psql = EmbeddedPostgres.bin_dir() / "psql"
    parts = urlsplit(url)
    assert parts.password is not None
    client = subprocess.Popen(
        [
            *(str(psql), "-X", "-w", "-h", "127.0.0.1", "-p", str(parts.port)),
            *("-U", "postgres", "-d", "settlement", "-c", "SELECT pg_sleep(60)"),
        ],
        env={**os.environ, "PGPASSWORD": parts.password},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    busy = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'"
    assert _wait_until(lambda: _query(url, busy) == [(1,)], 10)
    return client


@contextmanager
def _owner(data_dir: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """A child Python process that starts the services and sleeps inside the ``with``."""
    stderr_path = data_dir.parent / f"{data_dir.name}.owner.err"
    with stderr_path.open("w") as stderr:
        owner = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group, as a shell job would have
        )
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], OWNER_START_TIMEOUT)
        line = owner.stdout.readline() if ready else ""
        assert line, f"owner did not start:\n{stderr_path.read_text()}"
        yield owner, json.loads(line)
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


def test_services_answer_then_stop_leaves_nothing_running(tmp_path: Path) -> None:
    with EmbeddedServices(tmp_path, durable=False) as services:
        assert services.postgres is not None and services.redis is not None
        pg_port, redis_port = services.postgres.port, services.redis.port
        pids = [services.postgres.pid, services.redis.pid]
        password = services.postgres.password_file.read_text().strip()
        assert services.database_url == (
            f"postgresql+asyncpg://postgres:{password}@127.0.0.1:{pg_port}/settlement"
        )
        redis_password = urlsplit(services.redis_url).password
        assert redis_password
        assert services.redis_url == f"redis://:{redis_password}@127.0.0.1:{redis_port}/0"
        assert services.endpoints(redis_url="redis://elsewhere:6379/0") == ServiceEndpoints(
            database_url=services.database_url, redis_url="redis://elsewhere:6379/0"
        )

        assert _query(services.database_url, "SELECT 1") == [(1,)]
        client = redis.Redis.from_url(services.redis_url, socket_timeout=2)
        try:
            assert client.ping() is True
        finally:
            client.close()

    assert not any(_running(pid) for pid in pids)
    assert not _cluster_pids(services.postgres.pgdata)
    assert not _port_open(pg_port)
    assert not _port_open(redis_port)
    services.stop()  # a second stop is harmless


def test_servers_go_away_when_their_owner_is_killed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    pgdata = data_dir / "postgres"
    with _owner(data_dir) as (owner, info):
        client = _busy_client(info["postgres_url"])
        cluster = _cluster_pids(pgdata)
        assert info["postgres_pid"] in cluster and len(cluster) > 2  # helpers and a backend

        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()

        watched = cluster | {info["redis_pid"]}
        assert _wait_until(lambda: not any(_running(pid) for pid in watched), GONE_TIMEOUT)
        assert _wait_until(lambda: not _mentioning(data_dir), GONE_TIMEOUT)
        assert not _cluster_pids(pgdata)
        assert client.wait(GONE_TIMEOUT) != 0  # its backend was terminated
        assert not _port_open(info["postgres_port"])
        assert not _port_open(info["redis_port"])
    # Even so, PostgreSQL shut down cleanly (fast shutdown is its parent-death signal).
    assert "database system is shut down" in (data_dir / "postgres.log").read_text()


def test_ctrl_c_on_the_owner_stops_servers_cleanly(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with _owner(data_dir) as (owner, info):
        os.killpg(owner.pid, signal.SIGINT)  # what a terminal sends its foreground job
        assert owner.wait(OWNER_EXIT_TIMEOUT) == 0
        assert owner.stdout is not None
        assert owner.stdout.read().strip() == "stopped"

        # stop() waited for both, so they are gone the moment the owner is.
        assert not _running(info["postgres_pid"])
        assert not _running(info["redis_pid"])
        assert not _cluster_pids(data_dir / "postgres")
        assert not _mentioning(data_dir)
    assert "database system is shut down" in (data_dir / "postgres.log").read_text()
    assert "ready to exit" in (data_dir / "redis" / "redis-server.log").read_text()


def test_restart_on_a_durable_data_dir_keeps_data(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path, durable=True)
    postgres.start()
    _query(postgres.url, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
    postgres.stop()
    postgres.stop()

    again = EmbeddedPostgres(tmp_path, durable=True)
    again.start()
    try:
        assert _query(again.url, "SELECT v FROM kept") == [("still here",)]
    finally:
        again.stop()


def test_start_after_the_server_was_killed_recovers(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path, durable=False)
    postgres.start()
    _query(postgres.url, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
    os.kill(postgres.pid, signal.SIGKILL)
    postgres.stop()
    assert (postgres.pgdata / "postmaster.pid").exists()

    again = EmbeddedPostgres(tmp_path, durable=False)
    again.start()
    try:
        assert _query(again.url, "SELECT v FROM kept") == [(7,)]
    finally:
        again.stop()


def test_start_ignores_a_pid_file_naming_an_unrelated_live_process(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path, durable=False)
    postgres.start()
    postgres.stop()
    # Run as the server's user: PostgreSQL itself ignores a pid it may not signal.
    user = SYSTEM_USER if os.geteuid() == 0 else None
    unrelated = subprocess.Popen(["sleep", "60"], user=user)
    try:
        # What a reboot or container restart leaves: the old pid now belongs to another program.
        (postgres.pgdata / "postmaster.pid").write_text(f"{unrelated.pid}\n{postgres.pgdata}\n")
        postgres.start()
        try:
            assert _query(postgres.url, "SELECT 1") == [(1,)]
        finally:
            postgres.stop()
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait()


def test_a_live_owners_server_is_used_and_left_running(tmp_path: Path) -> None:
    """A second start on the data directory while its owner lives (``settlement migrate
    --embedded`` beside ``serve --embedded``) uses the owner's server; stopping it stops
    nothing."""
    data_dir = tmp_path / "data"
    with _owner(data_dir) as (owner, info):
        cluster = _cluster_pids(data_dir / "postgres")
        with EmbeddedServices(data_dir, durable=False) as services:
            assert services.postgres is not None and services.redis is not None
            assert not services.postgres.owned and not services.redis.owned
            assert services.postgres.pid == info["postgres_pid"]
            assert services.redis.pid == info["redis_pid"]
            assert services.database_url == info["postgres_url"]
            assert _query(services.database_url, "SELECT 1") == [(1,)]
            client = redis.Redis.from_url(services.redis_url, socket_timeout=2)
            try:
                assert client.ping() is True
            finally:
                client.close()
        assert owner.poll() is None
        assert _cluster_pids(data_dir / "postgres") >= cluster
        assert _running(info["redis_pid"])
        assert _query(info["postgres_url"], "SELECT 1") == [(1,)]
    assert "leftover" not in (data_dir.parent / f"{data_dir.name}.owner.err").read_text()


def test_a_server_that_must_be_ours_is_refused_while_another_owner_lives(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with _owner(data_dir) as (owner, info):
        services = EmbeddedServices(data_dir, durable=False, share=False)
        with pytest.raises(ServerInUseError, match=f"pid {owner.pid}"):
            services.start()
        assert _running(info["postgres_pid"]) and _running(info["redis_pid"])
        assert _query(info["postgres_url"], "SELECT 1") == [(1,)]


def test_a_dead_owners_leftover_is_stopped_at_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The owner is SIGKILLed while its PostgreSQL cannot act on its death signal yet
    (stopped): nobody holds the lock, so the next start stops the leftover."""
    data_dir = tmp_path / "data"
    with _owner(data_dir) as (owner, info):
        leftover = _cluster_pids(data_dir / "postgres")
        os.kill(info["postgres_pid"], signal.SIGSTOP)
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        assert _running(info["postgres_pid"])
        postgres = EmbeddedPostgres(data_dir, durable=False)
        with caplog.at_level("WARNING", logger="settlement.embedded"):
            postgres.start()
        try:
            assert postgres.owned
            assert not any(_running(pid) for pid in leftover)
            assert postgres.pid != info["postgres_pid"]
            assert _query(postgres.url, "SELECT 1") == [(1,)]
        finally:
            postgres.stop()
    assert "stopping a leftover PostgreSQL" in caplog.text


def test_the_watcher_tells_when_a_server_we_run_dies(tmp_path: Path) -> None:
    died: list[tuple[str, int]] = []
    told = threading.Event()

    def on_exit(server: OwnedServer, code: int) -> None:
        died.append((server.name, code))
        told.set()

    with EmbeddedServices(tmp_path, durable=False) as services:
        assert services.postgres is not None
        services.watch(on_exit)
        os.kill(services.postgres.pid, signal.SIGKILL)
        assert told.wait(GONE_TIMEOUT)
    assert died == [("PostgreSQL", -signal.SIGKILL)]


def test_the_watcher_is_quiet_when_the_servers_are_stopped(tmp_path: Path) -> None:
    died: list[str] = []
    with EmbeddedServices(tmp_path, durable=False) as services:
        services.watch(lambda server, code: died.append(server.name))
    assert died == []


def test_start_from_another_thread_is_refused(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            EmbeddedServices(tmp_path, durable=False).start()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=start)
    worker.start()
    worker.join()
    assert len(errors) == 1 and isinstance(errors[0], EmbeddedServiceError)
    assert not (tmp_path / "postgres").exists()


def test_an_unwanted_service_is_not_started_and_has_no_url(tmp_path: Path) -> None:
    with EmbeddedServices(tmp_path, want_postgres=False, durable=False) as services:
        assert services.postgres is None
        with pytest.raises(EmbeddedServiceError):
            _ = services.database_url
        assert services.endpoints(database_url="postgresql+asyncpg://db/x").redis_url == (
            services.redis_url
        )
    assert not (tmp_path / "postgres").exists()
