"""The routing rules on the SQL a run actually executed (issue 38 item 3, source (c);
docs/scaling.md): the whole application in process, recorded through SQLAlchemy's
``before_cursor_execute`` and asyncpg's query logger (:class:`tests.citus_statements.Recorder`),
while it serves a representative run: new accounts and a new transfer, its replay, a payout
whose answer comes late, payouts left unknown then resolved, settled by evidence and
superseded, the status by id and by key, then a sweep, a purge and the open-work figures."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from service.app.routes import SCHEMA
from service.config import Settings
from service.domain.principals import Role
from service.store.db import make_engine
from service.store.open_work import read_open_work
from service.store.principals import PrincipalStore
from tests.citus_rules import Schema, spans_tenants, statement_findings, tables_in
from tests.citus_statements import Recorder, cold_statements, hot_statements, named
from tests.conftest import Services
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.test_payouts import evidence_for
from tests.integration.asgi import Asgi
from tests.unit import citus_debt

pytestmark = pytest.mark.integration

# the provider's timeout, and its delay for the late answer: the request gives up (504), the
# answer arrives and is settled within the late-response window
PROVIDER_TIMEOUT = 0.8
LATE_DELAY_MS = 2000
LATE_WINDOW = 10.0
# how long the run waits for the late answer to settle
SETTLE_DEADLINE = 15.0
PAYOUT = {"beneficiary": "ACME Supplies", "amount": 500, "currency": "EUR"}
# the statements the run executed that span tenants on purpose, each marked so in its SQL:
# the background jobs' reads that find work in every tenant (then locked tenant by tenant),
# and the figures over every tenant (every settlement of the run passes its tenant: no
# lookup of an operation by its id alone)
SPANNING = frozenset(
    {
        "executed SELECT operations",  # the feeds' oldest unknown operation of any tenant
        "store.epochs._EXPIRED_LEASES",
        "store.open_work._FIRST_EXPIRY",
        "store.open_work._OPEN_WORK",
        "store.retention._FORGETTABLE",
        "store.retention._FORGET_ORPHANS",
        "store.retention._OLDEST_OPEN",
        "store.retention._PURGEABLE",
    }
)


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderProcess]:
    with ProviderProcess() as proc:
        yield proc


async def _keys(migrated_url: str) -> dict[str, str]:
    """A client, an observer and an admin of a tenant of this test's own: their API keys."""
    engine = make_engine(Settings.from_env({}), migrated_url, pool_size=1)
    tenant = f"citus-{uuid.uuid4().hex[:8]}"
    try:
        principals = PrincipalStore(engine)
        return {
            role.value: (await principals.create(tenant, f"citus-{role.value}", role))[1]
            for role in (Role.CLIENT, Role.OBSERVER, Role.ADMIN)
        }
    finally:
        await engine.dispose()


