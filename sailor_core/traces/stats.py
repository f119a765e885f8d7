"""Statistics of one pool of a trace, defined as in the spot_traces README (section 2)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sailor_core.traces.model import AvailabilityTrace, GpuZone


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStatistics:
    duration_s: float
    num_preemption_events: int     # distinct times with a loss
    num_preempted: int             # GPUs lost in all of them
    mtbp_gap_mean_s: float | None  # mean gap between consecutive preemption events
    mtbp_gap_median_s: float | None
    largest_drop: int
    min_count: int
    mean_count: float              # time-weighted over [0, duration]
    max_count: int

    @property
    def mean_bulk(self) -> float:
        return self.num_preempted / self.num_preemption_events if self.num_preemption_events else 0.0


def pool_statistics(trace: AvailabilityTrace, key: GpuZone, *, start_s: float = 0.0) -> PoolStatistics:
    end = trace.duration_s
    series = [(t, c) for t, c in trace.series(key)]
    weighted = 0.0
    counts_seen: list[int] = []
    for i, (t, c) in enumerate(series):
        t_next = series[i + 1][0] if i + 1 < len(series) else end
        a, b = max(t, start_s), min(t_next, end)
        if b > a:
            weighted += c * (b - a)
        if t <= end and (t_next > start_s or i + 1 == len(series)):
            counts_seen.append(c)
    span = end - start_s
    by_time: dict[float, int] = {}
    for e in trace.preemptions:
        if (e.gpu, e.zone) == key and e.time_s >= start_s:
            by_time[e.time_s] = by_time.get(e.time_s, 0) + e.num_gpus
    times = sorted(by_time)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return PoolStatistics(
        duration_s=end,
        num_preemption_events=len(times),
        num_preempted=sum(by_time.values()),
        mtbp_gap_mean_s=statistics.fmean(gaps) if gaps else None,
        mtbp_gap_median_s=statistics.median(gaps) if gaps else None,
        largest_drop=max(by_time.values(), default=0),
        min_count=min(counts_seen) if counts_seen else 0,
        mean_count=weighted / span if span > 0 else float(series[0][1]),
        max_count=max(counts_seen) if counts_seen else 0,
    )
