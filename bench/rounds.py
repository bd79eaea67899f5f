"""What ``make bench`` makes of its rounds: the order each round runs in, and the median and
spread of a figure measured once per round, so that a ratio whose rounds disagree is flagged
rather than read as a result. Pure functions, no I/O.

The spread of a figure is ``(max - min) / median`` over its rounds; a spread above
``DISAGREE`` (15 %) flags it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["DISAGREE", "Spread", "ratio_rounds", "rotated", "spread"]

# Rounds of one figure whose extremes differ by more than this share of their median disagree.
DISAGREE = 0.15

T = TypeVar("T")


@dataclass(frozen=True)
class Spread:
    """One figure over its rounds: median, extremes and each round's value (round order)."""

    median: float
    low: float
    high: float
    rounds: tuple[float, ...]

    @property
    def relative(self) -> float:
        """``(max - min) / median`` (0.0 for a median of 0)."""
        return (self.high - self.low) / abs(self.median) if self.median else 0.0

    @property
    def flagged(self) -> bool:
        """More than one round, and they disagree by more than ``DISAGREE``."""
        return len(self.rounds) > 1 and self.relative > DISAGREE

    def as_dict(self, digits: int = 3) -> dict[str, Any]:
        return {
            "median": round(self.median, digits),
            "min": round(self.low, digits),
            "max": round(self.high, digits),
            "spread": round(self.relative, 3),
            "rounds": [round(value, digits) for value in self.rounds],
            "flagged": self.flagged,
        }


def spread(values: Sequence[float]) -> Spread:
    """The median, min and max of ``values`` (one per round, at least one)."""
    if not values:
        raise ValueError("a spread needs at least one value")
    return Spread(statistics.median(values), min(values), max(values), tuple(values))


def ratio_rounds(
    numerators: Sequence[float | None], denominators: Sequence[float | None]
) -> Spread | None:
    """The ratio computed in each round (round ``i`` of one side over round ``i`` of the
    other), then its spread; a round where a side is missing or the denominator is zero is
    left out; None when no round is left."""
    ratios = [
        a / b
        for a, b in zip(numerators, denominators, strict=True)
        if a is not None and b is not None and b != 0
    ]
    return spread(ratios) if ratios else None


def rotated(items: Sequence[T], turn: int, rounds: int = 0) -> list[T]:
    """``items`` started at another place each turn: by ``turn * len(items) // rounds`` (so
    ``rounds`` turns start spread evenly over the list) or, without ``rounds``, by ``turn``."""
    if not items:
        return []
    step = turn * len(items) // rounds if rounds > 0 else turn
    start = step % len(items)
    return [*items[start:], *items[:start]]
