"""Every shape of one or two GPU types scored at once with numpy (``score_shapes``), with the
bound ``tight`` gives a shape before refinement, then refined (``ScoredShapes``: the granular
bound, and for two segments the joint time and cost bounds) in order of that first bound, only
as far as the search walks (``streams.ShapeStream``) or a cut needs (``cut.settle_cut``).

The cheap parts (capacity, rent, links, warm-up, the smallest ring, egress) are scored for every
pair of segments on a grid (``grid.pair_blocks`` first); the costly ones for the best
``FIRST_REFINED`` shapes by the cheap bound, in chunks: each shape's figures depend on its own
inputs alone, so chunks give what all at once does.
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
from sailor_core.planner.search.alone import blocked_pair_many
from sailor_core.planner.search.grid import Limits, Pairs, pair_blocks, within_on_pipeline
from sailor_core.planner.search.parts import GRANULAR_STEPS
from sailor_core.planner.search.searcher import Searcher
from sailor_core.planner.search.shapes import Segment
from sailor_core.planner.search.streams import ShapeStream, SortedShapes

ROUGH_STEPS = 6  # of the granular bound's bisection, before the rest (``ScoredShapes._refine_bounds``)
LINE_COLUMNS = 256  # shapes per ``bounds.min_max_lines`` call (``_min_max_lines``)
FIRST_REFINED = 20000  # shapes given the costly bounds; the rest keep the cheap one (weaker, still a bound)
_NO_SEGMENTS: list[Segment] = []  # the second type's list of a one-type space (never changed)
# The unused type's row of a list's columns (``segment_columns``): capacity, rent, stages, DP degree (never
# one replica, never a shorter ring), TP index, micro-batches, slowness, block and head busy times, egress.
_UNUSED_ROW = (0.0, 0.0, 0, 1 << 30, 0, 1, 0.0, math.inf, math.inf, 0.0)
_INTERVALS = [(k / GRID, (k + 1) / GRID) for k in range(GRID)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Refining:
    """What refining a space's shapes reads besides their columns: each type's segments and
    their columns (``segment_columns``), the links between the types' TP degrees (``lmat``),
    the egress where two segments meet (``_meeting_usd``), the block work, the gradient's block
    and the least blocks per segment, whether cost matters, and the planner's bound parts."""

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
    tp_link = np.array([parts.link_s(seg, seg) for tp in tps for seg in (probe(segs, tp),)] or [0.0])
    tp_at = {tp: i for i, tp in enumerate(tps)}
    # Where every regime blocks on its sends, two segments' shapes take ``alone.blocked_pair_many``.
    tp_blocks = np.array([parts.blocks_sends(probe(segs, tp)) for tp in tps] or [False])
    # One pass over the segments' fields, then whole columns: the same float operations as on
    # each segment, element by element.  The last row is the unused type's (``_UNUSED_ROW``); the
    # columns whose arithmetic would not give its figure are computed on the segments' rows alone.
    n = len(segs)
    cap, rate, stages, dp, tpi, nmb, slow, block, head, p2p = np.array(
        [(seg.capacity, seg.min_usd_per_hr, seg.num_stages, seg.dp_degree, tp_at[seg.tp_degree], seg.num_microbatches,
          seg.slowness, seg.block_busy_s, seg.head_busy_s, seg.egress_usd) for seg in segs] + [_UNUSED_ROW],
        dtype=float).reshape(-1, 10).T.copy()
    stages, dp, tpi = stages.astype(np.int64), dp.astype(np.int64), tpi.astype(np.int64)
    links = tp_link[tpi]
    own = slice(0, n)
    return dict(
        segs=segs, tps=tps, ring=ring, have_ring=np.zeros(n + 1, dtype=bool), alone=alone, max_p=max_p,
        curves=curves, have_curve=np.zeros(n + 1, dtype=bool),
        cap=cap, rate=rate, stages=stages, dp=dp, d1=dp == 1, tpi=tpi,
        self_link=np.where(stages > 1, (nmb - 1) * links / 2, 0.0),
        steady=np.append(steady_links_s(nmb[own], links[own], stages[own]), 0.0),
        link=np.append(links[own], 0.0), blocks=np.append(tp_blocks[tpi[own]], False),
        # (raised by ``SegmentParts.blocked_s`` where the cheaper bounds leave a shape within
        # the limits, ``_with_blocked``: one segment alone, as ``ShapeBounds.time_lb`` has it)
        warm=np.append(warm_up_with_links_s(work_s * slow[own], nmb[own], stages[own], links[own]), 0.0)
        if segs else np.zeros(1),
        p2p_usd=p2p if cost_matters else np.zeros(n + 1),
        ring_usd=np.array([egress.ring_usd_per_byte(seg) for seg in segs] + [0.0]) if cost_matters else np.zeros(n + 1),
        inv=np.append(1.0 / slow[own], 0.0), slow=slow, nmb=nmb.astype(np.int64),
        drain=np.array([(1 - 1 / seg.num_microbatches) ** seg.num_stages for seg in segs] + [1.0]),
        block=block, head=head,
        gid=np.array(([-1] * n if alone else [parts.granular_id(seg.num_stages, seg.block_busy_s, seg.head_busy_s)
                                              for seg in segs]) + [parts.granular_id(0, math.inf, math.inf)],
                     dtype=np.int64),
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
                 num_blocks_lb: float, defer: tuple[str, ...] = ()) -> ScoredShapes:
    """Every shape of one or two GPU types (``present``: each type's segments), scored at once
    with the bound ``tight`` gives it before refinement; shapes that miss the limits, or whose
    bound cannot enter the top N found so far, are dropped (``searcher.threshold``: it only
    falls, so it stays their bound).  ``defer`` (one type): what is left to the refinement, which
    gives the same final bounds: "alone" the alone bound, "ring" the ring (``cut.LazyCut``: both;
    the widening pass: the alone bound, on at most ``FIRST_REFINED`` shapes, all refined then)."""
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
    pairs, pipe, lmat, kinds = _within_on_grid(searcher, lists, a, b, work_s, limits, limit)
    if defer == ("alone",) and len(pairs.ia) > FIRST_REFINED:
        defer = ()  # (past the first refined, shapes keep their first bound: it must hold it)
    if "alone" not in defer:
        pairs, pipe = within_on_pipeline(pairs, _with_blocked(searcher.parts, a, b, pairs, pipe, work_s), limits,
                                          limit)
    sync = pairs.tau * 0.0 if "ring" in defer else _sync(searcher.parts, a, b, pairs)
    egress, rings_p2p = _egress(searcher, lists, a, b, pairs, num_mb, mbs, kinds)
    refining = Refining(lists=lists, a=a, b=b, lmat=lmat, rings_p2p=rings_p2p, work_s=work_s,
                        block_bytes=searcher.figures.gradient_bytes_lb(mbs)[1], num_blocks_lb=num_blocks_lb,
                        cost_matters=cost_matters, parts=searcher.parts)
    return ScoredShapes(pairs, pipe=pipe, sync=sync, egress=egress, refining=refining, limits=limits, limit=limit,
                        defer=defer)


