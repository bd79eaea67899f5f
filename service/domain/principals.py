"""Who calls: a principal (a tenant's client, observer or admin) and its role.

Every layer above the core names them (the store reads and writes them, the use cases check
them, HTTP authenticates into them), so they live here, below all of those, and import
nothing of ``service``.
"""

from __future__ import annotations

import enum
import uuid

import msgspec

__all__ = ["Principal", "Role"]


class Role(enum.StrEnum):
    CLIENT = "client"
    OBSERVER = "observer"
    ADMIN = "admin"


class Principal(msgspec.Struct, frozen=True):
    id: uuid.UUID
    tenant: str
    name: str
    role: Role
    credential_generation: int
    all_tenants: bool = False

    def may_act_in(self, tenant: str) -> bool:
        return self.all_tenants or self.tenant == tenant
