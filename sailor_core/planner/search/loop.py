"""The best-first loop over shapes (see the package docstring)."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from sailor_core.network.model import Endpoint
from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.request import Objective
from sailor_core.planner.search.bounds import GRID as _GRID
from sailor_core.planner.search.bounds import PIPELINE_FALLING, PIPELINE_RISING
from sailor_core.planner.search.bounds import granular_many as _granular_many
from sailor_core.planner.search.bounds import min_max_lines as _min_max_lines
from sailor_core.planner.search.bounds import pipe_work_rate as _pipe_work_rate
from sailor_core.planner.search.bounds import pipe_work_rate_many as _pipe_work_rate_many
from sailor_core.planner.search.bounds import pipeline_lines as _pipeline_lines
from sailor_core.planner.search.bounds import steady_links_s as _steady_links_s
from sailor_core.planner.search.bounds import warm_up_with_links_s as _warm_up_with_links_s
from sailor_core.planner.search.memo import process_memo
from sailor_core.planner.search.scored import ProductHeap as _ProductHeap
from sailor_core.planner.search.scored import ScoredShapes as _ScoredShapes
from sailor_core.planner.search.scored import ShapeStream as _ShapeStream
from sailor_core.planner.search.scored import SortedShapes as _SortedShapes
from sailor_core.planner.search.scored import settle_cut as _settle_cut
from sailor_core.planner.search.searcher import Searcher
from sailor_core.planner.search.shapes import NO_SEGMENT as _NONE
from sailor_core.planner.search.shapes import Segment
from sailor_core.planner.search.shapes import order_key as _order_key
from sailor_core.planner.search.shapes import orders as _orders
from sailor_core.simulator.stage import boundary_transfer_s, endpoint
from sailor_core.simulator.tables import layer_table


_NO_SEGMENTS: list[Segment] = []
_GRANULAR_MEMO_SIZE = 1 << 16  # the second type's list of a one-type space (never changed)


def _ring_room(pools: dict[str, int], tp_degree: int) -> dict[str, int]:
    """Replicas of a TP degree each zone of a GPU type has room for (zones with none left out)."""
    return {z: n // tp_degree for z, n in pools.items() if n // tp_degree > 0}


def _probe(segs: list[Segment], tp: int) -> Segment:
    return next(seg for seg in segs if seg.tp_degree == tp)


@dataclass(slots=True)
class _MbsSpace:
    mbs: int
    num_mb: int
    ref: list[float]  # per layer: the fastest kind's forward + backward
    ref_total_s: float  # over the layers the capacity bound counts
    all_total_s: float  # every layer on its fastest kind: no iteration is shorter
    num_blocks_lb: float  # ref_total_s / the largest block's ref: blocks a share x of the work holds >= x times it
    lists: list[list[Segment | None]]  # per type: its segments and _NONE, in the heap's order
    present: list[list[Segment]]  # the same without _NONE (shared: never changed)
    heap: _ProductHeap
    sorted: _SortedShapes | None = None


def run_search(searcher: Searcher, budget: int | None = None, *, by_bound_only: bool = False) -> None:
    """Best-first search (see the module docstring); ``budget`` caps this call's evaluations;
    ``by_bound_only``: skip the estimate-ordered phase (a pass over shapes an earlier pass of the
    same search already ordered by estimate)."""
    req = searcher.req
    searcher.stats.exhausted = False  # this pass's own proof, or none
    stop_at = searcher.stats.work + (budget if budget is not None else req.max_evaluations)
    throughput = req.objective is Objective.THROUGHPUT
    spaces: list[_MbsSpace] = []
    ordered_memo = process_memo(searcher.kinds, searcher.network, "ordered segment lists")
    for mbs in searcher.micro_batch_sizes():
        num_mb = req.global_batch_size // mbs
        kinds = [k for g in searcher.gpu_types
                 for tp in valid_tp_degrees(req.model, g, req.max_tp_degree)
                 if (k := searcher.kinds.get(g, tp, mbs)) is not None]
        if not kinds:
            continue
        variants = [v for k in kinds for v in searcher.variants(k)]
        ref_all = [min(k.time_s(i, i + 1) for k in variants) for i in range(searcher.num_layers)]
        # The capacity bound may count any subset of layers; the transformer blocks scale alike
        # on every kind, whereas the embedding (whose backward Sailor's profiles miss) would make
        # the slowest kind look as fast as the fastest.
        blocks = range(1, searcher.num_layers - 1) if searcher.num_layers >= 3 else range(searcher.num_layers)
        ref = [ref_all[i] if i in blocks else 0.0 for i in range(searcher.num_layers)]
        lists: list[list[Segment | None]] = []
        present: list[list[Segment]] = []
        for gpu in searcher.gpu_types:
            base = searcher.segments_for(gpu, mbs, num_mb, ref)
            hit = ordered_memo.get((id(base), throughput))
            if hit is None or hit[0] is not base:
                segs: list[Segment | None] = list(base)
                segs.append(_NONE)
                if throughput:
                    segs.sort(key=lambda s: -s.capacity if s else 0.0)
                else:
                    segs.sort(key=lambda s: s.min_usd_per_hr if s else 0.0)
                hit = ordered_memo[(id(base), throughput)] = (base, segs, [seg for seg in segs if seg is not None])
            lists.append(hit[1])
            present.append(hit[2])
        if throughput:
            keys = [[-(s.capacity if s else 0.0) for s in lst] for lst in lists]
        else:
            keys = [[(s.min_usd_per_hr if s else 0.0) for s in lst] for lst in lists]
        spaces.append(_MbsSpace(mbs=mbs, num_mb=num_mb, ref=ref, ref_total_s=sum(ref),
                                all_total_s=sum(ref_all), num_blocks_lb=sum(ref) / max(max(ref), 1e-300),
                                lists=lists, present=present,
                                heap=_ProductHeap(keys)))

    gbs = req.global_batch_size
    cost_matters = searcher.cost_matters

    def loose(space: _MbsSpace) -> float:
        key = space.heap.peek()
        if key == math.inf:
            return math.inf
        if throughput:
            return -gbs * (-key) / space.ref_total_s if key < 0 else 0.0
        return key * space.all_total_s / 3600.0

    # (key, tie, space, shape, busiest bound, level, level data, score bound, bound parts)
    pending: list[tuple] = []
    counter = itertools.count()

    last_time_lb: list = [None]  # (arguments, (tau, floor, bound)) of tight's last time bound

    def tight(space: _MbsSpace, shape: tuple[Segment, ...], busiest: float = 0.0,
              costs: tuple[float, float] | None = None, split_known: bool = False,
              known: tuple[float, float] | None = None):
        """(score bound, busiest-stage bound, (iteration-time bound, USD/hour, egress USD per
        iteration, stages)) of a shape, or None if the limits rule it out.

        ``busiest``: the busiest stage of the shape's min-max split when known; every split of
        the shape has a stage at least that busy, and no iteration is shorter than its busiest stage.
        ``costs``: (USD per hour, egress USD per iteration) of its placement, once known: exact
        for its split when ``split_known``, else the rent and a bound (``rings_egress_lb`` and
        the placement's p2p).
        ``known``: (iteration time, egress USD per iteration) bounds the shape was queued with
        (``sorted_shapes`` scores more terms than this does); they still hold, for every split
        and placement.
        """
        # The time bound does not depend on the costs: each order of a shape refined at level 0
        # asks for it in turn with the same arguments.
        args = (space, shape, busiest, None if known is None else known[0])
        last = last_time_lb[0]
        if last is not None and all(x is y or x == y for x, y in zip(last[0], args)):
            tau, floor_s, t_lb = last[1]
        else:
            cap = sum(s.capacity for s in shape)
            tau = space.ref_total_s / cap
            floor_s = max(tau, busiest, link_lb(space, shape), pipe_lb(space.ref_total_s, shape))
            if len(shape) == 1:
                seg = shape[0]
                floor_s = max(floor_s, tau + steady_links_s(seg), _warm_up_with_links_s(
                    space.ref_total_s * seg.slowness, seg.num_microbatches, seg.num_stages, link_s(seg, seg)))
            t_lb = floor_s + sync_lb(shape)
            if len(shape) == 2:
                t_lb = max(t_lb, joint_lb(space.ref_total_s, shape, floor_s))
            if known is not None:
                t_lb = max(t_lb, known[0])
            last_time_lb[0] = (args, (tau, floor_s, t_lb))
        rate = sum(s.min_usd_per_hr for s in shape) if costs is None else costs[0]
        # Limits are checked on the bound, and in the estimating pass also on an estimate: the
        # warm-up/cool-down of the other stages once the split is known ((P - 1) busiest steps
        # over n micro-batches), and the bound scaled by the smallest excess seen so far on
        # pipelines as deep (the bound leaves out more p2p and bubble time on deep ones).
        t_chk = checked_time_s(shape, t_lb, busiest)
        if req.max_usd_per_hour is not None and rate > req.max_usd_per_hour * (1 + 1e-9):
            return None
        if costs is not None:
            egress = costs[1]
        elif cost_matters:
            egress = rings_egress_lb(shape) + sum(seg.egress_usd for seg in shape)
        else:
            egress = 0.0
        if known is not None and not split_known:
            egress = max(egress, known[1])  # (the joint cost bound included: see sorted_shapes)
        joint = len(shape) == 2 and cost_matters and not split_known and known is None
        if req.max_usd_per_iteration is not None:
            usd = rate * t_chk / 3600 + egress
            if joint and usd <= req.max_usd_per_iteration * (1 + 1e-9):
                fixed = egress - rings_egress_lb(shape)
                usd = max(usd, joint_cost_lb(space, shape, floor_s, rate * t_chk / t_lb, fixed))
            if usd > req.max_usd_per_iteration * (1 + 1e-9):
                return None
        if req.min_throughput_samples_per_s is not None and gbs / t_chk < req.min_throughput_samples_per_s * (1 - 1e-9):
            return None
        if not throughput and joint:
            # The estimate (``estimate``) scales the time: carry the joint bound in the egress.
            usd = joint_cost_lb(space, shape, floor_s, rate, egress - rings_egress_lb(shape))
            egress = max(egress, usd - rate * t_lb / 3600)
        score = -gbs / t_lb if throughput else rate * t_lb / 3600 + egress
        return score, tau, (t_lb, rate, egress, sum(s.num_stages for s in shape))

    def checked_time_s(shape: tuple[Segment, ...], t_lb: float, busiest: float) -> float:
        """The iteration time the limits are checked on: the bound, or in the estimating pass an
        estimate (see ``tight``)."""
        if not searcher.estimate_limits:
            return t_lb
        num_stages = sum(s.num_stages for s in shape)
        t_chk = t_lb
        if busiest > 0:
            n_min = min(s.num_microbatches for s in shape)
            t_chk = t_lb + busiest * (num_stages - 1) / max(n_min, 1)
        return max(t_chk, t_lb * searcher.excess.get(num_stages, 1.0))

    def within_estimate(shape: tuple[Segment, ...], parts, busiest: float) -> bool:
        """The limits on ``checked_time_s`` for a shape whose bound parts are known."""
        t_lb, rate, egress, _ = parts
        t_chk = checked_time_s(shape, t_lb, busiest)
        if t_chk == t_lb:
            return True  # the bound itself met them
        if req.max_usd_per_iteration is not None and rate * t_chk / 3600 + egress > req.max_usd_per_iteration * (1 + 1e-9):
            return False
        return req.min_throughput_samples_per_s is None or gbs / t_chk >= req.min_throughput_samples_per_s * (1 - 1e-9)

    def estimate(parts) -> float:
        """The queue's key: the bound's score with its iteration time scaled by the typical excess
        of simulated over bounded time seen so far on pipelines as deep (1 until one is seen,
        so unexplored depths come first).  Not a bound: ``bound`` decides pruning."""
        t_lb, rate, egress, num_stages = parts
        t = t_lb * searcher.typical_excess(num_stages)
        return -gbs / t if throughput else rate * t / 3600 + egress

    by_bound = [by_bound_only]  # the second phase orders by the bound itself (see the main loop)

    def push(t, si, shape, tau, level, payload) -> None:
        key = t[0] if by_bound[0] else estimate(t[2])
        heapq.heappush(pending, (key, next(counter), si, shape, tau, level, payload, t[0], t[2]))

    sync_memo = searcher.bound_memos.setdefault("sync", {})
    # Behind the request's memos, the process's: rings depend on the zones that can hold a
    # segment's replicas (``ring_zones``), links on a type's zones, both on the segment's kind
    # under each regime it may run in (``Searcher.variants``) and the network (the memo's).
    bounds_memo = process_memo(searcher.kinds, searcher.network, "bound parts", max_entries=1 << 15)
    zone_names = {gpu: tuple(sorted(searcher.zone_gpus[gpu])) for gpu in searcher.gpu_types}

    def shared_bound(key: tuple, make, seg: Segment, *args):
        key = (key, tuple(searcher.variants(seg.kind)))
        hit = bounds_memo.get(key)
        if hit is None:
            hit = bounds_memo[key] = make(seg, *args)
        return hit

    link_memo = searcher.bound_memos.setdefault("link", {})
    egress_memo = searcher.bound_memos.setdefault("egress", {})

    def ring_usd_per_byte(seg: Segment) -> float:
        """USD per gradient byte (whole-model bytes: ``Searcher.gradient_bytes_lb``) the
        segment's rings send across zones, 0 when they can stay in a zone.  When no zone holds
        ``dp_degree`` replicas, or under the pipeline rule (only searched for segments no zone
        holds whole, so its pipelines span zones), every stage's ring spans two zones or more,
        each boundary carrying 2 (d - 1) / d of the stage's gradient times its TP degree (as
        fastsim charges it): counted in whole bytes, two segments' shares add up to the model's."""
        key = (seg.gpu, seg.tp_degree, seg.dp_degree, seg.rule)
        per_byte = egress_memo.get(key)
        if per_byte is None:
            live = sorted(z for z, n in searcher.zone_gpus[seg.gpu].items() if n > 0)
            per_byte = 0.0
            if seg.dp_degree > 1 and len(live) > 1 and (seg.rule == "pipeline" or seg.dp_degree > max(
                    searcher.zone_gpus[seg.gpu][z] // seg.tp_degree for z in live)):
                price = min(searcher.network.egress_usd_per_byte(a, b) for a in live for b in live if a != b)
                per_byte = 2 * 2 * (seg.dp_degree - 1) / seg.dp_degree * price
            egress_memo[key] = per_byte
        return per_byte

    def rings_egress_lb(shape: tuple[Segment, ...]) -> float:
        """USD per iteration of the gradient rings that must cross zones (``ring_usd_per_byte``).
        One segment holds the whole model; of two, each holds at least a block (or the
        embedding) per stage but one and together the whole model, so the cheapest split of
        the gradient between their rings puts all it can on the cheaper one."""
        whole, block = searcher.gradient_bytes_lb(shape[0].kind.micro_batch_size)
        if len(shape) == 1:
            return ring_usd_per_byte(shape[0]) * whole
        fa, fb = ring_usd_per_byte(shape[0]), ring_usd_per_byte(shape[1])
        least_a, least_b = (shape[0].num_stages - 1) * block, (shape[1].num_stages - 1) * block
        return fa * whole + (fb - fa) * least_b if fa <= fb else fb * whole + (fa - fb) * least_a

    def link_s(a: Segment, b: Segment) -> float:
        """Activation + gradient of one micro-batch between replicas of a and b (same zone if any)."""
        key = (a.gpu, a.tp_degree, b.gpu, b.tp_degree, a.kind.micro_batch_size)
        t = link_memo.get(key)
        if t is None:
            t = link_memo[key] = shared_bound(("link", key, zone_names[a.gpu], zone_names[b.gpu]), _link_s, a, b)
        return t

    def _link_s(a: Segment, b: Segment) -> float:
        za = sorted(searcher.zone_gpus[a.gpu])
        zb = sorted(searcher.zone_gpus[b.gpu])
        common = sorted(set(za) & set(zb))
        pair = (common[0], common[0]) if common else (za[0], zb[0])
        nbytes = min(layer_table(v.profile).output_bytes[min(1, searcher.num_layers - 1)]
                     for v in searcher.variants(a.kind))
        return boundary_transfer_s(
            searcher.network, nbytes, endpoint(pair[0], a.gpu, a.tp_degree),
            endpoint(pair[1], b.gpu, b.tp_degree))

    def link_lb(space: _MbsSpace, shape: tuple[Segment, ...]) -> float:
        """A link's steady state alone, (n - 1) l / 2, bounds the iteration (schedule._longest):
        inside a segment n = ceil(M / D); between segments the narrower side's NIC carries more."""
        worst = 0.0
        for seg in shape:
            if seg.num_stages > 1:
                worst = max(worst, (seg.num_microbatches - 1) * link_s(seg, seg) / 2)
        for a, b in itertools.combinations(shape, 2):
            n = -(-space.num_mb // min(a.dp_degree, b.dp_degree))
            worst = max(worst, (n - 1) * min(link_s(a, b), link_s(b, a)) / 2)
        return worst

    def rings_s(seg: Segment, nbytes) -> "np.ndarray":
        """The fastest ring the segment's replicas can form, for each of ``nbytes``: a ring in
        one zone that holds them all, else one over a set of zones that does.  A ring is paced
        by the slowest of its replicas' pairs (``NetworkModel._ring_s``), so over a set of
        zones it is at least the ring whose every hop is the set's slowest zone pair."""
        import numpy as np

        net, gpu, d = searcher.network, seg.gpu, seg.dp_degree
        room = _ring_room(searcher.zone_gpus[gpu], seg.tp_degree)
        alone = [z for z, c in room.items() if c >= d]
        if alone:
            return np.min([net.uniform_allreduce_times_s(nbytes, Endpoint(zone=z, gpu=gpu), d) for z in alone],
                          axis=0)
        best = None
        for size in range(2, len(room) + 1):
            for zones in itertools.combinations(sorted(room), size):
                if sum(room[z] for z in zones) < d:
                    continue
                ring = np.max([net.uniform_allreduce_times_s(nbytes, Endpoint(zone=a, gpu=gpu), d,
                                                             to=Endpoint(zone=b, gpu=gpu))
                               for a, b in itertools.permutations(zones, 2)], axis=0)
                best = ring if best is None else np.minimum(best, ring)
        assert best is not None, "a segment's replicas fit its GPU type's zones"
        return best

    def ring_zones(seg: Segment) -> tuple:
        """All ``rings_s`` depends on of the type's pools: the zones that hold the segment's
        replicas alone (it takes the least ring over them), else every zone's room."""
        room = _ring_room(searcher.zone_gpus[seg.gpu], seg.tp_degree)
        alone = sorted(z for z, c in room.items() if c >= seg.dp_degree)
        return ("alone", tuple(alone)) if alone else ("spread", tuple(sorted(room.items())))

    def ring_row(seg: Segment) -> list[float]:
        """``ring_lb`` of the segment's GPU type, TP and DP degree at every depth 1..max_stages
        (index 0: inf), at once."""
        import numpy as np

        key = (seg.gpu, seg.tp_degree, seg.dp_degree)
        row = sync_memo.get(key)
        if row is None:
            row = sync_memo[key] = shared_bound(("sync", key, ring_zones(seg), searcher.max_stages), _ring_row, seg)
        return row

    def _ring_row(seg: Segment) -> list[float]:
        import numpy as np

        nbytes = min(v.total_params * v.regime.grad_bytes_per_param for v in searcher.variants(seg.kind))
        depths = np.arange(1, searcher.max_stages + 1, dtype=float)
        return [math.inf] + rings_s(seg, nbytes / depths).tolist()

    def ring_lb(seg: Segment, num_stages: int) -> float:
        """The stage holding the most parameters holds at least 1/P of them; its ring is at best
        a same-zone ring of its segment's replicas.  (A bound up to TP-sharding rounding.)"""
        return ring_row(seg)[num_stages] if seg.dp_degree > 1 else 0.0

    def pipe_lb(work_s: float, shape: tuple[Segment, ...]) -> float:
        """The pipeline's warm-up and cool-down: no iteration is shorter than ``_pipe_work_rate``
        allows, in the better of the shape's orders."""
        return work_s / max(_pipe_work_rate(order) for order in _orders(shape))

    curve_memo = searcher.bound_memos.setdefault("sync_curve", {})

    def sync_curve(seg: Segment) -> tuple[float, ...]:
        """Lower bounds on the slowest DP ring of a segment holding the fraction k / _GRID of the
        blocks, k = 0.._GRID: one of its stages holds at least 1 / P of that share's gradient, and
        its ring is at best a same-zone ring of the segment's replicas."""
        key = (seg.gpu, seg.tp_degree, seg.dp_degree, seg.num_stages)
        curve = curve_memo.get(key)
        if curve is None:
            curve = curve_memo[key] = shared_bound(("sync curve", key, ring_zones(seg)), _sync_curve, seg)
        return curve

    def _sync_curve(seg: Segment) -> tuple[float, ...]:
        L = searcher.num_layers
        if seg.dp_degree <= 1 or L < 3:
            return (0.0,) * (_GRID + 1)
        import numpy as np

        blocks = min(layer_table(v.profile).params(1, L - 1) * v.regime.grad_bytes_per_param
                     for v in searcher.variants(seg.kind))
        return tuple(rings_s(seg, blocks * np.arange(_GRID + 1) / _GRID / seg.num_stages).tolist())

    def steady_links_s(seg: Segment) -> float:
        return _steady_links_s(seg.num_microbatches, link_s(seg, seg), seg.num_stages)

    def joint_lb(work_s: float, shape: tuple[Segment, ...], floor_s: float) -> float:
        """Compute, links and gradient sync together, for a shape of two segments.

        An iteration lasts at least its pipeline plus its slowest ring (fastsim: the pipeline,
        then each stage's sync).  A segment doing the share x of the block work has stages
        whose steps sum to at least x work slowness, so its pipeline lasts at least x work /
        capacity plus its links' steady state (``_steady_links_s``), and its ring at least
        ``sync_curve`` at x: shifting work to one segment to shorten the other's ring or
        pipeline lengthens its own; the bound is the best x (over the _GRID intervals, each
        ring at its interval's low end).  ``floor_s`` already bounds the pipeline (capacity,
        granular, links, warm-up).  (``sorted_shapes`` also counts where the segments meet.)"""
        s1, s2 = sync_curve(shape[0]), sync_curve(shape[1])
        a1, a2 = work_s / shape[0].capacity, work_s / shape[1].capacity
        k1, k2 = steady_links_s(shape[0]), steady_links_s(shape[1])
        balanced = (a2 + k2 - k1) / (a1 + a2)
        best = math.inf
        for k in range(_GRID):
            x = min(max(balanced, k / _GRID), (k + 1) / _GRID)
            best = min(best, max(floor_s, a1 * x + k1, a2 * (1 - x) + k2) + max(s1[k], s2[_GRID - 1 - k]))
        return best

    def joint_cost_lb(space: _MbsSpace, shape: tuple[Segment, ...], floor_s: float, usd_per_hr: float,
                      fixed_usd: float) -> float:
        """USD per iteration of a two-segment shape: rent over ``joint_lb``'s time and the
        egress of its rings together, ``fixed_usd`` (its p2p) added.  The segment doing the
        share x of the block work holds at least x ``num_blocks_lb`` blocks, whose gradient its
        rings carry across zones (``ring_usd_per_byte``) if they must: shifting blocks to the
        segment whose rings stay in a zone saves egress but lengthens its pipeline.  On each
        _GRID interval the cost is convex and piecewise linear in x, so its least is at an end
        or where two of its pieces meet."""
        s1, s2 = sync_curve(shape[0]), sync_curve(shape[1])
        work_s = space.ref_total_s
        a1, a2 = work_s / shape[0].capacity, work_s / shape[1].capacity
        k1, k2 = steady_links_s(shape[0]), steady_links_s(shape[1])
        block = searcher.gradient_bytes_lb(space.mbs)[1]
        e1 = ring_usd_per_byte(shape[0]) * block * space.num_blocks_lb
        e2 = ring_usd_per_byte(shape[1]) * block * space.num_blocks_lb
        per_s = usd_per_hr / 3600
        best = math.inf
        for k in range(_GRID):
            lo, hi = k / _GRID, (k + 1) / _GRID
            ring = max(s1[k], s2[_GRID - 1 - k])
            for x in (lo, hi, (a2 + k2 - k1) / (a1 + a2), (floor_s - k1) / a1, 1 - (floor_s - k2) / a2):
                x = min(max(x, lo), hi)
                usd = per_s * (max(floor_s, a1 * x + k1, a2 * (1 - x) + k2) + ring) + e1 * x + e2 * (1 - x)
                if usd < best:
                    best = usd
        return best + fixed_usd

    def sync_lb(shape: tuple[Segment, ...]) -> float:
        num_stages = sum(s.num_stages for s in shape)
        if any(seg.dp_degree == 1 for seg in shape):
            return 0.0
        return min(ring_lb(seg, num_stages) for seg in shape)

    route_memo = searcher.bound_memos.setdefault("route", {})
    # The granular bound of a two-segment shape depends on each segment's (stages, busy time per
    # block, of the head) alone, which recur from request to request: numbered for the process
    # (never renumbered: cached columns hold the numbers), the bounds kept by pair of numbers.
    granular_ids = searcher.kinds.extras.setdefault("granular ids", {})
    granular_memo = searcher.kinds.extras.setdefault(("granular bounds", searcher.num_blocks), {})

    def granular_id(num_stages: int, block_s: float, head_s: float) -> int:
        return granular_ids.setdefault((num_stages, block_s, head_s), len(granular_ids))

    def granular_of(a: dict, ia, b: dict, ib):
        """``_granular_many`` of the shapes (ia, ib), each pair of segment numbers worked out
        once (in one batch: each shape's figures depend on its own inputs alone)."""
        import numpy as np

        codes = a["gid"][ia] * (1 << 32) + b["gid"][ib]
        uniq, at, inverse = np.unique(codes, return_index=True, return_inverse=True)
        known = [granular_memo.get(c) for c in uniq.tolist()]
        miss = [j for j, v in enumerate(known) if v is None]
        if miss:
            m = at[miss]
            got = _granular_many(a["stages"][ia[m]], a["block"][ia[m]], a["head"][ia[m]],
                                 b["stages"][ib[m]], b["block"][ib[m]], b["head"][ib[m]],
                                 searcher.num_blocks, iterations=16).tolist()
            if len(granular_memo) > _GRANULAR_MEMO_SIZE:
                granular_memo.clear()
            for j, v in zip(miss, got):
                known[j] = granular_memo[int(uniq[j])] = v
        return np.array(known, dtype=float)[inverse]

    arrays_memo = process_memo(searcher.kinds, searcher.network, "segment columns")

    def between_segments_usd(space: _MbsSpace, first: list[Segment], second: list[Segment]):
        """USD per iteration, at the least, of the micro-batches crossing zones between two
        segments, per pair (numpy matrix).  Under the pipeline rule every stage of a segment has
        the same replicas per zone, whatever comes before it, so the boundary between two such
        segments routes micro-batch m from replica m mod D to replica m mod D' (``p2p_pairs``)
        between known zones, in either order; a segment under the stage rule whose zones have
        room for each of its stages whole puts every stage in one zone, which at best is the
        zone the other segment routes the most micro-batches to.  Each crossing carries the
        smallest boundary activation both ways."""
        import numpy as np

        gpus = {seg.gpu for seg in (*first, *second)}
        zones = sorted({z for gpu in gpus for z in searcher.zone_gpus[gpu]})
        m = np.arange(space.num_mb)

        def route(seg: Segment):
            """"one zone" (a stage in one zone), None (unknown) or the replicas per zone of
            every stage (the pipeline rule); the same for every micro-batch size."""
            key = (seg.gpu, seg.tp_degree, seg.dp_degree, seg.num_stages, seg.rule)
            hit = route_memo.get(key, route_memo)
            if hit is route_memo:
                if seg.rule == "stage":
                    room = sum((n // seg.tp_degree) // seg.dp_degree for n in searcher.zone_gpus[seg.gpu].values())
                    hit = "one zone" if room >= seg.num_stages else None
                else:
                    placed = searcher.build_stages((seg,))
                    hit = None if placed is None else placed[0][1]
                route_memo[key] = hit
            return hit

        def routes(segs: list[Segment]):
            """(per segment: its row in ``rows``, -2 for one zone a stage, or -1: unknown;
            rows: the zone of micro-batch m)."""
            index, rows, seen = [-1] * len(segs), [], {}
            for i, seg in enumerate(segs):
                key = route(seg)
                if key is None:
                    continue
                if key == "one zone":
                    index[i] = -2
                    continue
                if key not in seen:
                    of_replica = np.array([zones.index(z) for z, n in key for _ in range(n)])
                    seen[key] = len(rows)
                    rows.append(of_replica[m % len(of_replica)])
                index[i] = seen[key]
            return np.array(index, dtype=int), np.array(rows, dtype=int).reshape(len(rows), len(m))

        (ia, ra), (ib, rb) = routes(first), routes(second)
        out = np.zeros((len(first), len(second)))
        if not (len(ra) or len(rb)):
            return out
        # Crossings between rows, and between a row and a one-zone stage (the last column/row).
        def off_the_busiest_zone(rows):
            return len(m) - np.stack([(rows == z).sum(axis=1) for z in range(len(zones))], axis=1).max(axis=1)

        crossing = np.zeros((len(ra) + 1, len(rb) + 1))
        crossing[:-1, :-1] = (ra[:, None, :] != rb[None, :, :]).sum(axis=2)
        if len(ra):
            crossing[:-1, -1] = off_the_busiest_zone(ra)
        if len(rb):
            crossing[-1, :-1] = off_the_busiest_zone(rb)
        live = {z for gpu in gpus for z, n in searcher.zone_gpus[gpu].items() if n > 0}
        price = min(searcher.round_trip_usd_per_byte(x, y) for x in live for y in live if x != y)
        kinds = {id(seg.kind): seg.kind for seg in (*first, *second)}.values()
        nbytes = min(searcher.min_boundary_bytes(v) for kind in kinds for v in searcher.variants(kind))
        ra_of = np.where(ia == -2, len(ra), ia)  # -2: the one-zone row/column; -1 stays unknown
        rb_of = np.where(ib == -2, len(rb), ib)
        known = (ia[:, None] != -1) & (ib[None, :] != -1) & ~((ia[:, None] == -2) & (ib[None, :] == -2))
        out[known] = (crossing[ra_of[:, None], rb_of[None, :]] * nbytes * price)[known]
        return out

    def sorted_shapes(space: _MbsSpace) -> _ScoredShapes:
        """Every shape of one or two GPU types, scored at once (numpy) with the bound ``tight``
        gives it before refinement; ``sorted_below`` sorts those within the limits by it."""
        import numpy as np

        lists = list(space.present)
        if len(lists) == 1:
            lists.append(_NO_SEGMENTS)
        max_p = searcher.max_stages

        alone = not lists[1]  # one GPU type: a shape's depth is its one segment's

        def arrays(segs: list[Segment]) -> dict:
            ring = np.full((len(segs) + 1, max_p + 1), np.inf)
            rows: dict = {}  # ring_row by (TP, DP degree): the same for every stage count
            for i, seg in enumerate(segs):
                if seg.dp_degree > 1 and alone:
                    ring[i, seg.num_stages] = ring_lb(seg, seg.num_stages)
                elif seg.dp_degree > 1:
                    rows.setdefault((seg.tp_degree, seg.dp_degree), (seg, []))[1].append(i)
            for seg, at in rows.values():
                ring[at] = ring_row(seg)[: max_p + 1]
            tps = sorted({seg.tp_degree for seg in segs})
            curves = np.zeros((len(segs) + 1, _GRID + 1))  # sync_curve per segment, as needed
            # A segment's own link depends on its GPU type, TP and micro-batch size only.
            by_tp = {tp: link_s(seg, seg) for tp in tps for seg in (_probe(segs, tp),)}
            links = [by_tp[seg.tp_degree] for seg in segs]
            return dict(
                segs=segs, tps=tps, ring=ring, curves=curves, have_curve=np.zeros(len(segs) + 1, dtype=bool),
                cap=np.array([seg.capacity for seg in segs] + [0.0]),
                rate=np.array([seg.min_usd_per_hr for seg in segs] + [0.0]),
                stages=np.array([seg.num_stages for seg in segs] + [0]),
                dp=np.array([seg.dp_degree for seg in segs] + [1 << 30]),
                d1=np.array([seg.dp_degree == 1 for seg in segs] + [False]),
                tpi=np.array([tps.index(seg.tp_degree) for seg in segs] + [0]),
                self_link=np.array([(seg.num_microbatches - 1) * link / 2 if seg.num_stages > 1
                                    else 0.0 for seg, link in zip(segs, links)] + [0.0]),
                steady=np.array([_steady_links_s(seg.num_microbatches, link, seg.num_stages)
                                 for seg, link in zip(segs, links)] + [0.0]),
                warm=np.append(_warm_up_with_links_s(
                    space.ref_total_s * np.array([seg.slowness for seg in segs], dtype=float),
                    np.array([seg.num_microbatches for seg in segs], dtype=float),
                    np.array([seg.num_stages for seg in segs], dtype=int),
                    np.array(links, dtype=float)), 0.0) if segs else np.zeros(1),
                p2p_usd=np.array([seg.egress_usd if cost_matters else 0.0 for seg in segs] + [0.0]),
                ring_usd=np.array([ring_usd_per_byte(seg) if cost_matters else 0.0 for seg in segs] + [0.0]),
                inv=np.array([1.0 / seg.slowness for seg in segs] + [0.0]),
                slow=np.array([seg.slowness for seg in segs] + [0.0]),
                nmb=np.array([seg.num_microbatches for seg in segs] + [1]),
                drain=np.array([(1 - 1 / seg.num_microbatches) ** seg.num_stages for seg in segs] + [1.0]),
                block=np.array([seg.block_busy_s for seg in segs] + [np.inf]),
                head=np.array([seg.head_busy_s for seg in segs] + [np.inf]),
                gid=np.array([granular_id(seg.num_stages, seg.block_busy_s, seg.head_busy_s) for seg in segs]
                             + [granular_id(0, math.inf, math.inf)], dtype=np.int64),
            )

        # A list's columns depend on it and on these (the regime variants on the GPU types, the
        # rings and links on the type's pools, which the list is keyed on, and the network).
        context = (alone, max_p, cost_matters, space.ref_total_s, tuple(searcher.gpu_types), req.regime,
                   req.max_tp_degree)

        def arrays_of(segs: list[Segment]) -> dict:
            hit = arrays_memo.get((id(segs), context))
            if hit is None or hit[0] is not segs:
                hit = arrays_memo[(id(segs), context)] = (segs, arrays(segs))
            return hit[1]

        a, b = arrays_of(lists[0]), arrays_of(lists[1])
        na, nb = len(lists[0]), len(lists[1])
        # Every pair of segments (index na / nb: that type unused) as a grid, where the
        # cheapest terms are broadcast sums; the pairs left are taken out in the grid's order.
        stages = a["stages"][:, None] + b["stages"][None, :]
        keep = (stages >= 1) & (stages <= max_p)
        # One-type shapes of a type whose own search proved its best (see plan_job) are settled.
        if len(searcher.gpu_types) == 2:
            if searcher.gpu_types[0] in searcher.settled_types:
                keep[:, nb] = False
            if searcher.gpu_types[1] in searcher.settled_types:
                keep[na, :] = False
        with np.errstate(divide="ignore", invalid="ignore"):  # (no segment at all: not kept)
            tau = space.ref_total_s / (a["cap"][:, None] + b["cap"][None, :])
        rate = a["rate"][:, None] + b["rate"][None, :]
        # Shapes whose bound cannot enter the top N found so far (by the one-type searches, or
        # an earlier pass) are dropped now; the threshold stays their bound (it only falls).
        limit = searcher.threshold()

        def within_limits(t_lb, rate, egress):
            ok = np.ones(np.shape(t_lb), dtype=bool)
            if req.max_usd_per_hour is not None:
                ok &= rate <= req.max_usd_per_hour * (1 + 1e-9)
            if req.max_usd_per_iteration is not None:
                ok &= rate * t_lb / 3600 + egress <= req.max_usd_per_iteration * (1 + 1e-9)
            if req.min_throughput_samples_per_s is not None:
                ok &= gbs / t_lb >= req.min_throughput_samples_per_s * (1 - 1e-9)
            return ok

        def score_of(t_lb, rate, egress):
            return -gbs / t_lb if throughput else rate * t_lb / 3600 + egress

        # Most shapes miss on capacity and rent alone: drop them before the other terms.
        with np.errstate(divide="ignore", invalid="ignore"):
            keep &= within_limits(tau, rate, 0.0) & (score_of(tau, rate, 0.0) < limit)
        ia, ib = np.nonzero(keep)
        stages, tau, rate = stages[ia, ib], tau[ia, ib], rate[ia, ib]
        both = (ia < na) & (ib < nb)
        cross = np.zeros(len(ia))
        if na and nb:
            lmat = np.array([[min(link_s(_probe(lists[0], ta), _probe(lists[1], tb)),
                                  link_s(_probe(lists[1], tb), _probe(lists[0], ta)))
                              for tb in b["tps"]] for ta in a["tps"]])
            n = -(-space.num_mb // np.minimum(a["dp"][ia], b["dp"][ib]))
            cross = np.where(both, (n - 1) * lmat[a["tpi"][ia], b["tpi"][ib]] / 2, 0.0)
        else:
            lmat = np.zeros((1, 1))
        link = np.maximum(np.maximum(a["self_link"][ia], b["self_link"][ib]), cross)
        # Links and the pipeline's warm-up (pipe_lb, the better order) bound the pipeline whatever the split.
        pipe = np.maximum(link, space.ref_total_s / _pipe_work_rate_many(
            a["inv"][ia], a["drain"][ia], b["inv"][ib], b["drain"][ib]))
        # One segment: its compute and its links' steady state add (steady_links_s).
        pipe = np.maximum(pipe, np.where(both, 0.0, tau + a["steady"][ia] + b["steady"][ib]))
        # One segment: its warm-up with the links on the way (_warm_up_with_links_s).
        alone_a, alone_b = ia[~both], ib[~both]
        warm = np.where(alone_a < na, a["warm"][alone_a], b["warm"][alone_b])
        pipe[~both] = np.maximum(pipe[~both], warm)
        sync = np.where(a["d1"][ia] | b["d1"][ib], 0.0,
                        np.minimum(a["ring"][ia, stages], b["ring"][ib, stages]))
        rings_p2p = np.zeros((na + 1, nb + 1))
        if cost_matters and both.any():
            # Only for the segments of the shapes left.
            ua, ub = (np.flatnonzero(np.bincount(idx[both], minlength=n)) for idx, n in ((ia, na), (ib, nb)))
            rings_p2p[np.ix_(ua, ub)] = between_segments_usd(space, [lists[0][i] for i in ua.tolist()],
                                                              [lists[1][i] for i in ub.tolist()])
        egress_between = rings_p2p[ia, ib]
        # rings_egress_lb: one segment's rings carry the whole model; two share it.
        fa, fb = a["ring_usd"][ia], b["ring_usd"][ib]
        whole, block = searcher.gradient_bytes_lb(space.mbs)
        least_a, least_b = (a["stages"][ia] - 1) * block, (b["stages"][ib] - 1) * block
        rings = np.where(both, np.where(fa <= fb, fa * whole + (fb - fa) * least_b, fb * whole + (fa - fb) * least_a),
                         (fa + fb) * whole)
        egress = a["p2p_usd"][ia] + b["p2p_usd"][ib] + rings + egress_between

        # The limits on the capacity bound with links, warm-up and sync, then with the rest.
        t_lb = np.maximum(tau, pipe) + sync
        ok = within_limits(t_lb, rate, egress) & (score_of(t_lb, rate, egress) < limit)
        ia, ib, stages, tau, pipe, sync, rate, egress, t_lb = (
            x[ok] for x in (ia, ib, stages, tau, pipe, sync, rate, egress, t_lb))
        # The granular bound for the 20000 best on the capacity bound (the rest keep that one:
        # weaker, still a bound; the search rarely gets that far down), then the joint bounds,
        # both in that order and only as far as the caller needs (``_ScoredShapes.refine``).
        pre = score_of(t_lb, rate, egress)
        first = np.argsort(pre, kind="stable")[:20000]
        tau, egress = tau.copy(), egress.copy()  # refined in place
        intervals = [(k / _GRID, (k + 1) / _GRID) for k in range(_GRID)]

        def refine(sel):
            """Refine the shapes ``sel`` (a run of ``first``); the final scores of those still
            within the limits.  Each shape's figures depend on itself alone, so refining in
            chunks gives what refining all at once does."""
            refine_bounds(sel)
            score = score_of(t_lb[sel], rate[sel], egress[sel])
            return score[within_limits(t_lb[sel], rate[sel], egress[sel]) & (score < limit)]

        def curves_of(x: dict, idx):
            """``sync_curve`` of the segments ``idx`` of a list (past its end: no segment, no ring)."""
            need = np.flatnonzero(np.bincount(idx[~x["have_curve"][idx]], minlength=len(x["have_curve"])))
            for i in need.tolist():
                if i < len(x["segs"]):
                    x["curves"][i] = sync_curve(x["segs"][i])
            x["have_curve"][need] = True
            return x["curves"][idx]

        # (Not ``space`` itself in the closures a stream keeps: it holds the stream.)
        work_s, mbs, num_blocks_lb = space.ref_total_s, space.mbs, space.num_blocks_lb

        def refine_bounds(sel) -> None:
            gran = granular_of(a, ia[sel], b, ib[sel])
            tau[sel] = np.maximum(tau[sel], gran)
            t_lb[sel] = np.maximum(tau[sel], pipe[sel]) + sync[sel]
            # Two segments: compute, links and sync together (joint_lb, the same bound for every
            # shape), for those the granular bound left in.
            alive = within_limits(t_lb[sel], rate[sel], egress[sel]) & (
                score_of(t_lb[sel], rate[sel], egress[sel]) < limit)
            two = sel[alive & (ia[sel] < na) & (ib[sel] < nb)]  # (the rest keep the weaker bound)
            if not len(two):
                return
            # Rings only for the segments these shapes use (the curves cost a few rings each).
            c1, c2 = (curves_of(x, idx[two]) for x, idx in ((a, ia), (b, ib)))
            a1 = work_s / a["cap"][ia[two]]
            a2 = work_s / b["cap"][ib[two]]
            k1, k2 = a["steady"][ia[two]], b["steady"][ib[two]]
            floor_s = np.maximum(tau[two], pipe[two])
            # The pipeline as lines in the first segment's share x (where the segments meet too).
            u, v = _pipeline_lines(floor_s, a1, k1, a2, k2,
                                   work_s * a["slow"][ia[two]], work_s * b["slow"][ib[two]],
                                   a["stages"][ia[two]], b["stages"][ib[two]], a["nmb"][ia[two]],
                                   b["nmb"][ib[two]], lmat[a["tpi"][ia[two]], b["tpi"][ib[two]]])
            rings = [np.maximum(c1[:, k], c2[:, _GRID - 1 - k]) for k in range(_GRID)]
            joint = np.min([h + ring for h, ring in zip(
                _min_max_lines(u, v, intervals, PIPELINE_RISING, PIPELINE_FALLING), rings)], axis=0)
            t_lb[two] = np.maximum(t_lb[two], joint)
            if cost_matters:
                # Rent, time and the rings' egress together (joint_cost_lb), in the egress.
                per_blocks = num_blocks_lb * searcher.gradient_bytes_lb(mbs)[1]
                e1 = a["ring_usd"][ia[two]] * per_blocks
                e2 = b["ring_usd"][ib[two]] * per_blocks
                per_s = rate[two] / 3600
                # Cost lines: rent over each time line plus the rings' egress, e2 + (e1 - e2) x.
                # The flat time lines (floor, the links alone) share one slope here: keep their top.
                flat = [0, 3, 7]
                cu = np.vstack([per_s * u[flat].max(axis=0), per_s * np.delete(u, flat, axis=0)]) + e2
                cv = np.vstack([np.zeros((1, len(two))), per_s * np.delete(v, flat, axis=0)]) + (e1 - e2)
                usd = np.min([h + per_s * ring for h, ring in zip(_min_max_lines(cu, cv, intervals), rings)], axis=0)
                fixed = a["p2p_usd"][ia[two]] + b["p2p_usd"][ib[two]] + rings_p2p[ia[two], ib[two]]
                egress[two] = np.maximum(egress[two], usd + fixed - rate[two] * t_lb[two] / 3600)

        def sorted_below(cut: float, num_refined: int) -> _SortedShapes:
            """The shapes refined so far (the first ``num_refined`` of ``first``) and those never
            refined whose bound is below ``cut``, best first (ties in scoring order); shapes
            still to refine must not be below it."""
            done = np.ones(len(ia), dtype=bool)
            done[first[num_refined:]] = False
            score = score_of(t_lb, rate, egress)
            ok = done & within_limits(t_lb, rate, egress) & (score < min(limit, cut))
            order = np.flatnonzero(ok)[np.argsort(score[ok], kind="stable")]
            out = _SortedShapes(lists[0], lists[1], ia[order], ib[order], score[order], tau[order],
                                (t_lb[order], rate[order], egress[order], stages[order]))
            out.cut = min(limit, cut)
            return out

        def final_of(sel):
            """Refine the shapes ``sel`` (a run of ``first``): (those within the limits, their
            final bounds)."""
            refine_bounds(sel)
            return kept(sel)

        def kept(sel):
            score = score_of(t_lb[sel], rate[sel], egress[sel])
            ok = within_limits(t_lb[sel], rate[sel], egress[sel]) & (score < limit)
            return sel[ok], score[ok]

        def rows(idx):
            return ia[idx], ib[idx], tau[idx], (t_lb[idx], rate[idx], egress[idx], stages[idx])

        never = np.ones(len(ia), dtype=bool)
        never[first] = False

        def streamed(of: _ScoredShapes) -> _SortedShapes:
            """Every shape within the limits, best first, refined as the walk gets there
            (``_ShapeStream``): what ``sorted_below(inf)`` gives after refining them all."""
            empty = np.empty(0)
            out = _SortedShapes(lists[0], lists[1], empty, empty, empty, empty, (empty,) * 4)
            out.stream = _ShapeStream(of, out, final_of=final_of, never=lambda: kept(np.flatnonzero(never)),
                                      rows=rows)
            out.cut = limit
            return out

        return _ScoredShapes(refine=refine, sorted_below=sorted_below, pre=pre, first=first,
                             never_refined=np.sort(pre[never]), streamed=streamed)

    # Up to two GPU types: every shape at once, in exact order of its first bound (cheap with
    # numpy); more types: lazily, in order of the looser capacity bound.  The same in every
    # pass of one request: scored once.
    # With caps, a floor or the cost objective the shapes within the limits on paper form a
    # wide band, and every one is refined before the search can tell it misses them: keep the
    # best 4000 bounds over all micro-batch sizes (the rest stay in the proof as a bound).
    banded = not throughput or req.max_usd_per_hour is not None or req.max_usd_per_iteration is not None
    if any(len(sp.lists) <= 2 and sp.mbs not in searcher.sorted_memo for sp in spaces):
        fresh = {sp.mbs: sorted_shapes(sp) for sp in spaces if len(sp.lists) <= 2}
        cut = _settle_cut(list(fresh.values()), 4000) if banded else math.inf
        for mbs, scored in fresh.items():
            searcher.sorted_memo[mbs] = scored.sorted_below(cut) if banded else scored.streamed()
    for space in spaces:
        if len(space.lists) <= 2:
            space.sorted = searcher.sorted_memo[space.mbs].fresh()

    def next_bound(space: _MbsSpace) -> float:
        return space.sorted.peek() if space.sorted is not None else loose(space)

    # The capacity bound that orders the lazy heaps (three types or more) is far looser than
    # the queue's keys, so moving shapes until it crosses the best queued key would score tens
    # of thousands of shapes.  After a sample, scale it by a key/loose ratio seen so far: the
    # most optimistic one when ordering by the bound (phase two), the 90th percentile towards
    # optimistic when ordering by the estimate.  Not a bound, so a stop it causes is not
    # reported as exhausted.
    calib = {"ratio": None, "seen": 0, "ratios": []}

    def calibrated(lb: float) -> float:
        r = calib["ratio"]
        if r is None or calib["seen"] < 64 or lb in (math.inf, 0.0):
            return lb
        return lb * r

    def next_key(space: _MbsSpace) -> float:
        """What the next shape of a space would be queued at, or a guess of it."""
        if space.sorted is None:
            return calibrated(loose(space))
        if not space.sorted.has_next():
            return math.inf
        bound = space.sorted.peek()
        if by_bound[0]:
            return bound
        excess = searcher.typical_excess(space.sorted.peek_stages())
        return bound / excess if throughput else bound * excess  # (cost: the egress too, a guess)

    keys_seen = {"version": -1, "keys": []}  # next_key per space, until the excess or the space changes

    def fill_pending() -> None:
        # Move shapes to the queue while some space's next one would go in front of it.
        if keys_seen["version"] != searcher.excess_version:
            keys_seen["version"] = searcher.excess_version
            keys_seen["keys"] = [next_key(sp) for sp in spaces]
        keys = keys_seen["keys"]
        lazy = [i for i, sp in enumerate(spaces) if sp.sorted is None]
        while True:
            for i in lazy:  # their key follows the calibration, which moves with every pull
                keys[i] = next_key(spaces[i])
            key = min(keys, default=math.inf)
            si = keys.index(key) if keys else -1  # (the first space with the least key)
            if key == math.inf or calib["seen"] >= req.max_shapes_scored:
                return
            if pending and pending[0][0] <= key:
                return
            best_space = spaces[si]
            if best_space.sorted is not None:
                # Scored with the same bound as ``tight`` (numpy): only the estimate is left to check.
                shape, t = best_space.sorted.pop()
                keys[si] = next_key(best_space)
                if len(shape) == 1 and shape[0].gpu in searcher.settled_types:
                    continue
                if within_estimate(shape, t[2], t[1]):
                    push(t, si, shape, t[1], 0 if cost_matters else 1, None)
                continue
            else:
                lb = loose(best_space)
                idx = best_space.heap.pop()
                shape = tuple(s for lst, i in zip(best_space.lists, idx) if (s := lst[i]) is not None)
            keys[si] = next_key(best_space)
            if not shape or sum(s.num_stages for s in shape) > searcher.max_stages or (
                    len(shape) == 1 and shape[0].gpu in searcher.settled_types):
                continue
            g = searcher.granular_busiest_s(shape)
            t = tight(best_space, shape, g)
            if t is None:
                continue
            if best_space.sorted is None and lb not in (math.inf, 0.0):
                # Scores are -throughput (< 0) or cost (> 0); keys are >= loose either way.
                r = (t[0] if by_bound[0] else estimate(t[2])) / lb
                calib["seen"] += 1
                if by_bound[0]:
                    calib["ratio"] = r if calib["ratio"] is None else (
                        max(calib["ratio"], r) if lb < 0 else min(calib["ratio"], r))
                else:
                    calib["ratios"].append(r)
                    if calib["seen"] >= 64 and calib["seen"] & (calib["seen"] - 1) == 0:  # 64, 128, 256, ...
                        ranked = sorted(calib["ratios"], reverse=lb < 0)
                        calib["ratio"] = ranked[len(ranked) // 10]
            # Its granular bound is in already: without costs to look at, go straight to the split.
            push(t, si, shape, max(t[1], g), 0 if cost_matters else 1, None)

    def proof_is_near(threshold: float) -> bool:
        """Few shapes left whose bound beats the threshold: finish the proof rather than stop."""
        if any(sp.sorted is None for sp in spaces):
            return False
        left = len(pending) + sum(sp.sorted.count_below(threshold) for sp in spaces)
        return left <= 4 * req.patience

    def proven_done(threshold: float) -> bool:
        return all(next_bound(sp) >= threshold for sp in spaces)

    since_gain = 0.0
    while True:
        fill_pending()
        if not pending:
            searcher.stats.exhausted = proven_done(searcher.threshold())
            return
        if since_gain >= req.patience and not by_bound[0]:
            # Phase two: the estimates found the good plans; now go through the rest in order
            # of the bound, which proves the top N optimal (exhausted) where the space is small
            # and otherwise stops after twice as many fruitless evaluations.
            by_bound[0] = True
            since_gain = 0.0
            pending[:] = [(e[7], *e[1:]) for e in pending]
            heapq.heapify(pending)
            calib["ratio"], calib["seen"], calib["ratios"] = None, 0, []
            keys_seen["version"] = -1
            continue
        key, _, si, shape, tau, level, payload, bound, parts = heapq.heappop(pending)
        before = searcher.threshold()
        if bound >= before:
            if by_bound[0]:
                searcher.stats.exhausted = proven_done(before)
                return
            continue  # cannot enter the top N
        if searcher.stats.work >= stop_at:
            return
        best_before = searcher.top[0].score if searcher.top else math.inf
        if since_gain >= req.patience * (2 if by_bound[0] else 1) and not (by_bound[0] and proof_is_near(before)):
            return
        fresh = key if by_bound[0] else estimate(parts)
        if fresh > key and pending and fresh > pending[0][0]:
            # What was learnt since it was queued puts it behind others: re-queue.
            heapq.heappush(pending, (fresh, next(counter), si, shape, tau, level, payload, bound, parts))
            continue
        space = spaces[si]
        if level == 0:
            # Refine the bound in two steps, each re-queued so that only shapes still in front
            # pay for the next: whole blocks and the head layer (a few microseconds), then the
            # real split (memory, the real layer times; a tenth of an evaluation).
            g = searcher.granular_busiest_s(shape)
            known = (parts[0], parts[2])
            if not cost_matters:
                t = tight(space, shape, g, known=known)
                if t is not None:
                    push(t, si, shape, max(tau, g), 1, None)
                continue
            best = None
            for order in _orders(shape):
                placed = searcher.build_stages(order)
                if placed is None:
                    continue
                ckey = (space.mbs, _order_key(order))
                costs = searcher.placed_costs_memo.get(ckey)
                if costs is None:
                    costs = searcher.placed_costs_memo[ckey] = searcher.placed_costs_lb(space.mbs, placed)
                rent, p2p = costs
                rings = rings_egress_lb(shape)
                t = tight(space, shape, g, (rent, p2p + rings), known=known)
                if t is not None and (best is None or t[0] < best[0]):
                    best = t
            if best is not None:
                push(best, si, shape, max(tau, g), 1, None)
            continue
        if level == 1:
            # Each order's split and placement give its rent and cross-zone traffic exactly (a
            # pipeline or ring crossing zones can cost more than the GPUs).  Each order is
            # queued on its own bound: the worse one is often never evaluated.
            for order in _orders(shape):
                prep = searcher.prepare(space.mbs, order, tau)
                if prep is None:
                    continue
                costs = searcher.fast.rent_and_egress(space.mbs, searcher.fast_stages(prep[0], prep[1])) \
                    if cost_matters else None
                t = tight(space, shape, prep[2], costs, split_known=True, known=(parts[0], 0.0))
                if t is not None:
                    push(t, si, shape, tau, 2, (order, prep))
                elif before < math.inf:
                    # Split only to miss a cap, a floor or the top N: a quarter of an evaluation
                    # of patience (the work budget counts it the same), or a search whose
                    # shapes mostly miss a limit after the split would run to its budget.
                    since_gain += 0.25
            continue
        order, prep = payload
        ev = searcher.evaluate_shape(space.mbs, order, tau, prep)
        if ev is not None and ev.res.fits:
            searcher.learn_excess(parts[3], ev.res.iteration_time_s / parts[0])
        # Patience: the queue's order is an estimate, so stop once many evaluations in a row no
        # longer improve the best plan by more than 0.1 %.
        after = searcher.threshold()
        best_after = searcher.top[0].score if searcher.top else math.inf
        if best_after < best_before and (best_before == math.inf or best_before - best_after > 1e-3 * abs(best_before)):
            since_gain = 0.0
        elif after < math.inf:  # no patience before the first plan that meets the request
            since_gain += 1.0