def _within_on_grid(searcher: Searcher, lists, a: dict, b: dict, work_s: float, limits: Limits, limit: float):
    """(pairs, their pipeline bounds, ``_pipeline``'s links matrix, ``_meeting_kinds``) of the
    pairs within the limits on capacity, rent and the pipeline bound, in the grid's order.  The
    pipeline bound rules out most pairs a cap, a floor or the top N leave on capacity and rent
    (the floor row: 469,000 of 2.5 million -> 72,000); the sync and egress bounds, which only
    raise a bound, are needed for the rest alone (same figures and order as for all).  Taken a
    block of the grid at a time (``grid.pair_blocks``): each pair's figures are its own, and
    small arrays are memory reused, where the whole grid's pairs are fresh pages each time."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    lmat = _links_between(searcher.parts, lists, a, b)
    seen = np.zeros(len(a["segs"]) + 1, dtype=bool), np.zeros(len(b["segs"]) + 1, dtype=bool)
    kept = []
    # Two segments' blocked sends where a cap, a floor or the cost objective binds (the floor row's
    # proof rests on it); a throughput search without them keeps its bounds: its walk is an
    # estimate-ordered heuristic under a budget, which the bound reorders (the replay's requests,
    # 200 evaluations each: 11 of 429 answered worse, 19 better; docs/benchmarks/planner.md)
    blocked = searcher.cost_matters or not limits.unlimited()
    for block in pair_blocks(searcher, a, b, work_s, limits, limit):
        if searcher.cost_matters:
            _note_meeting(seen, a, b, block)
        block, pipe = within_on_pipeline(block, _pipeline(a, b, block, work_s, lmat), limits, limit)
        if blocked:
            block, pipe = within_on_pipeline(block, _with_blocked_pair(a, b, block, pipe, work_s, lmat), limits,
                                              limit)
        kept.append((block, pipe))
    kinds = _meeting_kinds(lists, seen) if searcher.cost_matters else None
    if len(kept) == 1:
        return *kept[0], lmat, kinds
    pipe = np.concatenate([p for _, p in kept])
    pairs = Pairs(**{name: np.concatenate([getattr(q, name) for q, _ in kept])
                     for name in ("ia", "ib", "stages", "tau", "rate")})
    return pairs, pipe, lmat, kinds


def _links_between(parts, lists, a: dict, b: dict):
    """The links between the two types' TP degrees (rows: the first's, columns: the second's;
    one type: a 1 x 1 zero), the shorter way of each."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    if not (a["segs"] and b["segs"]):
        return np.zeros((1, 1))
    pa, pb = ({tp: probe(segs, tp) for tp in x["tps"]} for segs, x in ((lists[0], a), (lists[1], b)))
    return np.array([[min(parts.link_s(pa[ta], pb[tb]), parts.link_s(pb[tb], pa[ta])) for tb in b["tps"]]
                     for ta in a["tps"]])


