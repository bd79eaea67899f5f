"""The operator console in a real browser: headless Chromium (the operating system's, driven
through its chromedriver by Selenium) against a real server, provider simulator and feed
observer on real PostgreSQL and Redis. An operator signs in, finds a payout whose answer the
provider dropped, reads its timeline, supersedes it and sees the new epoch; quarantines a
feed hold; a tenant admin cannot see another tenant's operation; a form posted from another
page without the session's token is refused; sign-out ends the session.

Each page is saved as a screenshot under tests/artifacts/console/ (git-ignored).
Without Chromium and chromedriver these tests fail, naming the packages to install."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, new_principal, scalar, until
from tests.e2e.observer import Observer
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess, free_port

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MISSING = (
    "the console's browser tests need Chromium and its WebDriver at /usr/bin/chromium and "
    "/usr/bin/chromedriver: apt-get install chromium chromium-driver"
)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
# Longest wait for a page or an element of it.
PAGE_WAIT = 20.0
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1400",
]


@dataclass
class Case:
    """What the walk-through reconciles: a payout whose answer was dropped (unknown), and
    the hold its feed event got (a corrupted signature)."""

    operation_id: str
    feed: str
    event_id: str


@pytest.fixture(scope="module")
def server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
        "SETTLEMENT_PROVIDER_TIMEOUT": "0.8",
        # a dropped answer never comes back late: it stays unknown
        "SETTLEMENT_LATE_RESPONSE_WINDOW": "0",
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


def _feed(base: str, name: str) -> dict[str, Any]:
    answer = httpx.get(f"{base}/admin/v1/feeds/{name}", headers=auth(ADMIN_KEY))
    if answer.status_code == 404:
        return {"lag": None, "holds": []}
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


@pytest.fixture(scope="module")
def case(
    services: Services, app_database: str, server: ServerProcess, provider: ProviderProcess
) -> Case:
    """A payout made while the provider drops its answer (504, unknown), observed by a real
    feed observer while the feed corrupts every signature: its event is held, the payout
    stays unknown. The observer is stopped once the hold is there, so nothing moves
    behind the browser's back."""
    base = server.base_url
    client = new_principal(base, tenant="acme")["api_key"]
    observer = Observer(services.redis_url, app_database, provider, "cursor", page_size=50)
    try:
        until(lambda: _feed(base, observer.name)["lag"] is not None, "the observer catches up")
        provider.arm_feed("bad_signature", 1000)
        provider.arm("drop_response")
        lost = httpx.post(
            f"{base}/v1/payouts",
            json={"beneficiary": "ACME Supplies", "amount": 700, "currency": "EUR"},
            headers={**auth(client), "Idempotency-Key": "po-" + uuid.uuid4().hex[:8]},
            timeout=30,
        )
        assert lost.status_code == 504, lost.text
        holds = until(lambda: _feed(base, observer.name)["holds"], "the event is held")
    finally:
        observer.stop()
        provider.clear_feed_faults()
        provider.clear_faults()
    operation_id = lost.headers["operation-id"]
    assert holds[0]["operation_id"] == operation_id
    state = scalar(app_database, "SELECT state FROM operations WHERE id = :i", i=operation_id)
    assert state == "unknown"
    return Case(operation_id, observer.name, holds[0]["event_id"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(MISSING, pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(PAGE_WAIT)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Page:
    """The browser on the console of one server: visit, fill, click, wait, screenshot."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base

    def visit(self, path: str) -> None:
        self.driver.get(self.base + path)

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, PAGE_WAIT).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
        )

    def heading(self, text: str) -> None:
        """Wait until the page's h1 says ``text``."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.driver, PAGE_WAIT).until(
            expected_conditions.text_to_be_present_in_element((By.TAG_NAME, "h1"), text)
        )

    def type(self, css: str, text: str) -> None:
        field = self.find(css)
        field.clear()
        field.send_keys(text)

    def click(self, css: str) -> None:
        self.find(css).click()

    def text(self) -> str:
        return str(self.find("body").text)

    def shot(self, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), path
        return path

    def sign_in(self, key: str, then: str = "/console") -> None:
        self.visit("/console/sign-out-of-everything")  # a console page: cookies are scoped here
        self.driver.delete_all_cookies()
        self.visit(then)
        self.heading("Sign in")
        self.type("#api_key", key)
        self.click("#sign-in")
        self.find("#signed-in-as")


@pytest.fixture
def page(browser: Any, server: ServerProcess) -> Page:
    return Page(browser, server.base_url)


def test_an_operator_reconciles_an_unknown_payout(page: Page, case: Case) -> None:
    """Sign in, find the unknown payout in the work list, read its timeline, supersede it
    (force, confirmed by typing the id), see the new epoch."""
    page.sign_in(ADMIN_KEY)
    page.shot("01-sign-in-done-work-list")
    page.heading("Work list")
    assert int(page.find("#count-unknown strong").text) >= 1
    page.visit("/console?state=unknown&route=POST+%2Fv1%2Fpayouts")
    page.click(f'a.op-link[href="/console/operations/{case.operation_id}"]')
    page.heading("Operation")
    assert page.find("#op-state").text == "unknown"
    timeline = page.find("#timeline").text
    assert "Attempt started (fencing token 1)" in timeline
    assert "Observation from attempt" in timeline
    assert f"event {case.event_id} held" in timeline  # the feed receipt that touched it
    assert "The effect may run again." in page.find("#advice").text
    page.shot("02-operation-timeline")

    page.type("#reason", "provider answer lost; paying again on purpose")
    page.click("#force")
    page.type("#confirm", case.operation_id)
    page.shot("03-supersede-form-filled")
    page.click("#supersede")
    page.heading("Superseded")
    assert page.find("#new-epoch").text == "2"
    assert "may run again" in page.find("#may-run-again").text
    page.shot("04-superseded-new-epoch")
    page.click("#back-to-operation")
    page.heading("Operation")
    assert page.find("#op-epoch").text == "2"
    assert "Epoch 1 superseded: epoch 2 began" in page.find("#timeline").text
    page.shot("05-operation-after-supersede")


def test_an_operator_resolves_an_unknown_payout_from_the_providers_record(
    page: Page, server: ServerProcess, provider: ProviderProcess
) -> None:
    """A payout whose answer was dropped (paid, unknown): the operator resolves it as
    completed with the provider's reference; a body that is not JSON is refused first and the
    form keeps what was typed; the timeline shows who resolved it and why; the client's next
    retry replays the resolution and nothing is paid again."""
    base = server.base_url
    client = new_principal(base, tenant="acme")["api_key"]
    idem = "po-resolve-" + uuid.uuid4().hex[:8]
    payout = {"beneficiary": "ACME Supplies", "amount": 900, "currency": "EUR"}
    provider.arm("drop_response")
    lost = httpx.post(
        f"{base}/v1/payouts", json=payout, headers={**auth(client), "Idempotency-Key": idem}
    )
    assert lost.status_code == 504, lost.text
    operation_id = lost.headers["operation-id"]
    paid = provider.counts(f"{operation_id}:1")["count"]
    assert paid == 1

    page.sign_in(ADMIN_KEY, then=f"/console/operations/{operation_id}")
    page.heading("Operation")
    assert page.find("#op-state").text == "unknown"
    page.find("#resolve-form")
    page.type("#resolve-reference", "pay_dashboard_42")
    page.type("#resolve-status", "201")
    page.type("#resolve-body", "{not json")
    page.type("#resolve-reason", "provider dashboard shows pay_dashboard_42 settled")
    page.click("#resolve")
    assert "Not resolved" in page.find("#resolve-error").text
    assert page.find("#resolve-reference").get_attribute("value") == "pay_dashboard_42"
    page.shot("13-resolve-refused-keeps-the-form")

    body = {"id": operation_id, "provider_reference": "pay_dashboard_42", **payout}
    page.type("#resolve-body", json.dumps(body))
    page.shot("14-resolve-form-filled")
    page.click("#resolve")
    assert "Resolved as completed (applied)" in page.find("#resolve-notice").text
    assert page.find("#op-state").text == "completed"
    timeline = page.find("#timeline").text
    assert "Operator resolution: completed, applied" in timeline
    assert "provider dashboard shows pay_dashboard_42 settled" in timeline
    assert "pay_dashboard_42" in timeline
    assert not page.driver.find_elements("css selector", "#resolve-form")
    page.shot("15-operation-resolved")

    retry = httpx.post(
        f"{base}/v1/payouts", json=payout, headers={**auth(client), "Idempotency-Key": idem}
    )
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == body
    assert provider.counts(f"{operation_id}:1")["count"] == paid


def test_an_operator_quarantines_a_feed_hold(page: Page, case: Case) -> None:
    page.sign_in(ADMIN_KEY, "/console/feeds")
    page.heading("Feeds")
    row = page.find(f'tr.hold[data-event="{case.event_id}"]')
    assert "bad-signature" in row.text
    page.shot("06-feeds-with-hold")
    page.click(f'tr.hold[data-event="{case.event_id}"] button[value="quarantine"]')
    assert page.find("#notice").text == f"Event {case.event_id} is now quarantined."
    assert f'data-event="{case.event_id}"' not in page.driver.page_source
    page.shot("07-feeds-hold-quarantined")


def test_principals_are_created_with_the_key_shown_once(page: Page) -> None:
    page.sign_in(ADMIN_KEY, "/console/principals")
    page.heading("Principals")
    page.type("#p-tenant", "acme")
    name = "shop-" + uuid.uuid4().hex[:6]
    page.type("#p-name", name)
    page.shot("08-principals")
    page.click("#create")
    page.heading("Principal created")
    key = page.find("#new-key").get_attribute("value")
    assert key.startswith("sk_")
    page.shot("09-principal-key-shown-once")
    page.visit("/console/principals")
    assert name in page.text() and key not in page.driver.page_source


def test_the_principals_page_filters_by_tenant_and_schema_runs_no_script(page: Page) -> None:
    """The all-tenant admin finds the bootstrap admin by its tenant whatever other tenants
    hold; /schema (the API reference off, as by default) is links, no script."""
    page.sign_in(ADMIN_KEY, "/console/principals")
    page.heading("Principals")
    page.type("#f-tenant", "system")
    page.click("#filter")
    page.find("tr[data-principal]")
    assert "Principals of system" in page.text() and "bootstrap-admin" in page.text()
    assert "acme" not in page.find("#principals").text
    page.shot("10-principals-of-one-tenant")
    page.visit("/schema")
    page.find('a[href="/schema/openapi.json"]')
    assert page.driver.execute_script("return document.scripts.length") == 0


def test_a_tenant_admin_cannot_see_another_tenants_operation(
    page: Page, case: Case, server: ServerProcess
) -> None:
    other = new_principal(server.base_url, tenant="globex", role="admin")["api_key"]
    page.sign_in(other)
    assert "tenant globex" in page.find("#signed-in-as").text
    assert case.operation_id not in page.driver.page_source
    page.visit(f"/console/operations/{case.operation_id}")
    page.heading("Not found")
    assert "acme" not in page.text()
    page.shot("10-tenant-admin-not-found")


class _Forger(BaseHTTPRequestHandler):
    """Another origin's page with a form aimed at the console, without the form token."""

    target = ""

    def do_GET(self) -> None:
        body = (
            "<!doctype html><title>forged</title>"
            f'<form method="post" action="{self.target}">'
            '<input name="reason" value="forged"><input name="force" value="on">'
            '<button id="go" type="submit">go</button></form>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_forged_form_without_the_token_is_refused(
    page: Page, case: Case, app_database: str
) -> None:
    page.sign_in(ADMIN_KEY)
    epoch = scalar(
        app_database, "SELECT binding_generation FROM operations WHERE id = :i", i=case.operation_id
    )
    handler = type(
        "Forger",
        (_Forger,),
        {"target": f"{page.base}/console/operations/{case.operation_id}/supersede"},
    )
    forger = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=forger.serve_forever, daemon=True)
    thread.start()
    try:
        page.driver.get(f"http://127.0.0.1:{forger.server_address[1]}/")
        page.click("#go")
        page.heading("Form refused")
        page.shot("11-forged-form-refused")
    finally:
        forger.shutdown()
        forger.server_close()
    assert "Nothing was done" in page.find("#refusal").text
    after = scalar(
        app_database, "SELECT binding_generation FROM operations WHERE id = :i", i=case.operation_id
    )
    assert after == epoch


def test_sign_out_ends_the_session(page: Page) -> None:
    page.sign_in(ADMIN_KEY)
    session = page.driver.get_cookie("console_session")
    assert session is not None and session["httpOnly"] and session["sameSite"] == "Strict"
    page.click("#sign-out")
    page.heading("Sign in")
    page.visit("/console")
    page.heading("Sign in")  # sent back to sign in
    page.shot("12-signed-out")
    replayed = httpx.get(
        f"{page.base}/console", cookies={"console_session": session["value"]}, timeout=30
    )
    assert replayed.status_code == 303


def test_an_operator_finds_an_operation_by_its_key_or_its_id(
    page: Page, case: Case, app_database: str
) -> None:
    """The search box on the work list: the payout's Idempotency-Key lists it (whatever its
    state); its operation id opens its page; a key with a control character is refused and
    stays in the box."""
    key = scalar(
        app_database, "SELECT idempotency_key FROM operations WHERE id = :i", i=case.operation_id
    )
    page.sign_in(ADMIN_KEY)
    page.heading("Work list")
    page.type("#q-key", key)
    page.click("#search")
    assert key in page.find("#search-heading").text
    page.find(f'a.op-link[href="/console/operations/{case.operation_id}"]')
    page.shot("17-search-by-key")
    page.type("#q-key", case.operation_id)
    page.click("#search")
    page.heading(case.operation_id)
    page.shot("18-search-by-id-opens-the-operation")
    page.visit("/console?key=po-%07bell")
    assert "1 to 255 printable ASCII characters" in page.find("#error").text
    assert page.find("#q-key").get_attribute("value") == "po-\x07bell"
    page.shot("19-search-refused-keeps-what-was-typed")


def test_an_operator_sees_a_stalled_feed_and_accepts_a_conflicting_identity(
    page: Page, case: Case, app_database: str
) -> None:
    """A feed held 42 minutes behind a hold is flagged; a conflicting identity alarm has
    its Accept button, and once accepted it is kept as ``conflict-accepted``."""
    from tests.e2e.client import execute

    stalled = "stalled-" + uuid.uuid4().hex[:4]
    execute(
        app_database,
        "INSERT INTO feed_checkpoints (name, kind, updated_at) "
        "VALUES (:f, 'cursor', now() - make_interval(mins => 42))",
        f=stalled,
    )
    execute(
        app_database,
        "INSERT INTO feed_receipts (feed, event_id, event_order, operation_id, state, reason, "
        "first_seen_at, decided_at) VALUES (:f, 'evt-42', 1, gen_random_uuid(), 'held', "
        "'bad-signature', now() - make_interval(mins => 42), now())",
        f=stalled,
    )
    event = "evt-" + uuid.uuid4().hex[:6]
    execute(
        app_database,
        "INSERT INTO feed_alarms (feed, kind, event_id, detail) VALUES (:f, "
        "'conflicting-identity', :e, :d)",
        f=stalled,
        e=event,
        d=f"{event} at 3 has other content than the receipt holding it",
    )
    page.sign_in(ADMIN_KEY, "/console/feeds")
    page.heading("Feeds")
    flag = page.find(f"#stalled-{stalled}")
    assert flag.text == "Stalled for 42 min behind hold evt-42 (bad-signature)."
    page.driver.execute_script("arguments[0].scrollIntoView()", flag)
    page.shot("20-feeds-stalled-and-a-conflict-to-accept")
    page.click(f'tr.alarm[data-alarm-event="{event}"] button[value="accept"]')
    assert f"event {event} is accepted" in page.find("#notice").text
    page.find(f'tr.alarm[data-alarm="conflict-accepted"][data-alarm-event="{event}"]')
    assert not page.driver.find_elements(
        "css selector", f'tr.alarm[data-alarm-event="{event}"] button[value="accept"]'
    )
    page.driver.execute_script(
        "arguments[0].scrollIntoView()", page.find(f'tr.alarm[data-alarm-event="{event}"]')
    )
    page.shot("21-feeds-conflict-accepted")


def test_revoke_asks_first_and_revoking_yourself_signs_you_out(
    page: Page, server: ServerProcess
) -> None:
    base = server.base_url
    shop = new_principal(base, tenant="revokers")
    me = new_principal(base, tenant="revokers", role="admin")
    page.sign_in(me["api_key"], "/console/principals")
    page.heading("Principals")
    assert 'href="/console/feeds"' not in page.driver.page_source  # a tenant admin's menu
    page.click(f'button[aria-label="Revoke {shop["name"]}"]')
    page.heading(f"Revoke {shop['name']}?")
    assert not page.driver.find_elements("css selector", "#self-revoke")
    page.shot("22-revoke-asks-first")
    page.click("#confirm-revoke")
    assert f"Revoked {shop['name']}" in page.find("#notice").text
    page.click(f'button[aria-label="Revoke {me["name"]}"]')
    page.heading(f"Revoke {me['name']}?")
    assert "signs you out" in page.find("#self-revoke").text
    page.shot("23-revoke-yourself-asks-first")
    page.click("#confirm-revoke")
    page.heading("Sign in")
    page.shot("24-revoked-yourself-signed-out")
    page.visit("/console")
    page.heading("Sign in")


def test_an_operation_explains_itself_on_its_page(
    page: Page, server: ServerProcess, provider: ProviderProcess
) -> None:
    """Issue 37 item 2: an unknown payout's page says what was asked (amount in minor units),
    the sink key, who asked (by name) and why it is unknown (the provider's 503); a conflict's
    page says clients are answered 409 and shows both results; times are readable UTC."""
    from tests.e2e.test_payouts import evidence_for

    base = server.base_url
    owner = new_principal(base, tenant="acme")
    payout = {"beneficiary": "Explained Ltd", "amount": 1234, "currency": "EUR"}
    views = []
    for idem in ("po-explain-" + uuid.uuid4().hex[:8], "po-explain-c-" + uuid.uuid4().hex[:8]):
        provider.arm("error_5xx")
        lost = httpx.post(
            f"{base}/v1/payouts",
            json=payout,
            headers={**auth(owner["api_key"]), "Idempotency-Key": idem},
            timeout=30,
        )
        assert lost.status_code == 504, lost.text
        answer = httpx.get(
            f"{base}/v1/operations/{lost.headers['operation-id']}", headers=auth(ADMIN_KEY)
        )
        views.append(answer.json())
    unknown, conflicted = views
    for reference in ("pay_one", "pay_two"):  # two observers, two different outcomes
        observer = new_principal(base, role="observer")["api_key"]
        seen = httpx.post(
            f"{base}/v1/observations",
            json=evidence_for(conflicted, reference=reference),
            headers=auth(observer),
        )
        assert seen.status_code == 202, seen.text

    page.sign_in(ADMIN_KEY, then=f"/console/operations/{unknown['id']}")
    page.heading("Operation")
    assert page.find("#op-state").text == "unknown"
    asked = page.find("#request").text
    assert "Explained Ltd" in asked and "1234 EUR minor units" in asked
    assert page.find("#op-sink-key").text == f"{unknown['id']}:1"
    assert owner["name"] in page.find("#op-principal").text
    assert "provider answered 503" in page.find("#last-error").text
    assert "provider answered 503" in page.find("#why").text
    text = page.text()
    assert " UTC" in text
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", text)  # no ISO timestamps
    assert not re.search(r"\b1[7-9]\d{8}(\.\d+)?\b", text)  # nor Unix seconds
    page.shot("16-operation-explains")

    page.visit(f"/console/operations/{conflicted['id']}")
    page.heading("Operation")
    assert page.find("#op-state").text == "conflict"
    answered = page.find("#clients-answered").text
    assert "409" in answered and "/problems/operation-conflict" in answered
    results = page.find("#conflicting-results").text
    assert results.count("completed") == 2 and "pay_one" in results
    assert "stored on the row" in results and "Only its digest and status are kept" in results
    page.shot("16-operation-explains-conflict")
