"""The metrics directory of one ``settlement serve``: where its workers' prometheus_client
files live (multiprocess mode, :mod:`service.telemetry.metrics`), made at start and removed at
exit, whatever happened to the workers."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from service.telemetry.feed_figures import FIGURES_FILE
from service.telemetry.metrics import MULTIPROC_VARIABLE

__all__ = ["METRICS_PREFIX", "server_metrics_dir"]

# The prefix of the metrics directory `settlement serve` makes when SETTLEMENT_METRICS_DIR is
# unset; the server's pid follows it, so the next server can remove a SIGKILLed one's.
METRICS_PREFIX = "settlement-metrics-"


@contextlib.contextmanager
def server_metrics_dir(configured: str | None) -> Iterator[None]:
    """The directory of this server's workers' metrics files (prometheus_client's
    multiprocess mode, service.telemetry.metrics), given to them as SETTLEMENT_METRICS_DIR
    and PROMETHEUS_MULTIPROC_DIR: SETTLEMENT_METRICS_DIR emptied of its files at start and at
    exit, or a fresh temporary directory removed at exit. Whatever happens to a worker, the
    directory goes with this process; one left by a SIGKILLed server is removed by the
    next."""
    if configured:
        shared = Path(configured)
        shared.mkdir(parents=True, exist_ok=True)
        _empty_metrics_dir(shared)
    else:
        _remove_orphaned_metrics_dirs(Path(tempfile.gettempdir()))
        shared = Path(tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}-"))
        os.environ["SETTLEMENT_METRICS_DIR"] = str(shared)
    os.environ[MULTIPROC_VARIABLE] = str(shared)
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_VARIABLE, None)
        if configured:
            _empty_metrics_dir(shared)
        else:
            os.environ.pop("SETTLEMENT_METRICS_DIR", None)
            shutil.rmtree(shared, ignore_errors=True)


def _empty_metrics_dir(shared: Path) -> None:
    """Remove an earlier server's figures: prometheus_client would add them to this one's,
    and its feed figures would be shown until this one's are read."""
    for old in shared.glob("*.db"):
        old.unlink(missing_ok=True)
    (shared / FIGURES_FILE).unlink(missing_ok=True)


def _remove_orphaned_metrics_dirs(parent: Path) -> None:
    """Remove the metrics directories of servers that are gone (killed before they could).
    A pid that was reused keeps its directory until the next start: never a live one's."""
    for path in parent.glob(f"{METRICS_PREFIX}*-*"):
        owner = path.name.removeprefix(METRICS_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
