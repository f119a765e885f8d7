"""Sailor's fitted bandwidth curves, evaluated only where they were measured.

A fit is ``bw(x) = a x^2 + b x + c`` GB/s with ``x = log2(bytes / 1e6)``,
measured with NCCL send/recv between 64 KiB and 1 GiB per pair.  Outside that
range the quadratic can go to zero or negative, so the message size is clamped
to the measured range and the bandwidth to ``[MIN_BW, max_bw]``: a smaller
message is no faster per byte than 64 KiB, a larger one no faster than 1 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

MIN_FIT_BYTES = 2**16
MAX_FIT_BYTES = 2**30
_X_MIN = math.log2(MIN_FIT_BYTES / 1e6)
_X_MAX = math.log2(MAX_FIT_BYTES / 1e6)
# A floor well below any measured link (RTX-3090's 1 Gbit/s is 0.115 GB/s) that keeps times finite.
MIN_BW_BYTES_PER_S = 10e6


@dataclass(frozen=True, slots=True, kw_only=True)
class BandwidthFit:
    a: float
    b: float
    c: float
    max_bw_bytes_per_s: float

    def bandwidth_bytes_per_s(self, num_bytes: float) -> float:
        """Aggregate bandwidth for a message of ``num_bytes`` per pair, clamped to the fit's range."""
        x = math.log2(max(num_bytes, 1.0) / 1e6)
        x = _X_MIN if x < _X_MIN else _X_MAX if x > _X_MAX else x
        bw = (self.a * x * x + self.b * x + self.c) * 1e9
        if bw > self.max_bw_bytes_per_s:
            return self.max_bw_bytes_per_s
        return bw if bw > MIN_BW_BYTES_PER_S else MIN_BW_BYTES_PER_S

    def least_time_s(self, num_bytes: float) -> float:
        """Seconds for a message of ``num_bytes`` per pair, never more than a larger message's.

        ``num_bytes / bandwidth`` alone is not monotone: some fits fall below zero at the small
        end of the measured range (A100-40's NVLink curve below ~210 KB per pair), where the
        bandwidth floor makes a 16 KB message slower than a 400 KB one.  A sender can always pad
        a message to a larger size, so the time is the least over this size and every larger one
        (the messages below the fit's good range cost what its fastest small message costs: a
        latency floor)."""
        if num_bytes <= 0:
            return 0.0
        t = num_bytes / self.bandwidth_bytes_per_s(num_bytes)
        x = math.log2(max(num_bytes, 1.0) / 1e6)
        for cx, ct in _time_minima(self.a, self.b, self.c, self.max_bw_bytes_per_s):
            if cx >= x and ct < t:
                t = ct
        return t

    @classmethod
    def from_json(cls, entry: list) -> "BandwidthFit":
        (a, b, c), max_bw = entry
        return cls(a=float(a), b=float(b), c=float(c), max_bw_bytes_per_s=float(max_bw))


def fitted_bandwidths_bytes_per_s(a, b, c, max_bw, num_bytes):
    """``BandwidthFit.bandwidth_bytes_per_s`` of a numpy array of message sizes, with the fit's
    constants as numbers or as numpy columns (one fit per row: many links timed at once)."""
    import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

    # (``np.clip``'s values, without its Python-level dispatch: a few us of each of thousands of calls)
    x = np.minimum(np.maximum(np.log2(np.maximum(num_bytes, 1.0) / 1e6), _X_MIN), _X_MAX)
    bw = (a * x * x + b * x + c) * 1e9
    return np.where(bw > max_bw, max_bw, np.maximum(bw, MIN_BW_BYTES_PER_S))


@lru_cache(maxsize=256)
def _time_minima(a: float, b: float, c: float, max_bw: float) -> tuple[tuple[float, float], ...]:
    """(x, seconds) where ``t(x) = 1e6 * 2**x / bw(x)`` may have its least value on the measured
    range: its ends, where the bandwidth meets a clamp, and where the unclamped curve's
    ``d ln t / dx = ln 2 - q'/q`` is zero; between them t is smooth without a stationary point,
    so the least time over ``[x, X_MAX]`` is at x or at one of these."""
    ln2 = math.log(2.0)
    xs = [_X_MIN, _X_MAX]
    xs += _roots(a, b, c - MIN_BW_BYTES_PER_S / 1e9) + _roots(a, b, c - max_bw / 1e9)
    xs += _roots(ln2 * a, ln2 * b - 2 * a, ln2 * c - b)
    fit = BandwidthFit(a=a, b=b, c=c, max_bw_bytes_per_s=max_bw)
    return tuple((x, 1e6 * 2**x / fit.bandwidth_bytes_per_s(1e6 * 2**x)) for x in xs if _X_MIN <= x <= _X_MAX)


def _roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of ``a x^2 + b x + c``."""
    if a == 0.0:
        return [-c / b] if b != 0.0 else []
    disc = b * b - 4 * a * c
    if disc < 0:
        return []
    r = math.sqrt(disc)
    return [(-b - r) / (2 * a), (-b + r) / (2 * a)]
