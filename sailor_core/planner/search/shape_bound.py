"""A shape's bound as the loop queues it (``ShapeBounds.tight``): the time bounds of ``bounds``
composed for one shape (capacity, links, warm-up, sync, the joint bound of two segments), the
rent and egress it must pay, and the limits checked on them; and the queue's *estimate* (the
bound scaled by the excess of simulated over bounded time seen so far), which orders the queue
but never prunes."""

from __future__ import annotations

import math

from sailor_core.planner.search import bounds
from sailor_core.planner.search.searcher import Searcher
from sailor_core.planner.search.shapes import Segment
from sailor_core.planner.search.spaces import Space


class ShapeBounds:
    """Bounds and estimates of shapes for one pass of the loop over ``searcher``."""

    __slots__ = ("searcher", "req", "gbs", "throughput", "cost_matters", "parts", "egress", "figures", "_last")

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self.req = searcher.req
        self.gbs = searcher.req.global_batch_size
        self.throughput = not searcher.req.ranking.by_cost
        self.cost_matters = searcher.cost_matters
        self.parts, self.egress, self.figures = searcher.parts, searcher.egress, searcher.figures
        self._last = None  # (arguments, (tau, floor, bound)) of the last time bound

    def time_lb(self, space: Space, shape: tuple[Segment, ...], busiest: float, known_s: float | None):
        """(capacity bound, pipeline bound, iteration bound) of a shape: see ``tight``."""
        # Each order of a shape refined at level 0 asks for it in turn with the same arguments.
        args = (space, shape, busiest, known_s)
        last = self._last
        if last is not None and all(x is y or x == y for x, y in zip(last[0], args)):
            return last[1]
        parts, work_s = self.parts, space.ref_total_s
        link_s = parts.link_s
        tau = bounds.capacity_s(work_s, shape)
        floor_s = max(tau, busiest, bounds.link_lb(space.num_mb, shape, link_s), bounds.pipe_lb(work_s, shape))
        if len(shape) == 1:
            seg = shape[0]
            n, s = seg.num_microbatches, seg.num_stages
            floor_s = max(floor_s, tau + bounds.steady_links_s(n, link_s(seg, seg), s),
                          bounds.warm_up_with_links_s(work_s * seg.slowness, n, s, link_s(seg, seg)),
                          parts.blocked_s(seg, work_s * seg.slowness))
        t_lb = floor_s + bounds.sync_lb(shape, parts.ring_lb)
        if len(shape) == 2:
            t_lb = max(t_lb, parts.joint_lb(work_s, shape, floor_s))
        if known_s is not None:
            t_lb = max(t_lb, known_s)
        out = (tau, floor_s, t_lb)
        self._last = (args, out)
        return out

    def tight(self, space: Space, shape: tuple[Segment, ...], busiest: float = 0.0,
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
        (``scored`` scores more terms than this does); they still hold, for every split
        and placement.
        """
        req = self.req
        tau, floor_s, t_lb = self.time_lb(space, shape, busiest, None if known is None else known[0])
        rate = sum(s.min_usd_per_hr for s in shape) if costs is None else costs[0]
        t_chk = self.checked_time_s(shape, t_lb, busiest)
        if req.max_usd_per_hour is not None and rate > req.max_usd_per_hour * (1 + 1e-9):
            return None
        if costs is not None:
            egress = costs[1]
        elif self.cost_matters:
            egress = self.egress.rings_egress_lb(shape) + sum(seg.egress_usd for seg in shape)
        else:
            egress = 0.0
        if known is not None and not split_known:
            egress = max(egress, known[1])  # (the joint cost bound included: see scored)
        joint = len(shape) == 2 and self.cost_matters and not split_known and known is None
        if req.max_usd_per_iteration is not None:
            usd = rate * t_chk / 3600 + egress
            if joint and usd <= req.max_usd_per_iteration * (1 + 1e-9):
                fixed = egress - self.egress.rings_egress_lb(shape)
                usd = max(usd, self.joint_cost_lb(space, shape, floor_s, rate * t_chk / t_lb, fixed))
            if usd > req.max_usd_per_iteration * (1 + 1e-9):
                return None
        gbs = self.gbs
        if req.min_throughput_samples_per_s is not None and gbs / t_chk < req.min_throughput_samples_per_s * (1 - 1e-9):
            return None
        if not self.throughput and joint:
            # The estimate (``estimate``) scales the time: carry the joint bound in the egress.
            usd = self.joint_cost_lb(space, shape, floor_s, rate, egress - self.egress.rings_egress_lb(shape))
            egress = max(egress, usd - rate * t_lb / 3600)
        score = -gbs / t_lb if self.throughput else rate * t_lb / 3600 + egress
        return score, tau, (t_lb, rate, egress, sum(s.num_stages for s in shape))

    def joint_cost_lb(self, space: Space, shape: tuple[Segment, ...], floor_s: float, usd_per_hr: float,
                      fixed_usd: float) -> float:
        """``bounds.joint_cost_lb`` of a two-segment shape."""
        parts, egress = self.parts, self.egress
        a, b = shape
        s1, s2 = parts.sync_curve(a), parts.sync_curve(b)
        work_s = space.ref_total_s
        a1, a2 = work_s / a.capacity, work_s / b.capacity
        na, nb = a.num_microbatches, b.num_microbatches
        k1 = parts.steady_links_s(a) * float(bounds.steady_share(na, nb))
        k2 = parts.steady_links_s(b) * float(bounds.steady_share(nb, na))
        block = self.figures.gradient_bytes_lb(space.mbs)[1]
        e1 = egress.ring_usd_per_byte(a) * block * space.num_blocks_lb
        e2 = egress.ring_usd_per_byte(b) * block * space.num_blocks_lb
        side_a = bounds.JointSide(compute_s=a1, steady_links_s=k1, sync_curve=s1, ring_usd=e1)
        side_b = bounds.JointSide(compute_s=a2, steady_links_s=k2, sync_curve=s2, ring_usd=e2)
        return bounds.joint_cost_lb(floor_s, side_a, side_b, usd_per_hr, fixed_usd)

    # ---- estimates: the queue's order and, in the estimating pass, the limits ------------------

    def checked_time_s(self, shape: tuple[Segment, ...], t_lb: float, busiest: float) -> float:
        """The iteration time the limits are checked on: the bound, or in the estimating pass
        (``Searcher.estimate_limits``) an estimate: the warm-up/cool-down of the other stages
        once the split is known ((P - 1) busiest steps over n micro-batches), and the bound
        scaled by the smallest excess seen so far on pipelines as deep (the bound leaves out
        more p2p and bubble time on deep ones)."""
        searcher = self.searcher
        if not searcher.estimate_limits:
            return t_lb
        num_stages = sum(s.num_stages for s in shape)
        t_chk = t_lb
        if busiest > 0:
            n_min = min(s.num_microbatches for s in shape)
            t_chk = t_lb + busiest * (num_stages - 1) / max(n_min, 1)
        return max(t_chk, t_lb * searcher.excess.get(num_stages, 1.0))

    def within_estimate(self, shape: tuple[Segment, ...], parts, busiest: float) -> bool:
        """The limits on ``checked_time_s`` for a shape whose bound parts are known."""
        req = self.req
        t_lb, rate, egress, _ = parts
        t_chk = self.checked_time_s(shape, t_lb, busiest)
        if t_chk == t_lb:
            return True  # the bound itself met them
        if req.max_usd_per_iteration is not None and rate * t_chk / 3600 + egress > req.max_usd_per_iteration * (1 + 1e-9):
            return False
        return req.min_throughput_samples_per_s is None or self.gbs / t_chk >= req.min_throughput_samples_per_s * (1 - 1e-9)

    def estimate(self, parts) -> float:
        """The queue's key: the bound's score with its iteration time scaled by the typical excess
        of simulated over bounded time seen so far on pipelines as deep (1 until one is seen,
        so unexplored depths come first).  Not a bound: ``tight`` decides pruning."""
        t_lb, rate, egress, num_stages = parts
        t = t_lb * self.searcher.typical_excess(num_stages)
        return -self.gbs / t if self.throughput else rate * t / 3600 + egress

    def loose(self, space: Space) -> float:
        """A bound on every shape the space's lazy heap has left: the capacity (or rent) key of
        the next one, over the work (or times the shortest iteration)."""
        key = space.heap.peek()
        if key == math.inf:
            return math.inf
        if self.throughput:
            return -self.gbs * (-key) / space.ref_total_s if key < 0 else 0.0
        return key * space.all_total_s / 3600.0
