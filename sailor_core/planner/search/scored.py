"""Every shape of one or two GPU types scored at once with numpy (``score_shapes``), with the
bound ``tight`` gives a shape before refinement, then refined (``ScoredShapes``: the granular
bound, and for two segments the joint time and cost bounds) in order of that first bound, only
as far as the search walks (``streams.ShapeStream``) or a cut needs (``cut.settle_cut``).

The cheap parts (capacity, rent, links, warm-up, the smallest ring, egress) are scored for every
pair of segments on a grid; the costly ones for the best ``FIRST_REFINED`` shapes by the cheap bound,
in chunks: each shape's figures depend on its own inputs alone, so chunks give what all at once does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sailor_core.planner.search.bounds import (
    GRID,
    PIPELINE_FALLING,
    PIPELINE_RISING,
    PipelineSide,
    min_max_lines,
    pipe_work_rate_many,
    pipeline_lines,
    rings_egress_lb_many,
    steady_links_s,
    warm_up_with_links_s,
)
from sailor_core.planner.search.searcher import Searcher
from sailor_core.planner.search.shapes import Segment
from sailor_core.planner.search.streams import ShapeStream, SortedShapes

FIRST_REFINED = 20000  # shapes given the costly bounds; the rest keep the cheap one (weaker, still a bound)
_NO_SEGMENTS: list[Segment] = []  # the second type's list of a one-type space (never changed)
_INTERVALS = [(k / GRID, (k + 1) / GRID) for k in range(GRID)]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Refining:
    """What refining a space's shapes reads besides their columns: each type's segments and
    their columns (``segment_columns``), the links between the types' TP degrees (``lmat``),
    the egress where two segments meet, the block work, the gradient's block and the least
    blocks per segment, whether cost matters, and the planner's bound parts."""

    lists: list
    a: dict
    b: dict
    lmat: Any
    rings_p2p: Any
    work_s: float
    block_bytes: float
    num_blocks_lb: float
    cost_matters: bool
    parts: Any


def probe(segs: list[Segment], tp: int) -> Segment:
    """The first segment of ``segs`` of TP degree ``tp`` (links depend on the type and TP alone)."""
    return next(seg for seg in segs if seg.tp_degree == tp)


