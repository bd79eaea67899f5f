"""An attempt's wait for its work while a heartbeat keeps the scope's lease.

The wait ends with whichever comes first of the work ending, the lease being lost, or a
time limit (an external call's provider timeout): :class:`Ended` says which.
"""

from __future__ import annotations

import asyncio
import enum
from typing import TypeVar

from service.app.ports import LeasePort
from service.failpoints import Failpoints
from service.leases import Lease

__all__ = ["Ended", "LeaseKeeper"]

T = TypeVar("T")


class Ended(enum.Enum):
    FINISHED = "finished"
    LEASE_LOST = "lease-lost"
    TIMED_OUT = "timed-out"


class LeaseKeeper:
    """Waits for an attempt's work while a heartbeat keeps the scope's lease."""

    def __init__(self, leases: LeasePort, failpoints: Failpoints) -> None:
        self._leases = leases
        self._failpoints = failpoints

    async def under_lease(
        self, lease: Lease, work: asyncio.Task[T], give_up_after: float | None
    ) -> Ended:
        """Wait for ``work`` while a heartbeat keeps ``lease``; say how the wait ended."""
        heartbeat = self._leases.heartbeat(
            lease, before_extend=lambda: self._failpoints.hit("lease.heartbeat")
        )
        lost = asyncio.ensure_future(heartbeat.lost.wait())
        try:
            async with heartbeat:
                await asyncio.wait(
                    {work, lost}, timeout=give_up_after, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            lost.cancel()
        if work.done():
            return Ended.FINISHED
        return Ended.LEASE_LOST if heartbeat.lost.is_set() else Ended.TIMED_OUT

    async def kept_lease(self, lease: Lease, work: asyncio.Task[T]) -> bool:
        """Wait for ``work`` (a local attempt's database work) while a heartbeat keeps
        ``lease``; False when the lease was lost first (``work`` is then cancelled, possibly
        mid-commit, and done)."""
        try:
            ended = await self.under_lease(lease, work, give_up_after=None)
        except BaseException:
            work.cancel()  # the request itself is being cancelled
            raise
        if ended is Ended.LEASE_LOST:
            work.cancel()
            await asyncio.wait({work})
            return False
        return True
