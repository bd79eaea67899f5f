"""What one client may hold of the server: its header block (size, count, time), its body's
time, and connections. Each test speaks raw HTTP/1.1 over a socket to `settlement serve`, as a
hostile client would; under the earlier server (uvicorn) each of them failed: an 8 MiB header
was answered 200, no connection was ever timed out, and 300 idle sockets took every
descriptor."""

from __future__ import annotations

import contextlib
import resource
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, count_rows, new_account, new_principal, until
from tests.e2e.server import ServerProcess

# The deadlines the test server runs with: short, so a test waits a second, not ten.
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
# Bounds every socket read of these tests: far past any deadline above.
SOCKET_TIMEOUT = 20.0
# A /livez behind a streaming attacker took 5-7.5 s under the earlier server; an answer within
# this shows the stream no longer stalls the loop (a bound on a defect, not a speed target).
LIVEZ_BOUND = 1.5


@pytest.fixture(scope="module")
def limited(services: Services, app_database: str) -> Iterator[ServerProcess]:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
        "SETTLEMENT_BODY_TIMEOUT": str(BODY_TIMEOUT),
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


def connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def livez_seconds(server: ServerProcess) -> float:
    started = time.monotonic()
    answer = httpx.get(f"{server.base_url}/livez", timeout=SOCKET_TIMEOUT)
    assert answer.status_code == 200
    return time.monotonic() - started


def test_a_header_block_past_the_limit_is_a_431_and_others_are_served_meanwhile(
    limited: ServerProcess,
) -> None:
    sock = connect(limited)
    sent = 0
    refused = threading.Event()

    def stream() -> None:
        nonlocal sent
        # a 1 MiB header value, sent as a slow client would, in 4 KiB pieces
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(256):
                sock.sendall(b"a" * 4096)
                sent += 4096
            sock.sendall(b"\r\n\r\n")
        refused.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    slowest = max(livez_seconds(limited) for _ in range(10))
    answer = read_all(sock)
    streamer.join(SOCKET_TIMEOUT)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert slowest < LIVEZ_BOUND, slowest


def test_more_than_a_hundred_headers_is_a_431(limited: ServerProcess) -> None:
    many = b"".join(b"X-H%d: 1\r\n" % i for i in range(101))
    with connect(limited) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 431 ")
    few = {f"X-H{i}": "1" for i in range(90)}
    assert httpx.get(f"{limited.base_url}/livez", headers=few).status_code == 200


@pytest.mark.parametrize(
    "opening",
    [b"", b"GET /livez HTTP/1.1\r\nHost: x\r\n"],
    ids=["silent", "half-sent"],
)
def test_a_connection_without_a_whole_header_block_is_closed_at_its_deadline(
    limited: ServerProcess, opening: bytes
) -> None:
    with connect(limited) as sock:
        opened = time.monotonic()
        sock.sendall(opening)
        assert read_all(sock) == b""  # closed, nothing answered
        waited = time.monotonic() - opened
    assert waited >= HEADER_TIMEOUT * 0.9, waited


def test_a_trickled_header_block_is_closed_at_its_deadline_from_connection_open(
    limited: ServerProcess,
) -> None:
    """One header line every 0.2 s: every line arrives well within any per-read timeout, but
    the block as a whole never does."""
    with connect(limited) as sock:
        opened = time.monotonic()
        sock.sendall(b"GET /livez HTTP/1.1\r\n")
        closed = False
        for i in range(round(SOCKET_TIMEOUT / 0.2)):
            try:
                sock.sendall(b"X-T%d: 1\r\n" % i)
            except OSError:
                closed = True
                break
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable and sock.recv(1) == b"":
                closed = True
                break
        waited = time.monotonic() - opened
    assert closed
    assert HEADER_TIMEOUT * 0.9 <= waited < SOCKET_TIMEOUT, waited


def test_an_idle_kept_alive_connection_is_closed_at_the_header_deadline(
    limited: ServerProcess,
) -> None:
    with connect(limited) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        assert read_all(sock) == b""
        assert time.monotonic() - answered >= HEADER_TIMEOUT * 0.9


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_stores_nothing(
    limited: ServerProcess, app_database: str
) -> None:
    base = limited.base_url
    client = new_principal(base)["api_key"]
    source = new_account(base, client, 500)
    target = new_account(base, client, 0)
    before = count_rows(app_database)
    body = b'{"source": "%s", "destination": "%s", "amount": 5, "currency": "EUR"}' % (
        source.encode(),
        target.encode(),
    )
    head = (
        b"POST /v1/transfers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Idempotency-Key: slow-body\r\nAuthorization: Bearer " + client.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with connect(limited) as sock:
        sock.sendall(head + body[:10])  # then nothing more
        answer = read_all(sock)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"application/problem+json" in rest
    assert b"/problems/request-timeout" in rest
    assert count_rows(app_database) == before
    # the key is still unused: the whole request with it is a new transfer
    whole = httpx.post(
        f"{base}/v1/transfers",
        content=body,
        headers={
            **auth(client),
            "Content-Type": "application/json",
            "Idempotency-Key": "slow-body",
        },
    )
    assert whole.status_code == 201, whole.text
    assert whole.headers["idempotent-replayed"] == "false"


def test_connections_past_the_limit_wait_until_one_closes(
    services: Services, app_database: str
) -> None:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_CONNECTION_LIMIT": "2",
        "SETTLEMENT_HEADER_TIMEOUT": "60",
    }
    with ServerProcess(app_database, services.redis_url, env=env) as server:
        held = [connect(server), connect(server)]
        waiting = connect(server)  # the kernel takes it; the server does not serve it yet
        waiting.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        readable, _, _ = select.select([waiting], [], [], 0.5)
        assert not readable, "a third connection was served past a limit of two"
        held.pop().close()
        waiting.settimeout(SOCKET_TIMEOUT)
        assert waiting.recv(65536).startswith(b"HTTP/1.1 200 ")
        for sock in (*held, waiting):
            sock.close()


def _few_descriptors() -> None:
    """In the server's process, before it starts: a descriptor limit of 256, soft and hard."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_three_hundred_idle_sockets_do_not_take_a_server_with_256_descriptors_down(
    services: Services, app_database: str
) -> None:
    env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_HEADER_TIMEOUT": "1"}
    server = ServerProcess(
        app_database, services.redis_url, env=env, preexec=_few_descriptors
    ).start()
    idle: list[socket.socket] = []
    try:
        idle = [connect(server) for _ in range(300)]
        answer = httpx.get(f"{server.base_url}/health", timeout=SOCKET_TIMEOUT)
        assert answer.status_code == 200, answer.text
        assert "connection limit lowered to the descriptor limit" in server.output()
    finally:
        for sock in idle:
            sock.close()
        server.__exit__(None, None, None)


def test_a_killed_server_leaves_no_worker_serving(services: Services, app_database: str) -> None:
    """granian serves from forked workers: SIGKILL of the server process kills them too (a
    worker left behind would go on answering on the port, unsupervised)."""
    import psutil

    env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY}
    with ServerProcess(app_database, services.redis_url, env=env, workers=2) as server:
        assert server.proc is not None
        workers = psutil.Process(server.proc.pid).children()
        assert len(workers) == 2
        server.stop(signal.SIGKILL)
        until(
            lambda: not any(w.is_running() and w.status() != "zombie" for w in workers),
            "the workers died with their server",
        )
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.base_url}/livez", timeout=2)