def _pipeline(a: dict, b: dict, pairs: Pairs, work_s: float, lmat):
    """The pipeline bound whatever the split of the pairs: links (``lmat``: between the types'
    TP degrees), the warm-up in the better order (``pipe_lb``), and for one segment its compute
    with its links (``steady_links_s``, ``warm_up_with_links_s``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib, tau = pairs.ia, pairs.ib, pairs.tau
    na, nb = len(a["segs"]), len(b["segs"])
    if not nb:  # one type: every pair is one segment alone (the unused type's terms as scalars)
        link = np.maximum(np.maximum(a["self_link"][ia], b["self_link"][nb]), 0.0)
        rate = pipe_work_rate_many(a["inv"][ia], a["drain"][ia], b["inv"][nb], b["drain"][nb])
        pipe = np.maximum(link, work_s / rate)
        return np.maximum(np.maximum(pipe, tau + a["steady"][ia] + b["steady"][nb]), a["warm"][ia])
    both = (ia < na) & (ib < nb)
    cross = np.zeros(len(ia))
    if na and nb:
        # the micro-batches of the narrower segment's replicas, ceil(num_mb / min(DP degrees))
        n = np.maximum(a["nmb"][ia], b["nmb"][ib])
        cross = np.where(both, (n - 1) * lmat[a["tpi"][ia], b["tpi"][ib]] / 2, 0.0)
    link = np.maximum(np.maximum(a["self_link"][ia], b["self_link"][ib]), cross)
    pipe = np.maximum(link, work_s / pipe_work_rate_many(a["inv"][ia], a["drain"][ia], b["inv"][ib], b["drain"][ib]))
    # One segment alone (a few of two types' pairs): its compute with its links, and its warm-up.
    lone = np.flatnonzero(~both) if both.any() else slice(None)  # (one type: all of them, as views)
    la, lb = ia[lone], ib[lone]
    pipe[lone] = np.maximum(np.maximum(pipe[lone], tau[lone] + a["steady"][la] + b["steady"][lb]),
                            np.where(la < na, a["warm"][la], b["warm"][lb]))
    return pipe


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


def _with_blocked_pair(a: dict, b: dict, pairs: Pairs, pipe, work_s: float, lmat):
    """The pairs' pipeline bounds, those of two segments whose kinds block on their sends raised
    by ``alone.blocked_pair_many`` (asked where the cheaper bounds left them within the limits)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib = pairs.ia, pairs.ib
    both = np.flatnonzero((ia < len(a["segs"])) & (ib < len(b["segs"])) & a["blocks"][ia] & b["blocks"][ib])
    if not len(both):
        return pipe
    ia, ib, pipe = ia[both], ib[both], pipe.copy()
    first, second = ((x["stages"][i], x["nmb"][i], x["slow"][i], x["link"][i]) for x, i in ((a, ia), (b, ib)))
    pipe[both] = np.maximum(pipe[both], blocked_pair_many(work_s, first, second, lmat[a["tpi"][ia], b["tpi"][ib]]))
    return pipe


