"""A fresh :class:`~tests.usecases.world.World` per test, its late calls cancelled after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.usecases.world import World


@pytest.fixture
async def world() -> AsyncIterator[World]:
    made = World()
    yield made
    await made.close()
