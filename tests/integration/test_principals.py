"""Principals against real PostgreSQL: concurrent creation and the bootstrap admin."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.domain.principals import Role
from service.store.db import async_url
from service.store.migrate import upgrade
from service.store.principals import PrincipalExists, PrincipalStore
from tests.conftest import Services, create_database

pytestmark = pytest.mark.integration


async def test_two_concurrent_creations_of_one_name_make_one_principal(
    engine: AsyncEngine, open_engine: object
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    stores = [PrincipalStore(open_engine()) for _ in range(4)]  # type: ignore[operator]
    made = await asyncio.gather(
        *(store.create(tenant, "twin", Role.CLIENT) for store in stores),
        return_exceptions=True,
    )
    created = [m for m in made if not isinstance(m, BaseException)]
    refused = [m for m in made if isinstance(m, BaseException)]
    assert len(created) == 1
    assert refused and all(isinstance(r, PrincipalExists) for r in refused), refused


async def test_a_bootstrap_key_that_is_another_principals_key_fails_once_not_forever(
    services: Services,
) -> None:
    url = await create_database(services, "bootstrap")
    await asyncio.to_thread(upgrade, url)
    engine = create_async_engine(async_url(url), pool_size=2)
    try:
        store = PrincipalStore(engine)
        _, key = await store.create("acme", "holder", Role.CLIENT)
        # no bootstrap admin yet, and its key is taken: one clear error, not a recursion
        with pytest.raises((PrincipalExists, IntegrityError)):
            await store.ensure_bootstrap_admin(key)
    finally:
        await engine.dispose()