def segment_columns(segs: list[Segment], *, alone: bool, max_p: int, cost_matters: bool, work_s: float,
                    searcher: Searcher) -> dict:
    """One type's segments as numpy columns (index len(segs): the type unused), with their own
    bound parts: rings at every depth, links, warm-up, egress, granular numbers; ``curves``
    (sync curves) filled as refining needs them."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    parts, egress = searcher.parts, searcher.egress
    # rings at every depth, filled as shapes within the capacity and rent limits need them
    # (``_rings_of``: most segments of a list never are)
    ring = np.full((len(segs) + 1, max_p + 1), np.inf)
    tps = sorted({seg.tp_degree for seg in segs})
    curves = np.zeros((len(segs) + 1, GRID + 1))  # sync_curve per segment, as needed
    # A segment's own link depends on its GPU type, TP and micro-batch size only.
    by_tp = {tp: parts.link_s(seg, seg) for tp in tps for seg in (probe(segs, tp),)}
    links = [by_tp[seg.tp_degree] for seg in segs]
    granular_id = parts.granular_id
    return dict(
        segs=segs, tps=tps, ring=ring, have_ring=np.zeros(len(segs) + 1, dtype=bool), alone=alone, max_p=max_p,
        curves=curves, have_curve=np.zeros(len(segs) + 1, dtype=bool),
        cap=np.array([seg.capacity for seg in segs] + [0.0]),
        rate=np.array([seg.min_usd_per_hr for seg in segs] + [0.0]),
        stages=np.array([seg.num_stages for seg in segs] + [0]),
        dp=np.array([seg.dp_degree for seg in segs] + [1 << 30]),
        d1=np.array([seg.dp_degree == 1 for seg in segs] + [False]),
        tpi=np.array([tps.index(seg.tp_degree) for seg in segs] + [0]),
        self_link=np.array([(seg.num_microbatches - 1) * link / 2 if seg.num_stages > 1
                            else 0.0 for seg, link in zip(segs, links)] + [0.0]),
        steady=np.array([steady_links_s(seg.num_microbatches, link, seg.num_stages)
                         for seg, link in zip(segs, links)] + [0.0]),
        # (raised by ``SegmentParts.blocked_s`` where the cheaper bounds leave a shape within
        # the limits, ``_with_blocked``: one segment alone, as ``ShapeBounds.time_lb`` has it)
        warm=np.append(warm_up_with_links_s(
            work_s * np.array([seg.slowness for seg in segs], dtype=float),
            np.array([seg.num_microbatches for seg in segs], dtype=float),
            np.array([seg.num_stages for seg in segs], dtype=int),
            np.array(links, dtype=float)), 0.0) if segs else np.zeros(1),
        p2p_usd=np.array([seg.egress_usd if cost_matters else 0.0 for seg in segs] + [0.0]),
        ring_usd=np.array([egress.ring_usd_per_byte(seg) if cost_matters else 0.0 for seg in segs] + [0.0]),
        inv=np.array([1.0 / seg.slowness for seg in segs] + [0.0]),
        slow=np.array([seg.slowness for seg in segs] + [0.0]),
        nmb=np.array([seg.num_microbatches for seg in segs] + [1]),
        drain=np.array([(1 - 1 / seg.num_microbatches) ** seg.num_stages for seg in segs] + [1.0]),
        block=np.array([seg.block_busy_s for seg in segs] + [np.inf]),
        head=np.array([seg.head_busy_s for seg in segs] + [np.inf]),
        gid=np.array([granular_id(seg.num_stages, seg.block_busy_s, seg.head_busy_s) for seg in segs]
                     + [granular_id(0, math.inf, math.inf)], dtype=np.int64),
    )


def _columns_of(segs: list[Segment], context: tuple, searcher: Searcher, **kwargs) -> dict:
    """``segment_columns``, for the process: a list's columns depend on it and on ``context``
    (the regime variants on the GPU types, the rings and links on the type's pools, which the
    list is keyed on, and the network, the memo's)."""
    memo = searcher.memos.process.segment_columns
    if not segs:  # the unused type's: its one row (and its ring's width) is the same in every context
        context = (kwargs["alone"], kwargs["max_p"])
    hit = memo.get((id(segs), context))
    if hit is None or hit[0] is not segs:
        hit = memo[(id(segs), context)] = (segs, segment_columns(segs, searcher=searcher, **kwargs))
    return hit[1]


def score_shapes(searcher: Searcher, present: list[list[Segment]], *, mbs: int, num_mb: int, work_s: float,
                 num_blocks_lb: float, defer: bool = False) -> ScoredShapes:
    """Every shape of one or two GPU types (``present``: each type's segments), scored at once
    with the bound ``tight`` gives it before refinement; shapes that miss the limits, or whose
    bound cannot enter the top N found so far, are dropped (``searcher.threshold``: it only
    falls, so it stays their bound).  ``defer`` (one type, ``cut.LazyCut``): the alone bound and
    the ring are left to the refinement, which gives the same final bounds."""
    req = searcher.req
    lists = list(present)
    if len(lists) == 1:
        lists.append(_NO_SEGMENTS)
    max_p, cost_matters = searcher.max_stages, searcher.cost_matters
    alone = not lists[1]  # one GPU type: a shape's depth is its one segment's
    context = (alone, max_p, cost_matters, work_s, tuple(searcher.gpu_types), req.regime, req.max_tp_degree,
               searcher.parts.placed)
    kwargs = dict(alone=alone, max_p=max_p, cost_matters=cost_matters, work_s=work_s)
    a, b = _columns_of(lists[0], context, searcher, **kwargs), _columns_of(lists[1], context, searcher, **kwargs)
    limits = Limits(req, not req.ranking.by_cost)
    limit = searcher.threshold()
    pairs = _capacity_and_rent(searcher, a, b, work_s, limits, limit)
    kinds = _meeting_kinds(lists, a, b, pairs) if cost_matters else None
    pipe, lmat = _pipeline(searcher.parts, lists, a, b, pairs, work_s, num_mb)
    # The pipeline bound rules out most pairs a cap, a floor or the top N leave on capacity and
    # rent (the floor row: 469,000 of 2.5 million -> 72,000); the sync and egress bounds, which
    # only raise a bound, are needed for the rest alone (same figures and order as for all).
    pairs, pipe = _within_on_pipeline(pairs, pipe, limits, limit)
    if defer:
        sync = pairs.tau * 0.0
    else:
        pairs, pipe = _within_on_pipeline(pairs, _with_blocked(searcher.parts, a, b, pairs, pipe, work_s), limits,
                                          limit)
        sync = _sync(searcher.parts, a, b, pairs)
    egress, rings_p2p = _egress(searcher, lists, a, b, pairs, num_mb, mbs, kinds)
    refining = Refining(lists=lists, a=a, b=b, lmat=lmat, rings_p2p=rings_p2p, work_s=work_s,
                        block_bytes=searcher.figures.gradient_bytes_lb(mbs)[1], num_blocks_lb=num_blocks_lb,
                        cost_matters=cost_matters, parts=searcher.parts)
    return ScoredShapes(pairs, pipe=pipe, sync=sync, egress=egress, refining=refining, limits=limits, limit=limit,
                        defer=defer)


def _capacity_and_rent(searcher: Searcher, a: dict, b: dict, work_s: float, limits: Limits, limit: float) -> Pairs:
    """Every pair of segments (index na / nb: that type unused) as a grid, where the cheapest
    terms are broadcast sums: the pairs within the limits on capacity and rent alone (most
    shapes miss there), in the grid's order."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    na, nb = len(a["segs"]), len(b["segs"])
    # Only the segments some pair may hold (``_may_pair``): the same pairs, figures and order as
    # the whole grid, which on two types is mostly segments no pair within the limits holds (on
    # one type's column the test would cost more than it saves).
    if na and nb:
        ra, rb = (np.flatnonzero(_may_pair(x, y, work_s, limits, limit, searcher.max_stages))
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


def _may_pair(x: dict, y: dict, work_s: float, limits: Limits, limit: float, max_stages: int):
    """Per segment of ``x`` (and its last index, the type unused, always), whether a pair with some
    segment of ``y`` (or none) may be within the limits on capacity and rent: its depth with
    the shallowest and deepest of ``y``, the floor and the throughput objective at ``y``'s most
    capacity and the hourly cap at its least rent (the same float operations as the grid's,
    which are monotone in each), and the cost per iteration under its cap or the threshold as
    a sum of one term per segment (with a margin for rounding)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    cap, rate, stages = x["cap"], x["rate"], x["stages"]
    ok = (stages + y["stages"].min() <= max_stages) & (stages + y["stages"].max() >= 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = work_s / (cap + y["cap"].max())
        if limits.min_throughput is not None:
            ok &= limits.gbs / tau >= limits.min_throughput * (1 - 1e-9)
        if limits.throughput:
            ok &= -limits.gbs / tau < limit
        if limits.max_usd_per_hour is not None:
            ok &= rate + y["rate"].min() <= limits.max_usd_per_hour * (1 + 1e-9)
        for most in (limits.max_usd_per_iteration, None if limits.throughput else limit):
            if most is not None and most < math.inf:
                # (ra + rb) work / (ca + cb) < most <=> (ra work - most ca) + (rb work - most cb) < 0
                most *= (1 + 1e-9) * (1 + 1e-6) * 3600 / work_s
                ok &= rate - most * cap + (y["rate"] - most * y["cap"]).min() < 0
    ok[-1] = True
    return ok


def _pipeline(parts, lists, a: dict, b: dict, pairs: Pairs, work_s: float, num_mb: int):
    """(pipeline bound whatever the split, matrix of links between the types' TP degrees) of
    the pairs: links, the warm-up in the better order (``pipe_lb``), and for one segment its
    compute with its links (``steady_links_s``, ``warm_up_with_links_s``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib, stages, tau = pairs.ia, pairs.ib, pairs.stages, pairs.tau
    na, nb = len(a["segs"]), len(b["segs"])
    both = (ia < na) & (ib < nb)
    cross = np.zeros(len(ia))
    if na and nb:
        lmat = np.array([[min(parts.link_s(probe(lists[0], ta), probe(lists[1], tb)),
                              parts.link_s(probe(lists[1], tb), probe(lists[0], ta)))
                          for tb in b["tps"]] for ta in a["tps"]])
        n = -(-num_mb // np.minimum(a["dp"][ia], b["dp"][ib]))
        cross = np.where(both, (n - 1) * lmat[a["tpi"][ia], b["tpi"][ib]] / 2, 0.0)
    else:
        lmat = np.zeros((1, 1))
    link = np.maximum(np.maximum(a["self_link"][ia], b["self_link"][ib]), cross)
    pipe = np.maximum(link, work_s / pipe_work_rate_many(a["inv"][ia], a["drain"][ia], b["inv"][ib], b["drain"][ib]))
    pipe = np.maximum(pipe, np.where(both, 0.0, tau + a["steady"][ia] + b["steady"][ib]))
    alone_a, alone_b = ia[~both], ib[~both]
    warm = np.where(alone_a < na, a["warm"][alone_a], b["warm"][alone_b])
    pipe[~both] = np.maximum(pipe[~both], warm)
    return pipe, lmat


def _with_blocked(parts, a: dict, b: dict, pairs: Pairs, pipe, work_s: float):
    """The pairs' pipeline bounds, a lone segment's raised by ``SegmentParts.blocked_column``:
    asked only where the cheaper bounds left the pair within the limits (it only raises them)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    na, nb = len(a["segs"]), len(b["segs"])
    alone = (pairs.ia >= na) | (pairs.ib >= nb)
    if not alone.any():
        return pipe
    ia, ib, pipe = pairs.ia[alone], pairs.ib[alone], pipe.copy()
    pipe[alone] = np.maximum(pipe[alone], np.where(ia < na, parts.blocked_column(a, ia, work_s)[ia],
                                                   parts.blocked_column(b, ib, work_s)[ib]))
    return pipe


def _within_on_pipeline(pairs: Pairs, pipe, limits: Limits, limit: float) -> tuple[Pairs, Any]:
    """The pairs (and their pipeline bounds) that the limits and ``limit`` leave on the capacity
    and pipeline bounds alone, in order: sync and egress only add to the time and the cost, and
    every check and score grows with them, so a pair dropped here is one ``ScoredShapes`` drops
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


def _sync(parts, a: dict, b: dict, pairs: Pairs):
    """The sync bound of the pairs: the shorter of the two segments' rings at the shape's depth."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib, stages = pairs.ia, pairs.ib, pairs.stages
    return np.where(a["d1"][ia] | b["d1"][ib], 0.0, np.minimum(_rings_of(a, ia, parts)[ia, stages],
                                                               _rings_of(b, ib, parts)[ib, stages]))


def _rings_of(x: dict, idx, parts):
    """A list's columns' ring bounds (per segment, per depth), filled for the segments ``idx``
    (past its end: no segment, no ring) as needed: with several types a segment's ring at every
    depth (``SegmentParts.ring_row``, one per TP and DP degree), alone at its own depth."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    have, ring, segs = x["have_ring"], x["ring"], x["segs"]
    if have.all():
        return ring
    if len(idx) > 4 * len(have):
        # many shapes per segment (two types' grid): finding the ones held costs more than
        # filling every segment's
        need = np.flatnonzero(~have)
    else:
        need = np.flatnonzero(np.bincount(idx[~have[idx]], minlength=len(have)))
    rows: dict = {}  # ring_row by (TP, DP degree): the same for every stage count
    at, depths, values = [], [], []
    for i in need.tolist():
        seg = segs[i] if i < len(segs) else None
        if seg is None or seg.dp_degree <= 1:
            continue
        if x["alone"]:  # (``ring_lb``: the row at the segment's own depth)
            row = rows.get((seg.tp_degree, seg.dp_degree))
            if row is None:
                row = rows[(seg.tp_degree, seg.dp_degree)] = parts.ring_row(seg)
            at.append(i)
            depths.append(seg.num_stages)
            values.append(row[seg.num_stages])
        else:
            rows.setdefault((seg.tp_degree, seg.dp_degree), (seg, []))[1].append(i)
    if at:
        ring[at, depths] = values
    for seg, where in ([] if x["alone"] else rows.values()):
        ring[where] = parts.ring_row(seg)[: x["max_p"] + 1]
    have[need] = True
    return ring


def _meeting_kinds(lists, a: dict, b: dict, pairs: Pairs) -> list:
    """The kinds of the segments that meet one of the other type in the pairs within the limits
    on capacity and rent: the least boundary activation over them prices where segments meet
    (``between_segments_usd``), the same however many of the pairs the pipeline bound rules out."""
    ia, ib = pairs.ia, pairs.ib
    na, nb = len(a["segs"]), len(b["segs"])
    both = (ia < na) & (ib < nb)
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ua, ub = (np.flatnonzero(np.bincount(idx[both], minlength=n)) for idx, n in ((ia, na), (ib, nb)))
    segs = [lists[0][i] for i in ua.tolist()] + [lists[1][i] for i in ub.tolist()]
    return list({id(seg.kind): seg.kind for seg in segs}.values())


def _egress(searcher: Searcher, lists, a: dict, b: dict, pairs: Pairs, num_mb: int, mbs: int, kinds: list | None):
    """(egress USD per iteration bound, matrix of the between-segments part) of the pairs: each
    segment's own p2p, the rings (``rings_egress_lb``) and where two segments meet (``kinds``:
    whose boundary activations price it; None: cost does not matter)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib = pairs.ia, pairs.ib
    na, nb = len(a["segs"]), len(b["segs"])
    both = (ia < na) & (ib < nb)
    rings_p2p = np.zeros((na + 1, nb + 1))
    if kinds is not None and both.any():
        # Only for the segments of the shapes left.
        ua, ub = (np.flatnonzero(np.bincount(idx[both], minlength=n)) for idx, n in ((ia, na), (ib, nb)))
        rings_p2p[np.ix_(ua, ub)] = searcher.egress.between_segments_usd(
            num_mb, [lists[0][i] for i in ua.tolist()], [lists[1][i] for i in ub.tolist()], kinds=kinds)
    whole, block = searcher.figures.gradient_bytes_lb(mbs)
    rings = rings_egress_lb_many(a["ring_usd"][ia], b["ring_usd"][ib], a["stages"][ia], b["stages"][ib], both,
                                 whole, block)
    return a["p2p_usd"][ia] + b["p2p_usd"][ib] + rings + rings_p2p[ia, ib], rings_p2p


class ScoredShapes:
    """Shapes of one micro-batch size with a first bound, refined (the granular and joint
    bounds, which only raise it) in order of that bound, as far as asked (see the module
    docstring).  Columns per shape: ``ia``, ``ib`` (segment of each type, past the end:
    unused), stages, ``tau`` (the busiest stage, refined in place), the pipeline and sync
    bounds, rent, egress and ``t_lb`` (the iteration time bound, refined in place)."""

    __slots__ = ("lists", "a", "b", "ia", "ib", "stages", "tau", "pipe", "sync", "rate", "egress", "t_lb",
                 "limits", "limit", "lmat", "rings_p2p", "work_s", "block_bytes", "num_blocks_lb",
                 "cost_matters", "parts", "pre", "first", "num_refined", "final", "never", "never_refined", "defer")

    def __init__(self, pairs: Pairs, *, pipe, sync, egress, refining: Refining, limits: Limits,
                 limit: float, defer: bool = False) -> None:
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        r = refining
        self.lists, self.a, self.b, self.limits, self.limit = r.lists, r.a, r.b, limits, limit
        self.lmat, self.rings_p2p, self.parts = r.lmat, r.rings_p2p, r.parts
        self.work_s, self.block_bytes, self.num_blocks_lb = r.work_s, r.block_bytes, r.num_blocks_lb
        self.cost_matters = r.cost_matters
        ia, ib, stages, tau, rate = pairs.ia, pairs.ib, pairs.stages, pairs.tau, pairs.rate
        # The limits on the capacity bound with links, warm-up and sync, then with the rest.
        t_lb = np.maximum(tau, pipe) + sync
        ok = limits.within(t_lb, rate, egress) & (limits.score(t_lb, rate, egress) < limit)
        self.ia, self.ib, self.stages, self.tau, self.pipe, self.sync, self.rate, self.egress, self.t_lb = (
            x[ok] for x in (ia, ib, stages, tau, pipe, sync, rate, egress, t_lb))
        self.pre = limits.score(self.t_lb, self.rate, self.egress)  # the first bound
        self.defer = defer  # the alone bound and the ring still to add (every shape is refined then)
        self.first = np.argsort(self.pre, kind="stable")[:None if defer else FIRST_REFINED]  # to refine, best first
        self.tau, self.egress = self.tau.copy(), self.egress.copy()  # refined in place
        self.num_refined = 0
        self.final = []  # arrays of refined bounds within the limits (refine_next)
        self.never = np.ones(len(self.ia), dtype=bool)
        self.never[self.first] = False
        self.never_refined = np.sort(self.pre[self.never])  # first bounds of the rest: final as they are

    def next_pre(self) -> float:
        return float(self.pre[self.first[self.num_refined]]) if self.num_refined < len(self.first) else math.inf

    def refine_next(self, count: int, below: float = math.inf) -> None:
        """Refine the next ``count`` shapes of ``first``, keeping their final bounds in ``final``
        (``below``: see ``_refine_bounds``)."""
        sel = self.first[self.num_refined:self.num_refined + count]
        self.num_refined += len(sel)
        if len(sel):
            self.final.append(self.final_of(sel, below)[1])

    def final_of(self, sel, below: float = math.inf):
        """Refine the shapes ``sel`` (a run of ``first``): (those within the limits, their final bounds)."""
        self._refine_bounds(sel, below)
        return self.kept(sel)

    def kept(self, sel):
        score = self.limits.score(self.t_lb[sel], self.rate[sel], self.egress[sel])
        ok = self.limits.within(self.t_lb[sel], self.rate[sel], self.egress[sel]) & (score < self.limit)
        return sel[ok], score[ok]

    def never_kept(self):
        """``kept`` of the shapes never refined."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        return self.kept(np.flatnonzero(self.never))

    def rows(self, idx):
        """(ia, ib, busiest stage, (iteration s, USD/hour, egress, stages)) of shapes, as
        ``SortedShapes`` takes them."""
        return self.ia[idx], self.ib[idx], self.tau[idx], (self.t_lb[idx], self.rate[idx], self.egress[idx],
                                                           self.stages[idx])

    def sorted_below(self, cut: float) -> SortedShapes:
        """The shapes refined so far and those never refined whose bound is below ``cut``, best
        first (ties in scoring order); shapes still to refine must not be below it."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        done = np.ones(len(self.ia), dtype=bool)
        done[self.first[self.num_refined:]] = False
        score = self.limits.score(self.t_lb, self.rate, self.egress)
        ok = done & self.limits.within(self.t_lb, self.rate, self.egress) & (score < min(self.limit, cut))
        order = np.flatnonzero(ok)[np.argsort(score[ok], kind="stable")]
        out = SortedShapes(self.lists[0], self.lists[1], self.ia[order], self.ib[order], score[order],
                           self.tau[order], self.rows(order)[3])
        out.cut = min(self.limit, cut)
        return out

    def streamed(self) -> SortedShapes:
        """Every shape within the limits, best first, refined as the walk gets there
        (``ShapeStream``): what ``sorted_below(inf)`` gives after refining them all."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        empty = np.empty(0)
        out = SortedShapes(self.lists[0], self.lists[1], empty, empty, empty, empty, (empty,) * 4)
        out.stream = ShapeStream(self, out)
        out.cut = self.limit
        return out

    def _refine_bounds(self, sel, below: float = math.inf) -> None:
        """The granular bound, then for two segments compute, links and sync together (the
        joint bound with where the segments meet) and, when cost matters, rent and egress
        together, for the shapes ``sel``; the joint bounds not for shapes whose granular bound
        is ``below`` or more (``settle_cut``: they end above its cut either way)."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        a, b, ia, ib, tau, t_lb = self.a, self.b, self.ia, self.ib, self.tau, self.t_lb
        if self.defer:  # what ``score_shapes`` left out, the same figures
            sub = Pairs(ia=ia[sel], ib=ib[sel], stages=self.stages[sel], tau=tau[sel], rate=self.rate[sel])
            self.pipe[sel] = _with_blocked(self.parts, a, b, sub, self.pipe[sel], self.work_s)
            self.sync[sel] = _sync(self.parts, a, b, sub)
        tau[sel] = np.maximum(tau[sel], self.parts.granular_of(a, ia[sel], b, ib[sel]))
        t_lb[sel] = np.maximum(tau[sel], self.pipe[sel]) + self.sync[sel]
        alive = self.limits.within(t_lb[sel], self.rate[sel], self.egress[sel]) & (
            self.limits.score(t_lb[sel], self.rate[sel], self.egress[sel]) < min(self.limit, below))
        two = sel[alive & (ia[sel] < len(a["segs"])) & (ib[sel] < len(b["segs"]))]  # (the rest keep the weaker bound)
        if not len(two):
            return
        # Rings only for the segments these shapes use (the curves cost a few rings each).
        c1, c2 = (_curves_of(x, idx[two], self.parts.sync_curve) for x, idx in ((a, ia), (b, ib)))
        work_s = self.work_s
        a1, a2 = work_s / a["cap"][ia[two]], work_s / b["cap"][ib[two]]
        k1, k2 = a["steady"][ia[two]], b["steady"][ib[two]]
        floor_s = np.maximum(tau[two], self.pipe[two])
        # The pipeline as lines in the first segment's share x (where the segments meet too).
        side_a = PipelineSide(compute_s=a1, steady_links_s=k1, steps_s=work_s * a["slow"][ia[two]],
                              num_stages=a["stages"][ia[two]], num_microbatches=a["nmb"][ia[two]])
        side_b = PipelineSide(compute_s=a2, steady_links_s=k2, steps_s=work_s * b["slow"][ib[two]],
                              num_stages=b["stages"][ib[two]], num_microbatches=b["nmb"][ib[two]])
        u, v = pipeline_lines(floor_s, side_a, side_b, self.lmat[a["tpi"][ia[two]], b["tpi"][ib[two]]])
        rings = [np.maximum(c1[:, k], c2[:, GRID - 1 - k]) for k in range(GRID)]
        joint = np.min([h + ring for h, ring in zip(
            min_max_lines(u, v, _INTERVALS, PIPELINE_RISING, PIPELINE_FALLING), rings)], axis=0)
        t_lb[two] = np.maximum(t_lb[two], joint)
        if self.cost_matters:
            self._refine_cost(two, u, v, rings)

    def _refine_cost(self, two, u, v, rings) -> None:
        """Rent, time and the rings' egress together (``bounds.joint_cost_lb``), in the egress."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        a, b, ia, ib, rate = self.a, self.b, self.ia, self.ib, self.rate
        per_blocks = self.num_blocks_lb * self.block_bytes
        e1 = a["ring_usd"][ia[two]] * per_blocks
        e2 = b["ring_usd"][ib[two]] * per_blocks
        per_s = rate[two] / 3600
        # Cost lines: rent over each time line plus the rings' egress, e2 + (e1 - e2) x.
        # The flat time lines (floor, the links alone) share one slope here: keep their top.
        flat = [0, 3, 7]
        cu = np.vstack([per_s * u[flat].max(axis=0), per_s * np.delete(u, flat, axis=0)]) + e2
        cv = np.vstack([np.zeros((1, len(two))), per_s * np.delete(v, flat, axis=0)]) + (e1 - e2)
        usd = np.min([h + per_s * ring for h, ring in zip(min_max_lines(cu, cv, _INTERVALS), rings)], axis=0)
        fixed = a["p2p_usd"][ia[two]] + b["p2p_usd"][ib[two]] + self.rings_p2p[ia[two], ib[two]]
        self.egress[two] = np.maximum(self.egress[two], usd + fixed - rate[two] * self.t_lb[two] / 3600)


def _curves_of(x: dict, idx, sync_curve):
    """``sync_curve`` of the segments ``idx`` of a list's columns (past its end: no segment, no
    ring), filling the columns' curves as needed."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    need = np.flatnonzero(np.bincount(idx[~x["have_curve"][idx]], minlength=len(x["have_curve"])))
    for i in need.tolist():
        if i < len(x["segs"]):
            x["curves"][i] = sync_curve(x["segs"][i])
    x["have_curve"][need] = True
    return x["curves"][idx]
