"""What the processes under test use: peak RSS of the workers and CPU time of each group of
processes, sampled by a background thread while a block of load runs.

Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

# Between samples of RSS and CPU time (psutil reads /proc: cheap, but not free).
RSS_INTERVAL = 0.1
# Connections per worker are counted every this many samples (about once a second).
CONNECTIONS_EVERY = 10
# A sampler thread is asked to stop, then waited for this long (it wakes at least this often).
JOIN_TIMEOUT = 5.0

MIB = 1024 * 1024


@dataclass
class Usage:
    """What the processes of a scenario used: peak RSS of each worker, CPU of each group."""

    peak_rss_mib: dict[int, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    # every CPU of the machine, busy (not idle, not waiting on I/O), whoever used it
    machine_busy_seconds: float = 0.0
    worker_cpu_seconds: dict[int, float] = field(default_factory=dict)
    # most client connections each worker held at once (a server's workers share one
    # listening socket: the kernel decides which worker accepts a connection)
    worker_connections: dict[int, int] = field(default_factory=dict)
    # commands Redis processed meanwhile, whoever sent them (bench.runner counts them)
    redis_commands: int = 0
    # CPU seconds of a part of a group, kept apart from the groups' sum (bench.runner: the
    # PostgreSQL processes that serve no connection)
    within: dict[str, float] = field(default_factory=dict)

    @property
    def worker_cores(self) -> list[float]:
        if self.wall_seconds <= 0:
            return []
        return [
            round(self.worker_cpu_seconds.get(pid, 0.0) / self.wall_seconds, 2)
            for pid in sorted(self.peak_rss_mib)
        ]

    @property
    def connection_split(self) -> str:
        """The client connections each worker held at most, in pid order: ``12/20``."""
        counts = self.worker_connections
        return "/".join(str(counts[pid]) for pid in sorted(counts))

    @property
    def rss_values(self) -> list[float]:
        return [round(self.peak_rss_mib[pid], 1) for pid in sorted(self.peak_rss_mib)]

    def cores(self, group: str) -> float:
        if self.wall_seconds <= 0:
            return 0.0
        return self.cpu_seconds.get(group, 0.0) / self.wall_seconds

    @property
    def other_cores(self) -> float:
        """CPU the machine spent on anything but the measured processes: other programs on a
        shared machine (and the kernel's share that no process is charged for)."""
        if self.wall_seconds <= 0:
            return 0.0
        ours = sum(self.cpu_seconds.values())
        return max(0.0, self.machine_busy_seconds - ours) / self.wall_seconds


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds() -> float:
    """CPU seconds used by this process and its reaped children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def in_background(name: str, loop: Callable[[threading.Event], None]) -> Iterator[None]:
    """Run ``loop(stop)`` in a daemon thread while the block runs; at its end set ``stop`` and
    wait for the thread (JOIN_TIMEOUT at most)."""
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(JOIN_TIMEOUT)


ProcessGroup = Callable[[], list[psutil.Process]]


@contextlib.contextmanager
def sample(
    workers: Sequence[psutil.Process],
    connections: Callable[[], dict[int, int]] | None = None,
    **groups: ProcessGroup,
) -> Iterator[Usage]:
    """Sample the workers' RSS, and the CPU time of the workers and of each other group
    (e.g. PostgreSQL: its postmaster and backends), every RSS_INTERVAL while the block runs.

    CPU is counted from the first sample for processes alive then, from zero for processes
    that start later (a backend of a new connection); a process that ends between two
    samples loses at most one interval.
    """
    usage = Usage({p.pid: 0.0 for p in workers})
    everything: dict[str, ProcessGroup] = {"workers": lambda: list(workers), **groups}
    first: dict[tuple[str, int], float] = {}
    last: dict[tuple[str, int], float] = {}

    machine_before = machine_busy_seconds()

    def take(initial: bool) -> None:
        for name, members in everything.items():
            try:
                procs = members()
            except psutil.Error:
                continue
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    cpu = times.user + times.system
                    key = (name, p.pid)
                    first.setdefault(key, cpu if initial else 0.0)
                    last[key] = cpu
                    if name == "workers":
                        rss = p.memory_info().rss / MIB
                        usage.peak_rss_mib[p.pid] = max(usage.peak_rss_mib[p.pid], rss)

    def loop(stop: threading.Event) -> None:
        rounds = 0
        while not stop.wait(RSS_INTERVAL):
            take(initial=False)
            rounds += 1
            if connections is not None and rounds % CONNECTIONS_EVERY == 0:
                with contextlib.suppress(psutil.Error, OSError):
                    for pid, n in connections().items():
                        seen = usage.worker_connections.get(pid, 0)
                        usage.worker_connections[pid] = max(seen, n)

    take(initial=True)
    began = time.monotonic()
    try:
        with in_background("usage-sampler", loop):
            yield usage
    finally:
        take(initial=False)
        usage.wall_seconds = time.monotonic() - began
        usage.cpu_seconds = dict.fromkeys(everything, 0.0)
        for key, cpu in last.items():
            usage.cpu_seconds[key[0]] += cpu - first[key]
            if key[0] == "workers":
                usage.worker_cpu_seconds[key[1]] = cpu - first[key]
        usage.machine_busy_seconds = machine_busy_seconds() - machine_before


@dataclass
class RssSeries:
    """RSS and USS of each worker (in pid order) every ``interval`` seconds."""

    pids: list[int]
    samples: list[dict[str, Any]] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)

    def take(self, workers: list[psutil.Process], t: float) -> None:
        rss: list[float | None] = []
        uss: list[float | None] = []
        for p in workers:
            try:
                info = p.memory_full_info()
            except psutil.Error:
                self.lost.add(p.pid)
                rss.append(None)
                uss.append(None)
                continue
            rss.append(round(info.rss / MIB, 2))
            uss.append(round(info.uss / MIB, 2))
        self.samples.append({"t_s": round(t, 1), "rss_mib": rss, "uss_mib": uss})

    def column(self, i: int, what: str = "rss_mib") -> list[tuple[float, float]]:
        return [(s["t_s"], s[what][i]) for s in self.samples if s[what][i] is not None]


@contextlib.contextmanager
def sample_series(
    workers: list[psutil.Process], interval: float, began: float, series: RssSeries
) -> Iterator[RssSeries]:
    """Sample every ``interval`` seconds from ``began`` (t = 0, interval, 2 interval, ...)
    while the block runs; one last sample when it ends."""

    def loop(stop: threading.Event) -> None:
        k = 1
        while not stop.wait(max(0.0, began + k * interval - time.monotonic())):
            series.take(workers, time.monotonic() - began)
            k += 1

    series.take(workers, time.monotonic() - began)
    try:
        with in_background("rss-series", loop):
            yield series
    finally:
        series.take(workers, time.monotonic() - began)
