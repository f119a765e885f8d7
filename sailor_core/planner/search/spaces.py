"""The shapes of one micro-batch size (``Space``): per GPU type its segments in the lazy order
(``streams.ProductHeap``), and for one or two types every shape scored and sorted
(``scored.score_shapes``), the same in every pass of one request (kept in the search's memos)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sailor_core.planner.search.cut import LazyCut, settle_cut
from sailor_core.planner.search.scored import score_shapes
from sailor_core.planner.search.searcher import Searcher
from sailor_core.planner.search.shapes import NO_SEGMENT, Segment
from sailor_core.planner.search.streams import FIRST_CHUNK, ProductHeap, SortedShapes

# Under a cap, a floor or the cost objective, only the best this many bounds over all
# micro-batch sizes are queued (see ``attach_sorted``).
BANDED_KEEP = 4000
LAZY_ONE_TYPE = True  # (tests compare it with the cut settled before the walk)
LAZY_ALONE = True  # (tests compare it with the alone bound scored up front)


@dataclass(slots=True, eq=False)
class Space:
    mbs: int
    num_mb: int
    ref: list[float]  # per layer: the fastest kind's forward + backward
    ref_total_s: float  # over the layers the capacity bound counts
    all_total_s: float  # every layer on its fastest kind: no iteration is shorter
    num_blocks_lb: float  # ref_total_s / the largest block's ref: blocks a share x of the work holds >= x times it
    lists: list[list[Segment | None]]  # per type: its segments and NO_SEGMENT, in the heap's order
    present: list[list[Segment]]  # the same without NO_SEGMENT (shared: never changed)
    heap: ProductHeap | None  # three types or more: their shapes in the lazy order
    sorted: SortedShapes | None = None


def build_spaces(searcher: Searcher) -> list[Space]:
    """One ``Space`` per micro-batch size with a kind of some GPU type."""
    throughput = not searcher.req.ranking.by_cost
    L = searcher.num_layers
    spaces = []
    for mbs in searcher.micro_batch_sizes():
        num_mb = searcher.req.global_batch_size // mbs
        kinds = [k for g in searcher.gpu_types for _, k in searcher.figures.kinds_of(g, mbs)]
        if not kinds:
            continue
        # (a sub-search of the same GPU types, the widening pass, has the same kinds and variants)
        ref_all = searcher.memos.types.layer_refs.get(mbs)
        if ref_all is None:
            variants = [v for k in kinds for v in searcher.figures.variants(k)]
            # (each variant's layer times, ``Kind.time_s``, listed once; then the least per layer)
            ref_all = searcher.memos.types.layer_refs[mbs] = [
                min(times) for times in zip(*[[c[i + 1] - c[i] for i in range(L)]
                                              for c in (v.comp_cum for v in variants)])]
        # The capacity bound may count any subset of layers; the transformer blocks scale alike
        # on every kind, whereas the embedding (whose backward Sailor's profiles miss) would make
        # the slowest kind look as fast as the fastest.
        blocks = range(1, L - 1) if L >= 3 else range(L)
        ref = [ref_all[i] if i in blocks else 0.0 for i in range(L)]
        lists, present = [], []
        for gpu in searcher.gpu_types:
            ordered, segs = _ordered(searcher, searcher.segments_for(gpu, mbs, num_mb, ref), throughput)
            lists.append(ordered)
            present.append(segs)
        heap = None  # (one or two types are scored and sorted: ``attach_sorted``)
        if len(lists) > 2:
            heap = ProductHeap([[-(s.capacity if s else 0.0) for s in lst] if throughput else
                                [(s.min_usd_per_hr if s else 0.0) for s in lst] for lst in lists])
        spaces.append(Space(mbs=mbs, num_mb=num_mb, ref=ref, ref_total_s=sum(ref), all_total_s=sum(ref_all),
                            num_blocks_lb=sum(ref) / max(max(ref), 1e-300), lists=lists, present=present,
                            heap=heap))
    return spaces


def _ordered(searcher: Searcher, base: list[Segment], throughput: bool):
    """(``base`` and NO_SEGMENT in the lazy order, ``base`` in that order), for the process."""
    memo = searcher.memos.process.ordered_lists
    hit = memo.get((id(base), throughput))
    if hit is None or hit[0] is not base:
        segs: list[Segment | None] = list(base)
        segs.append(NO_SEGMENT)
        if throughput:
            segs.sort(key=lambda s: -s.capacity if s else 0.0)
        else:
            segs.sort(key=lambda s: s.min_usd_per_hr if s else 0.0)
        hit = memo[(id(base), throughput)] = (base, segs, [seg for seg in segs if seg is not None])
    return hit[1], hit[2]


def attach_sorted(searcher: Searcher, spaces: list[Space]) -> None:
    """Give each space of one or two GPU types its shapes in exact order of their bound (cheap
    with numpy; more types stay lazy, in order of the looser capacity bound).  The same in every
    pass of one request: scored once, walked afresh.  With caps, a floor or the cost objective
    the shapes within the limits on paper form a wide band, and every one is refined before the
    search can tell it misses them: keep the best ``BANDED_KEEP`` bounds over all micro-batch
    sizes (the rest stay in the proof as a bound)."""
    req = searcher.req
    memo = searcher.memos.own.scored
    banded = (req.ranking.by_cost or req.max_usd_per_hour is not None
              or req.max_usd_per_iteration is not None)
    if any(len(sp.lists) <= 2 and sp.mbs not in memo for sp in spaces):
        # One type banded: its walk stops far below the cut (``cut.LazyCut``).
        lazy = banded and LAZY_ONE_TYPE and len(searcher.gpu_types) == 1
        alone_later = LAZY_ALONE and searcher.lazy_alone_bound and len(searcher.gpu_types) == 1
        defer = ("alone", "ring") if lazy else ("alone",) if alone_later else ()
        fresh = {sp.mbs: score_shapes(searcher, sp.present, mbs=sp.mbs, num_mb=sp.num_mb, work_s=sp.ref_total_s,
                                      num_blocks_lb=sp.num_blocks_lb, defer=defer)
                 for sp in spaces if len(sp.lists) <= 2}
        if lazy:
            band = LazyCut(list(fresh.values()), BANDED_KEEP)
            memo.update({mbs: band.sorted(scored) for mbs, scored in fresh.items()})
        else:
            cut = settle_cut(list(fresh.values()), BANDED_KEEP) if banded else math.inf
            for mbs, scored in fresh.items():
                memo[mbs] = scored.sorted_below(cut) if banded else scored.streamed()
            if not banded:  # (each stream's first refinement: its granular bounds, all sizes at once)
                searcher.parts.granular_ahead([(s.a, s.ia[s.first[:FIRST_CHUNK]], s.b, s.ib[s.first[:FIRST_CHUNK]])
                                               for s in fresh.values()])
    for space in spaces:
        if len(space.lists) <= 2:
            space.sorted = memo[space.mbs].fresh()
