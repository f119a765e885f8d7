"""The availability trace: GPUs per (GPU type, zone) over time, plus preemption events."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

GpuZone = tuple[str, str]  # (canonical GPU type, zone name)
Counts = Mapping[GpuZone, int]  # GPUs available per (type, zone)


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionEvent:
    """``num_gpus`` GPUs of one (type, zone) pool were reclaimed at ``time_s``.

    Kept apart from the counts because a pool can lose nodes and get them back
    within one tick (Bamboo's p2 file, Oobleck's swaps): the count does not move
    but whoever held those nodes still lost them.
    """

    time_s: float
    gpu: str
    zone: str
    num_gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AvailabilityTrace:
    """Piecewise-constant availability.

    ``rows`` are ``(time_s, counts)`` with ``time_s`` in seconds since the start of
    the trace (strictly increasing, first row at 0) and no two consecutive rows
    equal; row ``i`` holds until row ``i + 1``, the last row until ``end_s`` (when
    the observation window is known) or indefinitely.  ``counts`` has every key of
    ``keys`` (0 where nothing is available).
    """

    rows: tuple[tuple[float, Counts], ...]
    keys: tuple[GpuZone, ...]
    preemptions: tuple[PreemptionEvent, ...] = ()
    start_epoch_s: float | None = None
    end_s: float | None = None
    source: str = ""
    notes: tuple[str, ...] = ()
    _times: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_times", tuple(t for t, _ in self.rows))

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def duration_s(self) -> float:
        """Observed span: to ``end_s`` if known, else to the last change."""
        if self.end_s is not None:
            return self.end_s
        return self.rows[-1][0] if self.rows else 0.0

    def counts_at(self, time_s: float) -> Counts:
        """Availability of the last row at or before ``time_s``."""
        i = bisect.bisect_right(self._times, time_s) - 1
        return self.rows[max(i, 0)][1]

    def row(self, index: int) -> Counts:
        return self.rows[index][1]

    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({g for g, _ in self.keys}))

    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({z for _, z in self.keys}))

    def series(self, key: GpuZone) -> list[tuple[float, int]]:
        return [(t, c.get(key, 0)) for t, c in self.rows]


def build_trace(
    samples: list[tuple[float, dict[GpuZone, int]]],
    *,
    keys: tuple[GpuZone, ...] | None = None,
    preemptions: list[PreemptionEvent] | None = None,
    derive_preemptions: bool = True,
    start_epoch_s: float | None = None,
    end_s: float | None = None,
    source: str = "",
    notes: tuple[str, ...] = (),
) -> AvailabilityTrace:
    """Normalise ``samples`` (time-sorted, times relative to the start) into a trace.

    Samples at the same time keep the last one; consecutive identical rows merge.
    With ``derive_preemptions`` every drop of a pool's count becomes a preemption
    event, added to the explicit ``preemptions``.
    """
    if keys is None:
        keys = tuple(sorted({k for _, c in samples for k in c}))
    rows: list[tuple[float, dict[GpuZone, int]]] = []
    for t, counts in samples:
        full = {k: int(counts.get(k, 0)) for k in keys}
        if rows and rows[-1][0] == t:
            rows[-1] = (t, full)
        else:
            rows.append((t, full))
    if not rows:
        rows = [(0.0, {k: 0 for k in keys})]
    merged: list[tuple[float, dict[GpuZone, int]]] = []
    for t, counts in rows:
        if merged and merged[-1][1] == counts:
            continue
        merged.append((t, counts))
    events = list(preemptions or [])
    if derive_preemptions:
        for (_, before), (t, after) in zip(merged, merged[1:]):
            for k in keys:
                if after[k] < before[k]:
                    events.append(PreemptionEvent(time_s=t, gpu=k[0], zone=k[1], num_gpus=before[k] - after[k]))
    events.sort(key=lambda e: (e.time_s, e.gpu, e.zone))
    return AvailabilityTrace(
        rows=tuple(merged),
        keys=tuple(keys),
        preemptions=tuple(events),
        start_epoch_s=start_epoch_s,
        end_s=end_s,
        source=source,
        notes=notes,
    )
