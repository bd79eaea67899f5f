"""The metrics an on-call engineer reads: every problem document answered counted by its slug
(a stored business refusal and each replay of it too), the build, each worker's process and
database pool, a gone worker's per-worker series dropped, the open operations and the purge's
backlog as last read in the background."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from service import package_version
from service.app.feed_figures import FeedFigureKeeper, FeedFigures
from service.store.open_work import OPEN_COUNT_CAP
from service.telemetry import Metrics, RequestTelemetry
from service.telemetry.asgi import OTHER_PROBLEM, problem_slug
from service.telemetry.feed_figures import FigureShelf

Message = MutableMapping[str, Any]
PROBLEM = "application/problem+json"


def series(text: str, name: str) -> dict[str, float]:
    """``name``'s series of a scrape: their labels (as written) -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            labels, value = line.rsplit(" ", 1)
            found[labels.removeprefix(name)] = float(value)
    return found


def answering(status: int, media_type: str, body: bytes, *, replayed: bool = False) -> Any:
    """An ASGI app that answers every request with this answer, its body in two parts."""

    async def app(scope: Any, receive: Any, send: Callable[[Message], Awaitable[None]]) -> None:
        headers = [(b"content-type", media_type.encode())]
        if replayed:
            headers.append((b"idempotent-replayed", b"true"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        half = len(body) // 2
        await send({"type": "http.response.body", "body": body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": body[half:]})

    return app


async def request(metrics: Metrics, app: Any, path_template: str = "/v1/transfers") -> None:
    """One request through the request telemetry around ``app``, counted in ``metrics``."""
    app = RequestTelemetry(app, metrics, access_log=False)
    scope = {
        "type": "http",
        "method": "POST",
        "path": path_template,
        "path_template": path_template,
        "headers": [],
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        return None

    await app(scope, receive, send)


def document(slug: str, status: int) -> bytes:
    return msgspec.json.encode(
        {"type": f"/problems/{slug}", "title": "t", "status": status, "detail": "d"}
    )


def test_a_problem_documents_slug_is_its_declared_type_else_other() -> None:
    assert problem_slug(document("insufficient-funds", 402)) == "insufficient-funds"
    assert problem_slug(document("no-such-slug", 400)) == OTHER_PROBLEM
    assert problem_slug(b'{"type": "https://provider.example/declined"}') == OTHER_PROBLEM
    assert problem_slug(b'{"title": "no type"}') == OTHER_PROBLEM
    assert problem_slug(b"not json") == OTHER_PROBLEM


async def test_stored_refusals_and_their_replays_are_counted_by_slug_like_any_problem() -> None:
    metrics = Metrics()
    refused = document("insufficient-funds", 402)
    declined = document("payout-declined", 402)
    await request(metrics, answering(402, PROBLEM, refused))
    await request(metrics, answering(402, PROBLEM, refused, replayed=True))
    await request(metrics, answering(402, PROBLEM, declined), "/v1/payouts")
    foreign = b'{"type": "urn:provider:declined"}'  # a provider's own, stored as it came
    await request(metrics, answering(402, PROBLEM, foreign), "/v1/payouts")
    await request(metrics, answering(201, "application/json", b"{}"))
    text = metrics.render()
    problems = series(text, "settlement_http_problems_total")
    assert problems['{slug="insufficient-funds",status="402"}'] == 2  # the first and its replay
    assert problems['{slug="payout-declined",status="402"}'] == 1
    assert problems[f'{{slug="{OTHER_PROBLEM}",status="402"}}'] == 1
    assert sum(problems.values()) == 4  # the 201 is no problem
    requests = series(text, "settlement_http_requests_total")
    route = 'route="POST /v1/transfers"'
    assert requests[f'{{outcome="insufficient-funds",{route},status_class="4xx"}}'] == 2
    assert requests[f'{{outcome="ok",{route},status_class="2xx"}}'] == 1
    assert not any('outcome="error"' in labels for labels in requests)
    replays = series(text, "settlement_http_replays_total")
    assert replays[f"{{{route}}}"] == 1  # the replay is counted as one too


def test_a_scrape_shows_the_build_and_this_process() -> None:
    text = Metrics().render()
    build = series(text, "settlement_build_info")
    python = platform.python_version()
    assert build == {f'{{python="{python}",version="{package_version()}"}}': 1.0}
    pid = f'{{pid="{os.getpid()}"}}'
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert series(text, name)[pid] > 0, name


def test_the_pool_gauges_say_what_is_lent_of_what() -> None:
    metrics = Metrics()
    metrics.on_pool(0, 10)
    metrics.on_pool(4, 10)
    text = metrics.render()
    assert series(text, "settlement_db_pool_connections_in_use") == {"": 4.0}
    assert series(text, "settlement_db_pool_connections_max") == {"": 10.0}


# A worker of one server: a process of its own, sharing the metrics directory.
_WORKER = """
import os, sys
from service.telemetry import Metrics
metrics = Metrics(os.environ["PROMETHEUS_MULTIPROC_DIR"])
metrics.on_pool(int(sys.argv[1]), 10)
print(os.getpid(), flush=True)
if sys.argv[2] == "render":
    print(metrics.render(), flush=True)
else:
    sys.stdin.read()  # until the test lets it go
"""


def worker(shared: Path, lent: int, then: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(lent), then],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_each_live_worker_has_its_series_and_a_gone_ones_are_dropped(tmp_path: Path) -> None:
    gone = worker(tmp_path, 7, "render")
    gone_pid = int(gone.communicate(timeout=60)[0].split()[0])
    alive = worker(tmp_path, 2, "wait")
    assert alive.stdout is not None
    try:
        alive_pid = int(alive.stdout.readline())
        scraper = worker(tmp_path, 3, "render")
        out, _ = scraper.communicate(timeout=60)
        scraper_pid, text = int(out.split()[0]), out.split("\n", 1)[1]
    finally:
        alive.communicate("", timeout=60)
    assert gone.returncode == alive.returncode == scraper.returncode == 0
    in_use = series(text, "settlement_db_pool_connections_in_use")
    assert in_use == {f'{{pid="{alive_pid}"}}': 2.0, f'{{pid="{scraper_pid}"}}': 3.0}
    cpu = series(text, "process_cpu_seconds_total")
    assert set(cpu) == {f'{{pid="{alive_pid}"}}', f'{{pid="{scraper_pid}"}}'}
    assert not list(tmp_path.glob(f"gauge_live*_{gone_pid}.db"))  # its counters stay
    assert list(tmp_path.glob(f"counter_{gone_pid}.db"))


@pytest.mark.parametrize(
    ("slug", "status"), [("operation-in-progress", 409), ("lease-unavailable", 503)]
)
async def test_a_refusal_answered_now_is_counted_by_its_documents_type(
    slug: str, status: int
) -> None:
    metrics = Metrics()
    await request(metrics, answering(status, PROBLEM, document(slug, status)))
    problems = series(metrics.render(), "settlement_http_problems_total")
    assert problems == {f'{{slug="{slug}",status="{status}"}}': 1.0}


def test_the_open_operations_and_the_purge_backlog_are_shown_as_last_read(
    tmp_path: Path,
) -> None:
    shelf = FigureShelf(str(tmp_path))
    keeper = FeedFigureKeeper(shelf, external_routes=(), interval=15.0, clock=lambda: 110.0)
    before = keeper.exposition()
    assert "# TYPE settlement_operations_open gauge" in before
    assert series(before, "settlement_operations_open") == {}  # nothing read yet
    assert series(before, "settlement_purge_backlog_seconds") == {}
    figures = FeedFigures(
        events=[],
        alarms=[],
        lags=[],
        oldest_unknown=0.0,
        read_at=100.0,
        open_operations=[("conflict", 1), ("in_progress", 0), ("unknown", OPEN_COUNT_CAP)],
        purge_backlog=42.0,
    )
    shelf.put(msgspec.json.encode(figures))
    text = keeper.exposition()
    assert series(text, "settlement_operations_open") == {
        '{state="conflict"}': 1.0,
        '{state="in_progress"}': 0.0,
        '{state="unknown"}': float(OPEN_COUNT_CAP),  # at least that many
    }
    assert series(text, "settlement_purge_backlog_seconds") == {"": 42.0}
    assert f"counted up to {OPEN_COUNT_CAP}" in text
