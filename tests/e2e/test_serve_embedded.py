"""`settlement serve --embedded`: real PostgreSQL and Redis as children, none left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import psutil
import pytest

from tests.e2e.server import START_TIMEOUT, STOP_TIMEOUT, free_port

pytestmark = pytest.mark.e2e

# The embedded servers must be gone this soon after the server process is.
ORPHAN_GRACE = 10.0
REPO = Path(__file__).resolve().parents[2]


def _start(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Serve on ``data_dir``; its stdout and stderr go to ``_output(data_dir)``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLEMENT_")}
    env["SETTLEMENT_DATA_DIR"] = str(data_dir)
    port = free_port()
    output = _output(data_dir)
    with output.open("ab") as sink:
        proc = _spawn(env, port, sink)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT * 2
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"server exited during start:\n{output.read_text()}"
            try:
                response = httpx.get(f"{base}/health", timeout=1.0)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            assert response.status_code == 200
            assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}
            _RUNNING.append(proc)
            return proc, base
        raise AssertionError(f"embedded server did not become healthy:\n{output.read_text()}")
    except BaseException:
        _stop(proc)
        raise


def _output(data_dir: Path) -> Path:
    """Where the server started on ``data_dir`` writes its stdout and stderr."""
    return data_dir.with_name(data_dir.name + ".serve.out")


def _spawn(env: dict[str, str], port: int, sink: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--embedded",
            "--port",
            str(port),
            "--provider-port",
            str(free_port()),
        ],
        env=env,
        cwd=REPO,
        stdout=sink,
        stderr=sink,
    )


_RUNNING: list[subprocess.Popen[bytes]] = []


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def _no_server_outlives_its_test() -> Iterator[None]:
    yield
    while _RUNNING:
        _stop(_RUNNING.pop())


def _servers_of(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The processes the server started (PostgreSQL with its backends, Redis, provider)."""
    return psutil.Process(proc.pid).children(recursive=True)


def _assert_all_servers_running(children: list[psutil.Process]) -> None:
    lines = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            lines.append(" ".join(child.cmdline()))
    running = " ".join(lines)
    for name in ("postgres", "redis-server", "devstack.provider", "observer run --feed payments"):
        assert name in running, f"{name} was not found running"


def _wait_gone(children: list[psutil.Process]) -> list[psutil.Process]:
    deadline = time.monotonic() + ORPHAN_GRACE
    left = children
    while time.monotonic() < deadline:
        left = []
        for child in children:
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    left.append(child)
            except psutil.NoSuchProcess:
                pass
        if not left:
            return []
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stop_signal_stops_embedded_services_cleanly(tmp_path: Path, sig: int) -> None:
    proc, _ = _start(tmp_path)
    children = _servers_of(proc)
    _assert_all_servers_running(children)
    proc.send_signal(sig)
    assert proc.wait(STOP_TIMEOUT) == 0
    assert _wait_gone(children) == []
    assert "database system is shut down" in (tmp_path / "postgres.log").read_text()


def test_sigkill_of_the_server_leaves_no_orphans(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path)
    children = _servers_of(proc)
    _assert_all_servers_running(children)
    proc.kill()
    proc.wait(STOP_TIMEOUT)
    assert _wait_gone(children) == []


