"""The first scoring of one or two GPU types' shapes (``scored.score_shapes``): every pair of
segments whose capacity and rent leave it within a request's limits (``pair_blocks``), as numpy
columns (``Pairs``), and those limits as the numpy scoring checks them (``Limits``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sailor_core.planner.search.searcher import Searcher

GRID_BLOCK = 16000  # cells of the grid tested at once (``pair_blocks``): its buffers and pairs under 128 KB


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

    def keep_within(self, keep, tau, rate, limit: float, f, ok) -> None:
        """``keep &= within(tau, rate, 0.0) & (score(tau, rate, 0.0) < limit)``, in place through
        the scratch arrays ``f`` (float) and ``ok`` (bool) of their shape: the same float
        operations (an egress of 0.0 added changes no comparison)."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        if self.max_usd_per_hour is not None:
            keep &= np.less_equal(rate, self.max_usd_per_hour * (1 + 1e-9), out=ok)
        if self.min_throughput is not None:
            keep &= np.greater_equal(np.divide(self.gbs, tau, out=f), self.min_throughput * (1 - 1e-9), out=ok)
        if self.throughput:
            keep &= np.less(np.divide(-self.gbs, tau, out=f), limit, out=ok)
        if self.max_usd_per_iteration is not None or not self.throughput:
            np.divide(np.multiply(rate, tau, out=f), 3600, out=f)  # USD per iteration
            if self.max_usd_per_iteration is not None:
                keep &= np.less_equal(f, self.max_usd_per_iteration * (1 + 1e-9), out=ok)
            if not self.throughput:
                keep &= np.less(f, limit, out=ok)

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


def pair_blocks(searcher: Searcher, a: dict, b: dict, work_s: float, limits: Limits, limit: float):
    """Every pair of segments of two lists' columns (``scored.segment_columns``; index na / nb:
    that type unused) as a grid, where the cheapest terms are broadcast sums: the pairs within
    the limits on capacity and rent alone (most shapes miss there), in the grid's order, as
    ``Pairs`` of a block of the grid's rows at a time (``_grid_within``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    na, nb = len(a["segs"]), len(b["segs"])
    if not nb and len(searcher.gpu_types) != 2 and na < GRID_BLOCK:
        yield _column_within(a, b, work_s, limits, limit, searcher.max_stages)  # (one type: a column)
        return
    # Only the segments some pair may hold (``may_pair``): the same pairs, figures and order as
    # the whole grid, which on two types is mostly segments no pair within the limits holds (on
    # one type's column the test would cost more than it saves).
    if na and nb:
        ra, rb = (np.flatnonzero(may_pair(x, y, work_s, limits, limit, searcher.max_stages))
                  for x, y in ((a, b), (b, a)))
    else:
        ra, rb = np.arange(na + 1), np.arange(nb + 1)
    # One-type shapes of a type whose own search proved its best (see plan_job) are settled.
    settled_row, settled_col = np.zeros(len(ra), dtype=bool), np.zeros(len(rb), dtype=bool)
    if len(searcher.gpu_types) == 2:
        if searcher.gpu_types[0] in searcher.settled_types:
            settled_col = rb == nb
        if searcher.gpu_types[1] in searcher.settled_types:
            settled_row = ra == na
    cols = (a["stages"][ra].astype(np.int16), b["stages"][rb].astype(np.int16), a["cap"][ra], b["cap"][rb],
            a["rate"][ra], b["rate"][rb])
    for flat, stages, tau, rate in _grid_within(cols, settled_row, settled_col, work_s, limits, limit,
                                                searcher.max_stages):
        ia, ib = np.divmod(flat, len(rb))
        yield Pairs(ia=ra[ia], ib=rb[ib], stages=stages, tau=tau, rate=rate)


def within_on_pipeline(pairs: Pairs, pipe, limits: Limits, limit: float) -> tuple[Pairs, Any]:
    """The pairs (and their pipeline bounds) that the limits and ``limit`` leave on the capacity
    and pipeline bounds alone, in order: sync and egress only add to the time and the cost, and
    every check and score grows with them, so a pair dropped here is one ``scored.ScoredShapes`` drops
    (its rings, the costly part, are not computed)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    if limit == math.inf and limits.unlimited():
        return pairs, pipe  # (nothing to drop: a search's first pass)
    t = np.maximum(pairs.tau, pipe)
    ok = limits.within(t, pairs.rate, 0.0) & (limits.score(t, pairs.rate, 0.0) < limit)
    if ok.all():
        return pairs, pipe
    ok = np.flatnonzero(ok)
    return Pairs(ia=pairs.ia[ok], ib=pairs.ib[ok], stages=pairs.stages[ok], tau=pairs.tau[ok],
                 rate=pairs.rate[ok]), pipe[ok]