class _Run:
    def __init__(self, app: Asgi, keys: dict[str, str], provider: ProviderProcess) -> None:
        self.app, self.keys, self.provider = app, keys, provider

    async def call(
        self, method: str, path: str, role: str, body: Any = None, key: str | None = None
    ) -> tuple[int, dict[bytes, bytes], Any]:
        headers = {"Authorization": f"Bearer {self.keys[role]}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if key is not None:
            headers["Idempotency-Key"] = key
        content = b"" if body is None else json.dumps(body).encode()
        status, answered, raw = await self.app.request(method, path, headers, content)
        return status, dict(answered), json.loads(raw) if raw else None

    async def post(self, path: str, body: Any, key: str) -> tuple[int, dict[bytes, bytes], Any]:
        return await self.call("POST", path, "client", body, key)

    async def view(self, operation_id: str) -> dict[str, Any]:
        status, _, body = await self.call("GET", f"/v1/operations/{operation_id}", "client")
        assert status == 200, body
        found: dict[str, Any] = body
        return found

    async def unknown_payout(self, mode: str, key: str) -> str:
        if mode == "delay":
            await asyncio.to_thread(self.provider.arm, mode, delay_ms=LATE_DELAY_MS)
        else:
            await asyncio.to_thread(self.provider.arm, mode)
        status, headers, body = await self.post("/v1/payouts", PAYOUT, key)
        assert status == 504, body
        return headers[b"operation-id"].decode()

    async def settled(self, operation_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + SETTLE_DEADLINE
        while (view := await self.view(operation_id))["state"] != "completed":
            assert time.monotonic() < deadline, view
            await asyncio.sleep(0.1)
        return view

    async def everything(self) -> None:
        """The representative run."""
        accounts = []
        for n, balance in enumerate((1000, 0)):
            body = {"currency": "EUR", "opening_balance": balance}
            status, _, made = await self.post("/v1/accounts", body, f"account-{n}")
            assert status == 201, made
            accounts.append(made["id"])
        transfer = {"source": accounts[0], "destination": accounts[1], "amount": 10}
        transfer |= {"currency": "EUR"}
        first = await self.post("/v1/transfers", transfer, "transfer")
        replay = await self.post("/v1/transfers", transfer, "transfer")
        assert first[0] == replay[0] == 201 and replay[1][b"idempotent-replayed"] == b"true"
        transfer_id = first[1][b"operation-id"].decode()
        await self.view(transfer_id)  # status by id
        found = await self.call("GET", "/v1/operations?key=transfer", "client")
        assert found[0] == 200, found

        late = await self.unknown_payout("delay", "payout-late")
        await self.settled(late)  # the late answer settled it

        resolved = await self.view(await self.unknown_payout("error_5xx", "payout-resolved"))
        body = {"id": resolved["id"], "provider_reference": "pay_r", **PAYOUT}
        resolution = {
            "outcome": "completed",
            "provider_reference": "pay_r",
            "reason": "the provider's dashboard shows it paid",
            "result": {"status": 201, "body": body},
        }
        path = f"/admin/v1/operations/{resolved['id']}/resolve"
        answer = await self.call("POST", path, "admin", resolution)
        assert answer[0] == 200, answer

        observed = await self.view(await self.unknown_payout("error_5xx", "payout-evidence"))
        evidence = evidence_for(observed, reference="pay_e")
        answer = await self.call("POST", "/v1/observations", "observer", evidence)
        assert answer[0] == 202 and answer[2]["operation"]["state"] == "completed", answer

        superseded = await self.unknown_payout("error_5xx", "payout-superseded")
        path = f"/admin/v1/operations/{superseded}/supersede"
        reason = {"reason": "request edited", "force": True}  # its outcome is unknown
        answer = await self.call("POST", path, "admin", reason)
        assert answer[0] == 200, answer


async def test_the_sql_a_run_executed_breaks_exactly_the_recorded_debt(
    services: Services, migrated_url: str, provider: ProviderProcess
) -> None:
    from service.http.app import create_app

    settings = Settings.from_env(
        {},
        database_url=migrated_url,
        redis_url=services.redis_url,
        sweep_interval=3600.0,
        provider_url=provider.base_url,
        provider_secret=SECRET,
        provider_timeout=PROVIDER_TIMEOUT,
        late_response_window=LATE_WINDOW,
    )
    keys = await _keys(migrated_url)
    with Recorder() as seen:
        app = Asgi(create_app(settings))
        await app.start()
        try:
            await _Run(app, keys, provider).everything()
            settlement = app.app.state.settlement
            await settlement.sweeper.run_once()
            await settlement.purger.run_once()
            await read_open_work(settlement.engine)
        finally:
            await app.stop()
            await asyncio.to_thread(provider.clear_faults)
        await seen.settle()

    schema = Schema.of(SCHEMA)
    known = {**hot_statements(), **cold_statements()}
    ours = {sql for sql in seen.executed | seen.hot if tables_in(sql) & schema.kinds.keys()}
    names = {sql: named(sql, known, schema.kinds) for sql in ours}
    findings = {
        finding.as_tuple()
        for sql, name in names.items()
        for finding in statement_findings(name, sql, schema)
    }
    by_run = {f for f in findings if f[0].startswith("executed ")}
    built = {name for name in names.values() if name.startswith("executed ")}
    print(
        f"executed: {len(ours)} distinct statements on the schema's tables, "
        f"{len([n for n in names.values() if n not in built])} of them (a) or (b), the others "
        f"built inside functions ({len(built)} shapes); findings of those: "
        + ", ".join(f"{n} {rule}" for rule, n in sorted(_count(f[1] for f in by_run).items()))
    )
    for entry in sorted(by_run):
        print("  ", entry)
    # what (a) and (b) name, the unit test holds to the debt; the rest, this one
    assert findings - by_run <= citus_debt.STATEMENTS
    assert by_run == citus_debt.EXECUTED, sorted(by_run ^ citus_debt.EXECUTED)
    # every statement the hot path sent on its raw connections is one the unit test checks
    hot = {names[sql] for sql in seen.hot & ours}
    assert hot <= known.keys()
    assert {"hot_sql.IDENTIFY", "hot_sql.CLAIM_NEW", "claim_settle_with(transfer)"} <= hot
    # what spans tenants on purpose is exactly what was reviewed as such (docs/scaling.md,
    # Background jobs): the jobs' reads that find work in every tenant, the figures, and
    # the lookups of an operation named by its id alone
    spanning = sorted({name for sql, name in names.items() if spans_tenants(sql)})
    print("spans tenants:", spanning)
    assert spanning == sorted(SPANNING), spanning


def _count(items: Iterable[str]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    return counted
