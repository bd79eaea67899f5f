"""Servers a dead owner left running on a data directory: found by their working directory
and program, stopped with the server's own stop signal, killed if they outlast it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from devstack.supervise import KILL_WAIT, POLL_INTERVAL, EmbeddedServiceError

__all__ = ["processes_in", "stop_leftover"]

log = logging.getLogger("settlement.embedded")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has finished, it only waits to be reaped)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rpartition(")")[2].split()[0] != "Z"


def processes_in(cwd: Path, program: Path) -> list[int]:
    """Live processes running ``program`` (by file name) with ``cwd`` as their directory."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/cwd") != str(cwd):
                continue
            exe = os.readlink(f"/proc/{entry.name}/exe")
        except OSError:  # gone, a zombie, or another user's
            continue
        if Path(exe.removesuffix(" (deleted)")).name == program.name:
            found.append(int(entry.name))
    return found


def _wait_gone(pids: Sequence[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def stop_leftover(
    name: str,
    where: Path,
    pids: Sequence[int],
    *,
    leader: int,
    stop_signal: signal.Signals,
    stop_timeout: float,
) -> None:
    """Stop the processes of a ``name`` server a dead owner left on ``where`` (call it only
    holding the server's lock: a live owner's server is no leftover).

    ``leader`` gets ``stop_signal`` if it is among ``pids`` (else every one of them does);
    whatever still runs after ``stop_timeout`` is killed.
    """
    targets = [leader] if leader in pids else pids
    log.warning("stopping a leftover %s on %s (pids %s)", name, where, list(pids))
    _signal_all(targets, stop_signal)
    _signal_all(pids, signal.SIGCONT)  # a stopped process handles no signal but SIGKILL
    if not _wait_gone(pids, stop_timeout):
        _signal_all(pids, signal.SIGKILL)
        if not _wait_gone(pids, KILL_WAIT):
            raise EmbeddedServiceError(f"leftover {name} on {where} will not die: {list(pids)}")


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
