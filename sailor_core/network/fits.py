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

    def bandwidths_bytes_per_s(self, num_bytes):
        """``bandwidth_bytes_per_s`` of a numpy array of message sizes."""
        import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

        x = np.clip(np.log2(np.maximum(num_bytes, 1.0) / 1e6), _X_MIN, _X_MAX)
        bw = (self.a * x * x + self.b * x + self.c) * 1e9
        return np.where(bw > self.max_bw_bytes_per_s, self.max_bw_bytes_per_s, np.maximum(bw, MIN_BW_BYTES_PER_S))

    @classmethod
    def from_json(cls, entry: list) -> "BandwidthFit":
        (a, b, c), max_bw = entry
        return cls(a=float(a), b=float(b), c=float(c), max_bw_bytes_per_s=float(max_bw))
