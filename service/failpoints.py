"""Failpoints for crash testing, armed only with ``SETTLEMENT_ENABLE_FAILPOINTS=1``.

``SETTLEMENT_FAILPOINTS="name=action,..."`` where action is ``crash`` (the process ends at
once, as a power cut would: SIGKILL to itself), ``sleep:SECONDS`` or ``error`` (raises
:class:`FailpointError`). Names in use: ``claim.after``, ``effect.before_commit``,
``effect.before_statement``, ``effect.after_commit``, ``settle.after``, ``lease.heartbeat``,
and the feed observer's
``observer.event.before_commit|after_commit``, ``observer.quarantine.before|after``,
``observer.barrier.before|after``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from service.config import ConfigError, Settings
from service.serving import serving_pid

__all__ = ["NAMES", "FailpointError", "Failpoints"]

log = logging.getLogger("settlement.failpoints")

NAMES = frozenset(
    {
        "claim.after",
        "effect.before_commit",
        "effect.before_statement",
        "effect.after_commit",
        "settle.after",
        "lease.heartbeat",
        "observer.event.before_commit",
        "observer.event.after_commit",
        "observer.quarantine.before",
        "observer.quarantine.after",
        "observer.barrier.before",
        "observer.barrier.after",
    }
)


class FailpointError(RuntimeError):
    """Raised by an ``error`` failpoint: behaves like a bug at that line."""


class Failpoints:
    def __init__(self, actions: dict[str, str]) -> None:
        self._actions = actions

    @classmethod
    def from_settings(cls, settings: Settings) -> Failpoints:
        if not settings.enable_failpoints or not settings.failpoints.strip():
            return cls({})
        actions: dict[str, str] = {}
        for item in settings.failpoints.split(","):
            name, sep, action = item.strip().partition("=")
            if not sep or name not in NAMES:
                raise ConfigError(
                    f"SETTLEMENT_FAILPOINTS: unknown failpoint {item!r}; known: {sorted(NAMES)}"
                )
            if action not in ("crash", "error") and not _is_sleep(action):
                raise ConfigError(f"SETTLEMENT_FAILPOINTS: bad action {action!r} for {name}")
            actions[name] = action
        return cls(actions)

    def armed(self, name: str) -> bool:
        return name in self._actions

    async def hit(self, name: str) -> None:
        action = self._actions.get(name)
        if action is None:
            return
        log.warning("failpoint hit", extra={"failpoint": name, "action": action})
        if action == "crash":
            # the whole server, as a power cut would: its serving process first (a granian
            # worker would otherwise be replaced), then this process before it runs on
            server = serving_pid()
            if server is not None:
                os.kill(server, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "error":
            raise FailpointError(f"failpoint {name}")
        else:
            await asyncio.sleep(float(action.split(":", 1)[1]))


def _is_sleep(action: str) -> bool:
    kind, _, seconds = action.partition(":")
    try:
        return kind == "sleep" and float(seconds) >= 0
    except ValueError:
        return False
