"""HTTP answers every layer's error through its problem type, in one place: a refusal with
its message, a busy or unreachable dependency with Retry-After and no internals, a bug as
internal-error."""

from __future__ import annotations

import pytest
from litestar import Litestar, get
from litestar.params import FromPath
from litestar.testing import TestClient

from service.core.model import InvalidObservation
from service.errors import SettlementError
from service.http.problems import ProblemError, exception_handlers
from service.leases import LeaseUnavailable
from service.store.db import DatabaseUnavailable, PoolTimeout
from service.store.outcomes import OperationNotFound
from service.store.phase import RowLocked, SettlementContention
from service.store.principals import PrincipalExists

RAISED: dict[str, Exception] = {
    "not-found": OperationNotFound("no operation 42"),
    "principal-exists": PrincipalExists("principal 'a' already exists"),
    "gone": DatabaseUnavailable("the database is unreachable (10.0.0.7:5432)"),
    "pool": PoolTimeout("QueuePool limit of size 5 overflow 0 reached"),
    "locked": RowLocked("the operation row is locked by another phase"),
    "contention": SettlementContention("settle: revision kept moving"),
    "redis": LeaseUnavailable("Redis at 10.0.0.8:6379 refused"),
    "timeout": TimeoutError(),
    "refusal": ProblemError("forbidden", "admins only"),
    "bug": InvalidObservation("a completed observation needs a result"),
    "root": SettlementError("a bare root error"),
}


@get("/raise/{name:str}")
async def raising(name: FromPath[str]) -> None:
    raise RAISED[name]


@pytest.fixture(scope="module")
def client() -> TestClient[Litestar]:
    app = Litestar([raising], exception_handlers=exception_handlers)
    return TestClient(app)


@pytest.mark.parametrize(
    ("name", "status", "slug", "retry_after"),
    [
        ("not-found", 404, "not-found", False),
        ("principal-exists", 409, "principal-exists", False),
        ("gone", 503, "service-unavailable", True),
        ("pool", 503, "service-unavailable", True),
        ("locked", 409, "operation-in-progress", True),
        ("contention", 503, "service-unavailable", True),
        ("redis", 503, "lease-unavailable", True),
        ("timeout", 503, "service-unavailable", True),
        ("refusal", 403, "forbidden", False),
        ("bug", 500, "internal-error", False),
        ("root", 500, "internal-error", False),
    ],
)
def test_each_error_is_answered_as_its_problem_type(
    client: TestClient[Litestar], name: str, status: int, slug: str, retry_after: bool
) -> None:
    answer = client.get(f"/raise/{name}")
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == f"/problems/{slug}"
    assert ("retry-after" in answer.headers) is retry_after
    if retry_after or status == 500:  # the error's own message stays in the log
        assert not str(RAISED[name]) or str(RAISED[name]) not in answer.json()["detail"]
    else:  # a refusal: its message is the answer
        assert answer.json()["detail"] == str(RAISED[name])
