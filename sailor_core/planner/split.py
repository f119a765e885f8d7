"""Uneven layer split: the contiguous partition of layers over a fixed stage sequence that
minimises the busiest stage's time ``n_i * t_i`` subject to every stage fitting in memory.

For a bound ``tau`` a greedy pass (each stage takes as many layers as its time
budget ``tau / n_i`` and its memory allow, leaving one layer for each later
stage) finds a feasible split whenever one exists: taking more layers early
only shrinks what later stages must hold, and a stage's memory only falls
when it starts later.  Bisection on ``tau`` then gives the min-max split to a
relative tolerance; ``Kind.max_end`` memoises the memory limits per
(start layer, micro-batches in flight), so repeated splits over the same kinds
are cheap.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from sailor_core.planner.kinds import Kind

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class StageSlot:
    kind: Kind
    num_microbatches: int  # the busiest replica's micro-batches per iteration
    num_inflight: int
    dp_degree: int = 1  # the stage's replicas (what ZeRO shards over: Kind.max_end)


def greedy_split(slots: list[StageSlot], num_layers: int, tau: float,
                 memory_hits: list[int] | None = None) -> list[int] | None:
    """Stage end indices for bound ``tau`` (``inf`` = memory only), or None if infeasible;
    ``memory_hits`` (bounded ``tau`` only) gets the start layer of each stage its memory, not its
    time budget, ended."""
    ends: list[int] = []
    start = 0
    limit = num_layers - len(slots)  # stage i leaves one layer for each later stage
    bounded = tau != _INF
    for slot in slots:
        kind = slot.kind
        limit += 1
        end = limit
        if bounded:
            cum = kind.comp_cum
            within = bisect_right(cum, cum[start] + tau / slot.num_microbatches) - 1
            if within < end:
                end = within
        fit = kind.max_end_memo.get((start, slot.num_inflight) if not kind.zero_stage
                                    else (start, slot.num_inflight, slot.dp_degree))
        if fit is None:
            fit = kind.max_end(start, slot.num_inflight, slot.dp_degree)
        if fit < end:
            end = fit
            if memory_hits is not None and bounded:
                memory_hits.append(start)
        if end <= start:
            return None
        ends.append(end)
        start = end
    return ends if start == num_layers else None


def busiest_s(slots: list[StageSlot], ends: list[int]) -> float:
    start, worst = 0, 0.0
    for slot, end in zip(slots, ends):
        cum = slot.kind.comp_cum
        t = slot.num_microbatches * (cum[end] - cum[start])  # Kind.time_s
        if t > worst:
            worst = t
        start = end
    return worst


def min_max_split(slots: list[StageSlot], num_layers: int, *, lower_bound_s: float = 0.0,
                  rel_tol: float = 5e-3, memory_hits: list[int] | None = None) -> list[int] | None:
    """The split minimising the busiest stage (within ``rel_tol``), or None if nothing fits.
    ``memory_hits``: see ``greedy_split``; left empty, memory limited no pass with a time budget,
    so the split is the one time alone gives (to ``rel_tol``)."""
    if len(slots) > num_layers:
        return None
    loose = greedy_split(slots, num_layers, float("inf"))
    if loose is None:
        return None
    hi = busiest_s(slots, loose)
    lo = max(lower_bound_s, 0.0)
    best = loose
    if lo >= hi:
        return best
    # Start from the bound: most splits land within a few percent of it.
    probe = max(lo * 1.02, hi * 0.01)
    while probe < hi:
        ends = greedy_split(slots, num_layers, probe, memory_hits)
        if ends is not None:
            best, hi = ends, busiest_s(slots, ends)
            break
        lo = probe
        probe *= 1.25
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        ends = greedy_split(slots, num_layers, mid, memory_hits)
        if ends is None:
            lo = mid
        else:
            best, hi = ends, busiest_s(slots, ends)
    return best