def _grid_within(cols: tuple, settled_row, settled_col, work_s: float, limits: Limits, limit: float,
                 max_stages: int):
    """Per block of rows, (flat indexes, stages, capacity bound, rent) of the grid's cells (rows:
    the first type's segments, columns: the second's) whose depth, capacity and rent are within
    the limits and beat ``limit``.  The grid
    is swept in blocks of rows through buffers reused from block to block: a whole grid's
    temporaries (up to 300,000 cells on the floor row, a dozen arrays) are fresh memory the system
    hands over page by page, which cost more than the sweep itself."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    sa, sb, ca, cb, rta, rtb = cols
    rows = max(1, GRID_BLOCK // len(sb))
    shape = (min(rows, len(sa)), len(sb))
    st, keep, ok = np.empty(shape, dtype=np.int16), np.empty(shape, dtype=bool), np.empty(shape, dtype=bool)
    tau, rate, f = np.empty(shape), np.empty(shape), np.empty(shape)
    for r0 in range(0, len(sa), rows):
        n = min(rows, len(sa) - r0)
        v = slice(0, n)
        np.add(sa[r0:r0 + n, None], sb[None, :], out=st[v])
        np.greater_equal(st[v], 1, out=keep[v])
        keep[v] &= np.less_equal(st[v], max_stages, out=ok[v])
        keep[v, settled_col] = False
        keep[v][settled_row[r0:r0 + n]] = False
        with np.errstate(divide="ignore", invalid="ignore"):  # (no segment at all: not kept)
            np.divide(work_s, np.add(ca[r0:r0 + n, None], cb[None, :], out=f[v]), out=tau[v])
            np.add(rta[r0:r0 + n, None], rtb[None, :], out=rate[v])
            limits.keep_within(keep[v], tau[v], rate[v], limit, f[v], ok[v])
        flat = np.flatnonzero(keep[v])
        yield flat + r0 * len(sb), st[v].ravel()[flat].astype(np.int64), tau[v].ravel()[flat], rate[v].ravel()[flat]


def _column_within(a: dict, b: dict, work_s: float, limits: Limits, limit: float, max_stages: int) -> Pairs:
    """``pair_blocks`` of one type's segments and the unused second type's one entry (no stage,
    capacity or rent), a grid of one column: the same figures cell by cell (each the sum with that
    entry's, as broadcast) without the grid's set-up, a fixed cost paid per micro-batch size and
    pass (seven one-type lists a search on the homogeneous rows; the widening pass's seven more)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    st = a["stages"].astype(np.int16) + b["stages"][:1].astype(np.int16)
    keep = (st >= 1) & (st <= max_stages)
    with np.errstate(divide="ignore", invalid="ignore"):  # (no segment at all: not kept)
        tau = np.divide(work_s, a["cap"] + b["cap"][:1])
        rate = a["rate"] + b["rate"][:1]
        limits.keep_within(keep, tau, rate, limit, np.empty(len(st)), np.empty(len(st), dtype=bool))
    flat = np.flatnonzero(keep)
    return Pairs(ia=flat, ib=np.zeros(len(flat), dtype=flat.dtype), stages=st[flat].astype(np.int64), tau=tau[flat],
                 rate=rate[flat])


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
