"""The fakes stand in for the real stores, leases and wake-ups. mypy checks both against the
ports the use cases take (service/app/ports.py); this checks in addition that each method a
fake shares with what it stands in for takes the same parameters, with the same defaults (a
port does not say what a default is), or a changed store call would pass here against a fake
that no longer matches and fail only against PostgreSQL or Redis."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from service.app.late import LateAnswers
from service.leases import LeaseManager, Wakeups
from service.store.retention import RetentionStore
from service.store.settlement import SettlementStore
from service.store.settlement_reads import SettlementReads
from tests.usecases.fakes import (
    FakeLate,
    FakeLeases,
    FakeReads,
    FakeStore,
    FakeTombstones,
    FakeWakeups,
)

FAKES: list[tuple[type, type, set[str]]] = [
    # (fake, what it stands in for, the fake's own methods tests arrange it with)
    (FakeStore, SettlementStore, {"put", "row"}),
    (FakeReads, SettlementReads, set()),
    (FakeLeases, LeaseManager, {"hold", "steal"}),
    (FakeWakeups, Wakeups, {"publish"}),
    (FakeTombstones, RetentionStore, set()),
    (FakeLate, LateAnswers, set()),
]


def _public_methods(cls: type) -> dict[str, Callable[..., object]]:
    return {
        name: value
        for name, value in vars(cls).items()
        if not name.startswith("_") and callable(value)
    }


def _parameters(function: Callable[..., object]) -> list[tuple[str, object, object]]:
    signature = inspect.signature(function)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(
    ("fake", "real", "own"), FAKES, ids=[fake.__name__ for fake, _, _ in FAKES]
)
def test_a_fakes_methods_take_what_the_real_ones_take(
    fake: type, real: type, own: set[str]
) -> None:
    methods = _public_methods(fake)
    assert own <= set(methods), own - set(methods)
    assert not any(hasattr(real, name) for name in own)  # those it shares are compared
    for name, method in methods.items():
        if name in own:
            continue
        assert hasattr(real, name), f"{fake.__name__}.{name}: {real.__name__} has no {name}"
        expected = getattr(real, name)
        assert _parameters(method) == _parameters(expected), f"{fake.__name__}.{name}"
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(expected), (
            f"{fake.__name__}.{name}"
        )