def _sync(parts, a: dict, b: dict, pairs: Pairs):
    """The sync bound of the pairs: the shorter of the two segments' rings at the shape's depth."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib, stages = pairs.ia, pairs.ib, pairs.stages
    if not b["segs"]:  # one type: the unused type's ring is inf, its d1 false
        return np.where(a["d1"][ia], 0.0, _rings_of(a, ia, parts)[ia, stages])
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
    # One row per (TP, DP degree), the same for every stage count (the missing ones computed
    # together, ``SegmentParts.fill_ring_rows``), then laid out by array indexing.
    some = need[need < len(segs)]
    some = some[x["dp"][some] > 1]
    if len(some):
        codes = x["tpi"][some] * (1 << 32) + x["dp"][some]
        one_of = dict(zip(codes.tolist(), some.tolist()))  # a segment of each
        keys = sorted(one_of)
        held = [segs[one_of[c]] for c in keys]
        parts.fill_ring_rows(held)
        table = np.array([parts.ring_row(seg)[: x["max_p"] + 1] for seg in held])
        at = np.searchsorted(np.array(keys), codes)
        if x["alone"]:
            ring[some, x["stages"][some]] = table[at, x["stages"][some]]
        else:
            ring[some] = table[at]
    have[need] = True
    return ring


def _note_meeting(seen: tuple, a: dict, b: dict, pairs: Pairs) -> None:
    """Marks in ``seen`` (per segment of each type) those that meet one of the other type in
    ``pairs`` (``_meeting_kinds``)."""
    ia, ib = pairs.ia, pairs.ib
    both = (ia < len(a["segs"])) & (ib < len(b["segs"]))
    seen[0][ia[both]] = True
    seen[1][ib[both]] = True


def _meeting_kinds(lists, seen: tuple) -> list:
    """The kinds of the segments that meet one of the other type in the pairs within the limits
    on capacity and rent (``seen``, ``_note_meeting``): the least boundary activation over them
    prices where segments meet (``between_segments_usd``), the same however many of the pairs
    the pipeline bound rules out."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ua, ub = (np.flatnonzero(x) for x in seen)
    segs = [lists[0][i] for i in ua.tolist()] + [lists[1][i] for i in ub.tolist()]
    return list({id(seg.kind): seg.kind for seg in segs}.values())


