"""Why an operation is where it is (service.app.explain) and what the console shows of its
request (service.http.console.timeline.request_facts): pure, views in, words out."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from service.app.explain import explain
from service.http.console.timeline import readable_utc, request_facts
from service.store.status import (
    AttemptView,
    EpochView,
    LeaseView,
    ObservationView,
    OperationView,
    ResultView,
)

NOW = datetime(2026, 12, 5, 6, 31, 7, 250_000, tzinfo=UTC)


def attempt(
    token: int, *, error: str | None = None, finished: bool = True, epoch: int = 1
) -> AttemptView:
    return AttemptView(
        id=uuid.uuid4(),
        fencing_token=token,
        binding_generation=epoch,
        started_at=NOW,
        finished_at=NOW if finished else None,
        outcome="unknown" if finished else None,
        response_status=None,
        error=error,
    )


def observation(source: str, **fields: Any) -> ObservationView:
    values: dict[str, Any] = {
        "id": 1,
        "source": source,
        "kind": "unknown",
        "verified": True,
        "stage": "B",
        "disposition": "applied",
        "reason": "lease-ended",
        "revision_before": 1,
        "revision_after": 2,
        "detail": None,
        "created_at": NOW,
    }
    return ObservationView(**(values | fields))


def make_view(**fields: Any) -> OperationView:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant": "acme",
        "principal_id": uuid.uuid4(),
        "key": "k",
        "route": "POST /v1/payouts",
        "state": "unknown",
        "binding_generation": 1,
        "request_fingerprint": "f" * 64,
        "revision": 2,
        "created_at": NOW,
        "updated_at": NOW,
        "expires_at": None,
        "result": None,
        "lease": None,
        "attempts": [],
        "epochs": [],
        "conflict": None,
        "observations": [],
    }
    return OperationView(**(values | fields))


def test_an_unknown_operation_gives_its_last_attempts_error_with_the_figure() -> None:
    view = make_view(
        attempts=[
            attempt(1, error="provider answered 503"),
            attempt(2, error="timed out after 2 s"),
        ]
    )
    said = explain(view)
    assert said.last_error == "timed out after 2 s"
    assert said.why.startswith("Attempt 2 got no definitive answer: timed out after 2 s.")
    assert "retry" in said.why and said.clients_answered is None


def test_after_a_supersede_only_the_current_epochs_attempts_explain_it() -> None:
    """An earlier epoch's attempt ran under another sink key: it neither explains the
    current epoch nor is covered by "the provider never pays twice"; its possible payment is
    named instead."""
    view = make_view(
        binding_generation=2,
        sink_key="op:2",
        attempts=[attempt(1, error="provider answered 503", epoch=1)],
        epochs=[
            EpochView(
                binding_generation=1,
                request_fingerprint="f" * 64,
                final_state="unknown",
                result_digest=None,
                reason="supersede",
                superseded_by=None,
                superseded_at=NOW,
            )
        ],
    )
    said = explain(view)
    assert said.why.startswith("No attempt has run in this reservation epoch yet.")
    assert said.last_error is None
    earlier = f"{view.id}:1"
    assert f"Epoch 1 ended unknown: its sink key {earlier} may have been paid" in said.why
    assert "does not match op:2 against it" in said.why
    local = explain(make_view(binding_generation=2, epochs=view.epochs))
    assert "Epoch 1" not in local.why  # a local effect has no provider to have paid


def test_an_attempt_that_never_reported_is_explained_by_its_lease_and_the_sweeper() -> None:
    view = make_view(attempts=[attempt(1, finished=False)], observations=[observation("sweeper")])
    said = explain(view)
    assert said.why.startswith("Lease lost: attempt 1 never reported")
    assert "the lease sweeper marked the operation unknown" in said.why
    assert said.last_error is None


def test_in_progress_says_who_holds_the_lease_and_what_clients_are_answered() -> None:
    live = LeaseView(attempt=uuid.uuid4(), fencing_token=3, expires_at=NOW)
    said = explain(
        make_view(state="in_progress", attempts=[attempt(3, finished=False)], lease=live)
    )
    assert said.why.startswith("Attempt 3 holds the lease")
    assert said.clients_answered is not None
    assert (said.clients_answered.status, said.clients_answered.type) == (
        409,
        "/problems/operation-in-progress",
    )
    gone = LeaseView(attempt=uuid.uuid4(), fencing_token=3, expires_at=None)
    said = explain(make_view(state="in_progress", lease=gone))
    assert "no longer holds its lease" in said.why


def test_a_conflict_shows_both_results_and_the_409_clients_get() -> None:
    stored = ResultView(status=201, digest="a" * 64, content_type="application/json", body={"x": 1})
    view = make_view(
        state="conflict",
        result=stored,
        conflict={"digests": ["a" * 64, "b" * 64], "kinds": ["completed", "failed"]},
        observations=[
            observation("observer", kind="completed", result_status=201, result_digest="a" * 64),
            observation("observer", kind="failed", result_status=402, result_digest="b" * 64),
        ],
    )
    said = explain(view)
    assert said.clients_answered is not None
    assert (said.clients_answered.status, said.clients_answered.type) == (
        409,
        "/problems/operation-conflict",
    )
    assert said.conflicting_results is not None
    first, second = said.conflicting_results
    assert (first.kind, first.status, first.stored, first.body) == (
        "completed",
        201,
        True,
        {"x": 1},
    )
    assert (second.kind, second.status, second.stored, second.body) == ("failed", 402, False, None)
    assert "completed and failed" in said.why and "409" in said.why


def test_a_settled_operation_says_its_answer_is_replayed() -> None:
    stored = ResultView(status=201, digest="a" * 64, content_type="application/json", body={})
    said = explain(make_view(state="completed", result=stored))
    assert said.clients_answered is not None and said.clients_answered.status == 201
    assert "replayed" in said.clients_answered.title or "stored" in said.clients_answered.title


def test_the_request_is_shown_field_by_field_with_amounts_in_minor_units() -> None:
    view = make_view(request={"beneficiary": "ACME", "amount": 1234, "currency": "EUR"})
    assert request_facts(view) == [
        ("beneficiary", "ACME"),
        ("amount", "1234 EUR minor units"),
        ("currency", "EUR"),
    ]
    assert request_facts(make_view()) is None  # claimed before requests were kept


def test_times_read_as_utc_to_the_second() -> None:
    assert readable_utc(NOW) == "2026-12-05 06:31:07 UTC"


def test_only_an_external_operation_names_the_provider_and_its_sink_key() -> None:
    local = explain(make_view(route="POST /v1/transfers", attempts=[attempt(1, error="busy")]))
    assert "provider" not in local.why and "retry" in local.why
    view = make_view(attempts=[attempt(1, error="provider answered 503")])
    view.sink_key = f"{view.id}:1"
    external = explain(view)
    assert f"sink key, {view.id}:1, and never pays twice" in external.why
