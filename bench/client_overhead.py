"""The Python client's CPU per call: ``Client.create_transfer`` against a bare httpx POST of
the same request to the same route, on one running server.

    .venv/bin/python -m bench.client_overhead [--calls N] [--rounds R]

Starts embedded PostgreSQL and Redis and ``settlement serve`` (one worker), makes a principal
and two accounts, then in each round sends N transfers (a fresh key each) both ways, on one
warm pooled connection each; the two alternate so that drift in the machine hits both. CPU
is this process's (``time.process_time``: user + system), so the server's own work is not
counted. Prints both figures per call, and their ratio.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import msgspec
from settlement_client import AdminClient, Client

from bench.stack import ServerProcess, Stack, free_port

# Calls per round and rounds: enough that a round's CPU is well above the clock's grain.
CALLS = 300
ROUNDS = 5
# Calls of each kind before measuring: connection set up, code paths warm.
WARMUP = 50
TENANT = "overhead"


def _bare(http: httpx.Client, api_key: str, body: bytes, calls: int) -> float:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    started = time.process_time()
    for _ in range(calls):
        answer = http.post(
            "/v1/transfers", content=body, headers=headers | {"Idempotency-Key": str(uuid.uuid4())}
        )
        if answer.status_code != 201:
            raise SystemExit(f"bare POST answered {answer.status_code}: {answer.text}")
    return time.process_time() - started


def _client(client: Client, source: str, destination: str, calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        client.create_transfer(source, destination, 1, "EUR")
    return time.process_time() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="client_overhead", description=__doc__)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    admin_key = "sk_" + secrets.token_urlsafe(32)  # the bootstrap key: 128 random bits or more
    with Stack(Path(tempfile.mkdtemp(prefix="settlement-overhead-"))) as stack:
        port = free_port()
        server = ServerProcess(
            "settlement serve",
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "1"],
            port=port,
            workers=1,
            env=stack.server_env(SETTLEMENT_BOOTSTRAP_ADMIN_KEY=admin_key),
            log_path=stack.log_dir / "server.log",
        )
        with server.start():
            with AdminClient(server.base_url, admin_key) as admin:
                api_key = admin.create_principal(TENANT, "bench", "client").value.api_key
            with (
                Client(server.base_url, api_key) as client,
                httpx.Client(base_url=server.base_url) as http,
            ):
                source = client.create_account("EUR", 10**12).value.id
                destination = client.create_account("EUR").value.id
                body = msgspec.json.encode(
                    {"source": source, "destination": destination, "amount": 1, "currency": "EUR"}
                )
                _bare(http, api_key, body, WARMUP)
                _client(client, source, destination, WARMUP)
                bare = with_client = 0.0
                for _ in range(args.rounds):
                    bare += _bare(http, api_key, body, args.calls)
                    with_client += _client(client, source, destination, args.calls)
    calls = args.calls * args.rounds
    per_bare, per_client = bare / calls * 1e6, with_client / calls * 1e6
    print(f"calls per way: {calls} ({args.rounds} rounds of {args.calls})")
    print(f"bare httpx POST          CPU per call: {per_bare:8.1f} us")
    print(f"Client.create_transfer   CPU per call: {per_client:8.1f} us")
    print(
        f"ratio client / bare: {per_client / per_bare:.2f} "
        f"(overhead {per_client - per_bare:+.1f} us per call)"
    )


if __name__ == "__main__":
    main()