def _egress(searcher: Searcher, lists, a: dict, b: dict, pairs: Pairs, num_mb: int, mbs: int, kinds: list | None):
    """(egress USD per iteration bound, the between-segments part as ``_meeting_usd`` reads it) of
    the pairs: each segment's own p2p, the rings (``rings_egress_lb``) and where two segments
    meet (``kinds``: whose boundary activations price it; None: cost does not matter)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    ia, ib = pairs.ia, pairs.ib
    if kinds is None and not searcher.cost_matters:
        return np.zeros(len(ia)), None  # (every part's price is 0 then: ``segment_columns``)
    na, nb = len(a["segs"]), len(b["segs"])
    both = (ia < na) & (ib < nb)
    meeting = None  # (nothing where they meet)
    if kinds is not None and both.any():
        # Only for the segments of the shapes left (the others: a zero row or column).
        ua, ub = (np.flatnonzero(np.bincount(idx[both], minlength=n)) for idx, n in ((ia, na), (ib, nb)))
        usd, rows, cols = searcher.egress.between_segments_usd(
            num_mb, [lists[0][i] for i in ua.tolist()], [lists[1][i] for i in ub.tolist()], kinds=kinds)
        meeting = np.pad(usd, ((0, 1), (0, 1))), np.full(na + 1, len(usd)), np.full(nb + 1, usd.shape[1])
        meeting[1][ua], meeting[2][ub] = rows, cols
    whole, block = searcher.figures.gradient_bytes_lb(mbs)
    rings = rings_egress_lb_many(a["ring_usd"][ia], b["ring_usd"][ib], a["stages"][ia], b["stages"][ib], both,
                                 whole, block)
    return a["p2p_usd"][ia] + b["p2p_usd"][ib] + rings + _meeting_usd(meeting, ia, ib), meeting


def _meeting_usd(meeting: tuple | None, ia, ib):
    """The between-segments egress of the pairs (ia, ib): (matrix, row per segment of the first
    type, column per segment of the second), as ``_egress`` keeps it (None: 0)."""
    if meeting is None:
        return 0.0
    usd, rows, cols = meeting
    return usd[rows[ia], cols[ib]]


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
                 limit: float, defer: tuple[str, ...] = ()) -> None:
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
        self.defer = defer  # what is still to add ("alone", "ring": every shape is refined then)
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
            if "ring" in self.defer:
                self.sync[sel] = _sync(self.parts, a, b, sub)
        exact = sel
        if below < math.inf:
            # A few bisection steps first (a lower bound) leave most at or above ``below`` (floor row:
            # 30 % not); those below take the other steps from there (the same bound as all at once)
            lo, hi = self.parts.granular_of(a, ia[sel], b, ib[sel], steps=ROUGH_STEPS)
            tau[sel] = np.maximum(tau[sel], lo)
            t_lb[sel] = np.maximum(tau[sel], self.pipe[sel]) + self.sync[sel]
            alive = self._alive(sel, below)
            exact = sel[alive]
            granular = self.parts.granular_of(a, ia[exact], b, ib[exact], steps=GRANULAR_STEPS - ROUGH_STEPS,
                                              start=(lo[alive], hi[alive]))[0]
        else:
            granular = self.parts.granular_of(a, ia[exact], b, ib[exact])
        tau[exact] = np.maximum(tau[exact], granular)
        t_lb[exact] = np.maximum(tau[exact], self.pipe[exact]) + self.sync[exact]
        if not (a["segs"] and b["segs"]):
            return  # (one type: no shape of two segments)
        alive = self._alive(sel, below)
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
            _min_max_lines(u, v, PIPELINE_RISING, PIPELINE_FALLING), rings)], axis=0)
        t_lb[two] = np.maximum(t_lb[two], joint)
        if self.cost_matters:
            self._refine_cost(two, u, v, rings)

    def _alive(self, sel, below: float):
        """Of the shapes ``sel``: whether their ``t_lb`` is within the limits and below ``below``."""
        t_lb, rate, egress = self.t_lb[sel], self.rate[sel], self.egress[sel]
        return self.limits.within(t_lb, rate, egress) & (self.limits.score(t_lb, rate, egress) < min(self.limit, below))

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
        usd = np.min([h + per_s * ring for h, ring in zip(_min_max_lines(cu, cv), rings)], axis=0)
        fixed = a["p2p_usd"][ia[two]] + b["p2p_usd"][ib[two]] + _meeting_usd(self.rings_p2p, ia[two], ib[two])
        self.egress[two] = np.maximum(self.egress[two], usd + fixed - rate[two] * self.t_lb[two] / 3600)


def _min_max_lines(u, v, rising=None, falling=None) -> list:
    """``bounds.min_max_lines`` over ``_INTERVALS``, ``LINE_COLUMNS`` shapes (columns) at a time:
    each column's figures are its own, and its temporaries (one row per pair of lines) stay small
    enough to be memory reused, where a whole chunk's are fresh pages each call."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    n = u.shape[1]
    if n <= LINE_COLUMNS:
        return min_max_lines(u, v, _INTERVALS, rising, falling)
    parts = [min_max_lines(u[:, k:k + LINE_COLUMNS], v[:, k:k + LINE_COLUMNS], _INTERVALS, rising, falling)
             for k in range(0, n, LINE_COLUMNS)]
    return [np.concatenate(column) for column in zip(*parts)]


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