def test_data_survives_a_restart_of_the_embedded_server(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(STOP_TIMEOUT) == 0
    proc, base = _start(tmp_path)  # the migrated cluster is reused, not re-initialised
    children = _servers_of(proc)
    try:
        assert httpx.get(f"{base}/health").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(STOP_TIMEOUT)
    assert _wait_gone(children) == []


def test_the_embedded_passwords_stay_out_of_every_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc, base = _start(data_dir)
    children = _servers_of(proc)
    redis_config = (data_dir / "redis" / "redis.conf").read_text()
    passwords = [
        (data_dir / "postgres.password").read_text().strip(),
        redis_config.removeprefix("requirepass ").strip(),
    ]
    assert all(passwords) and redis_config.startswith("requirepass ")
    assert httpx.get(f"{base}/health").status_code == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(STOP_TIMEOUT) == 0
    assert _wait_gone(children) == []

    output = _output(data_dir)
    logs = [output, data_dir / "postgres.log", data_dir / "redis" / "redis-server.log"]
    assert "serving" in output.read_text()  # the server's own log lines were captured
    for log in logs:
        text = log.read_text(errors="replace")
        for password in passwords:
            assert password not in text, f"a password is in {log}"


def test_the_embedded_observers_settle_a_lost_payout_with_no_retry(tmp_path: Path) -> None:
    """make run's promise: a payout whose answer was lost reaches completed through the
    simulator's feeds, observed by the two observer processes the server started."""
    _, base = _start(tmp_path)
    provider = re.search(r"provider simulator at (\S+)", _output(tmp_path).read_text())
    assert provider is not None
    admin = {"Authorization": "Bearer " + (tmp_path / "admin.key").read_text().strip()}
    made = httpx.post(
        f"{base}/admin/v1/principals",
        json={"tenant": "acme", "name": "shop", "role": "client"},
        headers=admin,
    )
    key = {"Authorization": f"Bearer {made.json()['api_key']}"}
    armed = httpx.post(
        f"{provider.group(1)}/_sim/faults", json={"mode": "drop_response", "count": 1}
    )
    assert armed.status_code == 200, armed.text
    lost = httpx.post(
        f"{base}/v1/payouts",
        json={"beneficiary": "ACME", "amount": 1200, "currency": "EUR"},
        headers={**key, "Idempotency-Key": "po-1"},
        timeout=30,
    )
    # 504: the answer was lost; 201: an observer settled the payment from a feed while the
    # attempt waited out its provider timeout (a loaded machine), and the attempt answered
    # what the row says. Either way the feed is what settled it (checked below).
    assert lost.status_code in (504, 201), lost.text
    url = f"{base}/v1/operations/{lost.headers['operation-id']}"
    deadline = time.monotonic() + 30
    while httpx.get(url, headers=key).json()["state"] != "completed":
        assert time.monotonic() < deadline, httpx.get(url, headers=key).text
        time.sleep(0.2)
    sources = [o["source"] for o in httpx.get(url, headers=key).json()["observations"]]
    assert "feed" in sources
    feeds = httpx.get(f"{base}/admin/v1/feeds", headers=admin).json()["items"]
    assert {f["name"] for f in feeds} == {"payments", "payments-ts"}
    # what the bundled simulator's feeds are declared to promise (the cursor feed may
    # backfill under a fault, so it promises nothing and is read again from its start)
    promises = {f["name"]: f["promises"] for f in feeds}
    assert promises == {
        "payments": [],
        "payments-ts": ["later-timestamp", "short-page-end", "watermark"],
    }


# A command beside the server (migrate, principals create) uses its database; at most this.
COMMAND_TIMEOUT = 120.0
# serve notices a dead embedded server within a second and then shuts down in order.
DEATH_NOTICED_TIMEOUT = STOP_TIMEOUT + 5.0


def _command(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``settlement ARGS`` on ``data_dir``, as a second terminal would run it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLEMENT_")}
    env["SETTLEMENT_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


def test_commands_beside_the_server_use_its_embedded_database(tmp_path: Path) -> None:
    """`make migrate` or `principals create --embedded` while `serve --embedded` runs on the
    same data directory: they use the server's PostgreSQL, which stays up (it was stopped as
    a leftover before, and /health went degraded for good)."""
    proc, base = _start(tmp_path)
    migrated = _command(tmp_path, "migrate", "--embedded")
    assert migrated.returncode == 0, migrated.stderr
    assert "database at" in migrated.stdout
    made = _command(
        tmp_path, "principals", "create", "--tenant", "acme", "--name", "shop", "--role",
        "client", "--embedded",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    for command in (migrated, made):
        assert "using the PostgreSQL that pid" in command.stderr
        assert "leftover" not in command.stderr
    assert proc.poll() is None
    assert httpx.get(f"{base}/health").json() == {"status": "ok", "database": "ok", "redis": "ok"}
    # the principal was made in the server's database: its key is known there
    key = {"Authorization": "Bearer " + json.loads(made.stdout)["api_key"]}
    missing = httpx.get(f"{base}/v1/accounts/{uuid.uuid4()}", headers=key)
    assert missing.status_code == 404, missing.text
    assert "leftover" not in _output(tmp_path).read_text()


def test_a_second_server_on_the_data_directory_is_refused_and_the_first_runs_on(
    tmp_path: Path,
) -> None:
    proc, base = _start(tmp_path)
    second = _command(tmp_path, "serve", "--embedded", "--port", str(free_port()))
    assert second.returncode != 0
    assert f"run by another process (pid {proc.pid}: settlement serve --embedded" in (second.stderr)
    assert httpx.get(f"{base}/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("server", "program"), [("PostgreSQL", "postgres"), ("Redis", "redis-server")]
)
def test_the_server_exits_non_zero_when_an_embedded_server_dies(
    tmp_path: Path, server: str, program: str
) -> None:
    proc, _ = _start(tmp_path)
    children = _servers_of(proc)
    # the postmaster or redis-server: a direct child (the backends are the postmaster's)
    (dead,) = [c for c in psutil.Process(proc.pid).children() if c.name() == program]
    dead.kill()
    assert proc.wait(DEATH_NOTICED_TIMEOUT) != 0
    output = _output(tmp_path).read_text()
    assert f"the embedded {server} (pid {dead.pid}) exited with code -9 while we served" in output
    assert "embedded server died; shutting down" in output
    assert _wait_gone(children) == []


def test_the_admin_key_and_the_simulators_payments_are_kept_private(tmp_path: Path) -> None:
    """The admin key is not printed, only where it is; it and the simulator's SQLite files
    (every payout with its signed evidence) are readable by their owner only."""
    _, base = _start(tmp_path)
    key_file = tmp_path / "admin.key"
    key = key_file.read_text().strip()
    output = _output(tmp_path).read_text()
    assert f"admin API key in {key_file}" in output
    assert key not in output
    provider = re.search(r"provider simulator at (\S+)", output)
    assert provider is not None
    admin = {"Authorization": f"Bearer {key}"}
    made = httpx.post(
        f"{base}/admin/v1/principals",
        json={"tenant": "acme", "name": "shop", "role": "client"},
        headers=admin,
    )
    client = {"Authorization": f"Bearer {made.json()['api_key']}"}
    paid = httpx.post(
        f"{base}/v1/payouts",
        json={"beneficiary": "ACME", "amount": 1200, "currency": "EUR"},
        headers={**client, "Idempotency-Key": "po-private"},
        timeout=30,
    )
    assert paid.status_code == 201, paid.text
    files = [key_file, tmp_path / "provider.secret", tmp_path / "postgres.password"]
    files += [tmp_path / f"provider.sqlite3{suffix}" for suffix in ("", "-wal", "-shm")]
    modes = {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in files}
    assert modes == {path.name: "0o600" for path in files}
