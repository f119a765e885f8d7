"""How many GPUs of each type each zone of the embedded cloud has, over time.

Unlimited unless a trace or an explicit setting says otherwise. A trace is one
of ``sailor_core.traces``' formats (Sailor's CSV among them); its seconds are
divided by ``time_scale`` so a two-hour trace can play in two minutes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sailor_core.catalog import normalize_gpu_name
from sailor_core.traces import AvailabilityTrace, load_trace
from sailor_core.zones import parse_zone


class Capacity:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fixed: dict[tuple[str, str], int] = {}
        self._trace: AvailabilityTrace | None = None
        self._trace_t0 = 0.0
        self._time_scale = 1.0

    def set(self, gpu: str, zone: str, num_gpus: int | None) -> None:
        """Fix a pool's size (``None``: back to the trace, or unlimited)."""
        key = (normalize_gpu_name(gpu), parse_zone(zone).name)
        with self._lock:
            if num_gpus is None:
                self._fixed.pop(key, None)
            else:
                self._fixed[key] = max(0, int(num_gpus))

    def load_trace(self, path: str | Path, *, time_scale: float = 1.0) -> AvailabilityTrace:
        trace = load_trace(path)
        self.play(trace, time_scale=time_scale)
        return trace

    def play(self, trace: AvailabilityTrace, *, time_scale: float = 1.0) -> None:
        with self._lock:
            self._trace = trace
            self._trace_t0 = time.monotonic()
            self._time_scale = float(time_scale)

    def playing(self) -> tuple[AvailabilityTrace | None, float | None]:
        """The trace being played and how far into it we are (trace seconds)."""
        with self._lock:
            if self._trace is None:
                return None, None
            return self._trace, (time.monotonic() - self._trace_t0) * self._time_scale

    def trace_time_s(self) -> float | None:
        with self._lock:
            if self._trace is None:
                return None
            return (time.monotonic() - self._trace_t0) * self._time_scale

    def available(self, gpu: str | None, zone: str) -> int | None:
        """GPUs of the pool now; ``None`` means no limit."""
        if gpu is None:
            return None
        key = (gpu, zone)
        with self._lock:
            if key in self._fixed:
                return self._fixed[key]
            trace = self._trace
            t0, scale = self._trace_t0, self._time_scale
        if trace is None or key not in trace.keys:
            return None
        return int(trace.counts_at((time.monotonic() - t0) * scale).get(key, 0))

    def limited_pools(self) -> list[tuple[str, str]]:
        with self._lock:
            keys = set(self._fixed)
            if self._trace is not None:
                keys |= set(self._trace.keys)
        return sorted(keys)

    def describe(self) -> dict:
        return {f"{g}_{z}": self.available(g, z) for g, z in self.limited_pools()}
