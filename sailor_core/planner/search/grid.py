"""The first scoring of one or two GPU types' shapes (``scored.score_shapes``): every pair of
segments whose capacity and rent leave it within a request's limits (``pairs_within``), as numpy
columns (``Pairs``), and those limits as the numpy scoring checks them (``Limits``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sailor_core.planner.search.searcher import Searcher

GRID_BLOCK = 65536  # cells of the grid tested at once (``pairs_within``)


class Limits:
    """A request's caps, floor and objective, as the numpy scoring checks them on the bounds'
    (iteration s, USD per hour, egress USD per iteration)."""

    __slots__ = ("max_usd_per_hour", "max_usd_per_iteration", "min_throughput", "gbs", "throughput")

    def __init__(self, request, throughput: bool) -> None:
        self.max_usd_per_hour = request.max_usd_per_hour
        self.max_usd_per_iteration = request.max_usd_per_iteration
        self.min_throughput = request.min_throughput_samples_per_s
        self.gbs = request.global_batch_size
        self.throughput = throughput

    def unlimited(self) -> bool:
        return self.max_usd_per_hour is None and self.max_usd_per_iteration is None and self.min_throughput is None

    def within(self, t_lb, rate, egress):
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        ok = np.ones(np.shape(t_lb), dtype=bool)
        if self.max_usd_per_hour is not None:
            ok &= rate <= self.max_usd_per_hour * (1 + 1e-9)
        if self.max_usd_per_iteration is not None:
            ok &= rate * t_lb / 3600 + egress <= self.max_usd_per_iteration * (1 + 1e-9)
        if self.min_throughput is not None:
            ok &= self.gbs / t_lb >= self.min_throughput * (1 - 1e-9)
        return ok

    def score(self, t_lb, rate, egress):
        return -self.gbs / t_lb if self.throughput else rate * t_lb / 3600 + egress


@dataclass(frozen=True, slots=True, kw_only=True)
class Pairs:
    """The pairs of segments (index na / nb: that type unused) within the limits on capacity and
    rent, as numpy columns: each type's segment, the stages, the capacity bound and the rent."""

    ia: Any
    ib: Any
    stages: Any
    tau: Any
    rate: Any


def pairs_within(searcher: Searcher, a: dict, b: dict, work_s: float, limits: Limits, limit: float) -> Pairs:
    """Every pair of segments of two lists' columns (``scored.segment_columns``; index na / nb:
    that type unused) as a grid, where the cheapest terms are broadcast sums: the pairs within
    the limits on capacity and rent alone (most shapes miss there), in the grid's order."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    na, nb = len(a["segs"]), len(b["segs"])
    # Only the segments some pair may hold (``may_pair``): the same pairs, figures and order as
    # the whole grid, which on two types is mostly segments no pair within the limits holds (on
    # one type's column the test would cost more than it saves).
    if na and nb:
        ra, rb = (np.flatnonzero(may_pair(x, y, work_s, limits, limit, searcher.max_stages))
                  for x, y in ((a, b), (b, a)))
    else:
        ra, rb = np.arange(na + 1), np.arange(nb + 1)
    # Small integers, in-place tests and one flat index: the grid is the costly part (250,000
    # cells per micro-batch size on the floor row), each pass over it a memory-bound sweep.
    stages = a["stages"][ra].astype(np.int16)[:, None] + b["stages"][rb].astype(np.int16)[None, :]
    keep = (stages >= 1) & (stages <= searcher.max_stages)
    # One-type shapes of a type whose own search proved its best (see plan_job) are settled.
    if len(searcher.gpu_types) == 2:
        if searcher.gpu_types[0] in searcher.settled_types:
            keep[:, rb == nb] = False
        if searcher.gpu_types[1] in searcher.settled_types:
            keep[ra == na, :] = False
    with np.errstate(divide="ignore", invalid="ignore"):  # (no segment at all: not kept)
        tau = work_s / (a["cap"][ra][:, None] + b["cap"][rb][None, :])
        rate = a["rate"][ra][:, None] + b["rate"][rb][None, :]
        keep &= limits.within(tau, rate, 0.0)
        keep &= limits.score(tau, rate, 0.0) < limit
    flat = np.flatnonzero(keep)
    ia, ib = np.divmod(flat, len(rb))
    return Pairs(ia=ra[ia], ib=rb[ib], stages=stages.ravel()[flat].astype(np.int64), tau=tau.ravel()[flat],
                 rate=rate.ravel()[flat])


def may_pair(x: dict, y: dict, work_s: float, limits: Limits, limit: float, max_stages: int):
    """Per segment of ``x`` (and its last index, the type unused, always), whether a pair with some
    segment of ``y`` (or none) may be within the limits on capacity and rent: its depth with
    the shallowest and deepest of ``y``, the floor and the throughput objective at ``y``'s most
    capacity and the hourly cap at its least rent (the same float operations as the grid's,
    which are monotone in each), and the cost per iteration under its cap or the threshold as
    a sum of one term per segment (with a margin for rounding) over the segments of ``y`` with
    the capacity the floor leaves it (``_least_with_room``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    cap, rate, stages = x["cap"], x["rate"], x["stages"]
    ok = (stages + y["stages"].min() <= max_stages) & (stages + y["stages"].max() >= 1)
    room = np.full(len(cap), -math.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = work_s / (cap + y["cap"].max())
        if limits.min_throughput is not None:
            ok &= limits.gbs / tau >= limits.min_throughput * (1 - 1e-9)
            # gbs (cap x + cap y) / work >= floor: cap y >= this (with a margin for rounding)
            room = limits.min_throughput * (1 - 1e-9) * (1 - 1e-6) * work_s / limits.gbs - cap
        if limits.throughput:
            ok &= -limits.gbs / tau < limit
        if limits.max_usd_per_hour is not None:
            ok &= rate + y["rate"].min() <= limits.max_usd_per_hour * (1 + 1e-9)
        for most in (limits.max_usd_per_iteration, None if limits.throughput else limit):
            if most is not None and most < math.inf:
                # (ra + rb) work / (ca + cb) < most <=> (ra work - most ca) + (rb work - most cb) < 0
                most *= (1 + 1e-9) * (1 + 1e-6) * 3600 / work_s
                ok &= rate - most * cap + _least_with_room(y["rate"] - most * y["cap"], y["cap"], room) < 0
    ok[-1] = True
    return ok


def _least_with_room(values, cap, room):
    """Per entry of ``room``, the least of ``values`` over the entries whose ``cap`` is at least
    it (inf where none is)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    order = np.argsort(-cap, kind="stable")
    least = np.minimum.accumulate(values[order])
    count = np.searchsorted(-cap[order], -room, side="right")  # how many have cap >= room
    return np.where(count > 0, least[np.maximum(count - 1, 0)], np.inf)
