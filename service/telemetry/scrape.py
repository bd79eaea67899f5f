"""What a scrape of ``/metrics`` collects: the figures recorded (every worker's, summed, with
a metrics directory), then those made when it is scraped: the build's
(``settlement_build_info``) and every worker process's (prometheus_client's ``process_*``,
labelled ``pid``).

**Which workers.** Without a metrics directory, this process. With one, every process that
has files there (each worker makes its own when its :class:`service.telemetry.Metrics` is
made, so a worker shows from its start), is alive and has this process's parent (the workers
of one ``settlement serve`` are siblings; a dead worker's pid given to another program is not
read). The scraping worker reads the kernel's ``/proc/<pid>`` files of each (prometheus_client's
``ProcessCollector``): five small files per worker, no database, no other process involved.

**Dead workers' gauges.** A per-worker gauge (``multiprocess_mode="liveall"``: one series per
worker, labelled ``pid``) of a worker that is gone is dropped at the next scrape
(``mark_process_dead`` removes that worker's ``gauge_live*`` files only: its counters stay in
the totals).
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from service import package_version

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Metric
    from prometheus_client.registry import Collector

__all__ = ["build_info", "recorded", "worker_processes"]

# prometheus_client's file of one process in a metrics directory: <kind>[_<mode>]_<pid>.db
_PID_OF_FILE = re.compile(r"_(\d+)\.db$")


def recorded(shared_dir: str | None, declared: CollectorRegistry) -> Collector:
    """The figures recorded: with a metrics directory every worker's, summed from the files
    (``MultiProcessCollector``) in the declared order, with the metrics no worker has a
    series of yet as this process declares them (no samples), as a scrape of one process
    shows them, the gone workers' per-worker gauges dropped first; without one, this
    process's (``declared``)."""
    from prometheus_client import Metric
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import Collector

    if shared_dir is None:

        class Own(Collector):
            def collect(self) -> Iterable[Metric]:
                return declared.collect()

        return Own()
    shared = Path(shared_dir)

    class Workers(Collector):
        def __init__(self) -> None:
            # prometheus_client leaves this constructor unannotated; None: not registered
            self._files = MultiProcessCollector(None, path=shared_dir)  # type: ignore[no-untyped-call]

        def collect(self) -> Iterable[Metric]:
            _forget_gone(shared)
            files = self._files.collect()  # type: ignore[no-untyped-call]  # as above
            found = {metric.name: metric for metric in files}
            for family in declared.collect():
                yield found.pop(family.name, None) or Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            yield from found.values()

    return Workers()


def build_info() -> Collector:
    """``settlement_build_info{version,python} 1``: what runs, for a dashboard and for
    alerts that join on it."""
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    family = GaugeMetricFamily(
        "settlement_build_info",
        "The running build: the settlement package's version and Python's (always 1).",
        labels=["python", "version"],
    )
    family.add_metric([platform.python_version(), package_version()], 1.0)

    class BuildInfo(Collector):
        def collect(self) -> Iterable[Metric]:
            return [family]

    return BuildInfo()


def worker_processes(shared_dir: str | None) -> Collector:
    """Every live worker's ``process_*`` figures (CPU seconds, resident and virtual memory,
    open and maximum file descriptors, start time), each series labelled ``pid``."""
    from prometheus_client import Metric, ProcessCollector
    from prometheus_client.registry import Collector

    readers: dict[int, ProcessCollector] = {}

    def reader(pid: int) -> ProcessCollector:
        found = readers.get(pid)
        if found is None:  # reads the boot time once; registered nowhere
            found = readers[pid] = ProcessCollector(pid=lambda: pid, registry=None)
        return found

    class Workers(Collector):
        def collect(self) -> Iterable[Metric]:
            pids = [os.getpid()]
            if shared_dir is not None:
                pids = _workers(Path(shared_dir))[0]
            for gone in readers.keys() - set(pids):
                del readers[gone]
            families: dict[str, Metric] = {}
            for pid in pids:
                for figures in reader(pid).collect():
                    family = families.get(figures.name)
                    if family is None:
                        family = families[figures.name] = Metric(
                            figures.name, figures.documentation, figures.type
                        )
                    for sample in figures.samples:
                        family.add_sample(
                            sample.name, {**sample.labels, "pid": str(pid)}, sample.value
                        )
            return families.values()

    return Workers()


def _workers(shared: Path) -> tuple[list[int], set[int]]:
    """The live workers of the server whose metrics directory is ``shared`` (this process
    among them), and the pids of the gone ones' files. Without ``/proc`` (not Linux): this
    process only, and none gone."""
    me = os.getpid()
    if _parent_of(me) is None:
        return [me], set()
    parent = os.getppid()
    pids = {int(m[1]) for path in shared.glob("*.db") if (m := _PID_OF_FILE.search(path.name))}
    live = {me} | {pid for pid in pids if _parent_of(pid) == parent}
    return sorted(live), pids - live


def _forget_gone(shared: Path) -> None:
    """Remove the per-worker gauges of the workers that are gone (their ``gauge_live*``
    files, by prometheus_client's ``mark_process_dead``; their counters stay)."""
    from prometheus_client.multiprocess import mark_process_dead

    for pid in _workers(shared)[1]:
        if any(shared.glob(f"gauge_live*_{pid}.db")):
            mark_process_dead(pid, str(shared))  # type: ignore[no-untyped-call]


def _parent_of(pid: int) -> int | None:
    """The parent pid of live process ``pid`` (None: gone, or not readable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    if len(fields) < 2 or fields[0] == b"Z":  # a zombie is gone too
        return None
    return int(fields[1])
