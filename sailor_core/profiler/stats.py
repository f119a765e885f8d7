"""Median-and-spread summaries of repeated timings (no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Repetitions:
    """How often each time is measured: untimed warm-ups, then timed repetitions (of forward and
    backward; of the optimizer's update after its first, state-creating step)."""

    warmups: int = 2
    reps: int = 10
    update_reps: int = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Repeated measurements of one quantity: the median is what profiles keep."""

    median_s: float
    p10_s: float
    p90_s: float
    num_samples: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the measurement was."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s,
                "num_samples": self.num_samples, "spread": self.spread}

    @classmethod
    def from_dict(cls, d: dict) -> "Timing":
        return cls(median_s=d["median_s"], p10_s=d["p10_s"], p90_s=d["p90_s"], num_samples=d["num_samples"])


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted ``xs``."""
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: list[float]) -> Timing:
    if not samples:
        raise ValueError("no samples to summarize")
    xs = sorted(samples)
    return Timing(median_s=_quantile(xs, 0.5), p10_s=_quantile(xs, 0.1), p90_s=_quantile(xs, 0.9),
                  num_samples=len(xs))
