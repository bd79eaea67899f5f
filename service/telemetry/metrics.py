"""In-process counters rendered in the Prometheus text exposition format."""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["Metrics"]

_HELP = {
    "settlement_observations_total": "Observations settled, by source and disposition.",
    "settlement_conflicts_total": "Operations that entered or grew a conflict.",
    "settlement_claims_total": "Claims of operations for a new attempt, by kind.",
    "settlement_terminal_total": "Operations that became terminal (completed, failed, conflict).",
    "settlement_sweeper_demotions_total": "In-progress operations demoted by the sweeper.",
    "settlement_late_responses_total": "Provider answers settled after their attempt gave up.",
    "settlement_stale_epoch_outcomes_total": (
        "Verified terminal outcomes of a superseded epoch (possible duplicate effect)."
    ),
    "settlement_purged_operations_total": "Expired terminal operations moved to tombstones.",
    "settlement_forgotten_tombstones_total": "Tombstones deleted after their retention.",
}
_GAUGE_HELP = {
    "settlement_oldest_open_operation_age_seconds": (
        "Age of the oldest in_progress, unknown or conflict operation (0: none), as of the "
        "last purge pass of this process."
    ),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._gauges: dict[str, float] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        if name not in _HELP:
            raise KeyError(f"undeclared metric {name}")
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float) -> None:
        if name not in _GAUGE_HELP:
            raise KeyError(f"undeclared gauge {name}")
        with self._lock:
            self._gauges[name] = value

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            if name in _GAUGE_HELP:
                return self._gauges.get(name, 0.0)
            return self._counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    # -- hooks called by the settlement store and workers --------------------------------------

    def on_settled(self, source: str, disposition: str) -> None:
        self.inc("settlement_observations_total", source=source, disposition=disposition)
        if disposition == "conflict":
            self.inc("settlement_conflicts_total")

    def on_stale_epoch_outcome(self) -> None:
        self.inc("settlement_stale_epoch_outcomes_total")

    def on_claimed(self, kind: str) -> None:
        self.inc("settlement_claims_total", kind=kind)

    def on_progress_ended(self, operation_id: str, terminal: bool) -> None:
        if terminal:
            self.inc("settlement_terminal_total")

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, help_text in _HELP.items():
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} counter")
                series = self._counters.get(name) or {(): 0.0}
                for labels, value in sorted(series.items()):
                    rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    suffix = f"{{{rendered}}}" if rendered else ""
                    lines.append(f"{name}{suffix} {value:g}")
            for name, help_text in _GAUGE_HELP.items():
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} gauge")
                lines.append(f"{name} {self._gauges.get(name, 0.0):g}")
        return "\n".join(lines) + "\n"
