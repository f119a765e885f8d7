"""The best-first loop over shapes (``run_search``; see the package docstring).

A queue entry is a shape with its bound at one *level* of refinement; popping it refines it one
level and queues it again, so only shapes still in front pay for the next level:

0. the granular bound and, when cost matters, each order's placement (exact rent, the egress of
   micro-batches crossing zones);
1. each order's min-max split (memory, the real layer times), queued on its own;
2. the split order is evaluated (and polished): a plan.

The queue is ordered by an estimate (``ShapeBounds.estimate``) until ``patience`` evaluations in
a row do not improve the best plan; then by the bound itself, which either proves the top N
optimal (``exhausted``) or stops after twice the patience.
"""

from __future__ import annotations

import heapq
import itertools
import math

from sailor_core.planner.search.searcher import Searcher
from sailor_core.planner.search.shape_bound import ShapeBounds
from sailor_core.planner.search.shapes import Segment, fast_stages, order_key, orders, placed_key
from sailor_core.planner.search.spaces import Space, attach_sorted, build_spaces

# Queue entries: (key, tie, space index, shape, busiest bound, level, level data, score bound, bound parts)
_KEY, _BOUND = 0, 7


def run_search(searcher: Searcher, budget: int | None = None, *, by_bound_only: bool = False) -> None:
    """Best-first search (see the module docstring); ``budget`` caps this call's evaluations;
    ``by_bound_only``: skip the estimate-ordered phase (a pass over shapes an earlier pass of the
    same search already ordered by estimate)."""
    SearchLoop(searcher, budget, by_bound_only=by_bound_only).run()


def proof_possible(searcher: Searcher) -> bool:
    """Whether a pass in bound order could still prove the top N: no scored space of the search
    (``spaces.attach_sorted``) has left out shapes whose bound beats the threshold (a cap, a floor
    or the cost objective keep the best ``BANDED_KEEP`` bounds; the rest stay in the proof as
    their cut: while that is below the threshold, no walk proves the top N)."""
    threshold = searcher.threshold()
    return all(scored.cut >= threshold or scored.exact_cut() >= threshold
               for scored in searcher.memos.own.scored.values())


def proof_in_reach(searcher: Searcher, loop: SearchLoop | None = None) -> bool:
    """``proof_possible``, and a walk in bound order could finish it: with one or two GPU types
    (every shape scored) at most ``REACH`` times the patience of shapes bound below the
    threshold, those ahead of ``loop`` (queued or still in its spaces), else all the search
    scored.  More, and the walk stops at its patience (twice it, fruitless, ``SearchLoop.run``)
    long before it runs out of them: the floor row at top 1 walked 2,905 and then 3,591 such
    shapes for 164 and 89 evaluations that missed the floor and proved nothing
    (docs/benchmarks/planner.md, "top 1")."""
    if not proof_possible(searcher):
        return False
    if len(searcher.gpu_types) > 2:
        return True  # (lazy spaces: the count is not known)
    threshold, limit = searcher.threshold(), REACH * searcher.req.patience
    if loop is not None:
        return loop.left_below(threshold, limit) <= limit
    left = 0
    for scored in searcher.memos.own.scored.values():
        left += scored.count_below(threshold)
        if left > limit:
            return False
    return True


# Shapes per unit of patience a bound-ordered walk may have ahead of it and still prove the top N:
# ``SearchLoop.proof_is_near``'s count, past which the walk keeps going after its patience.
REACH = 4


class Calibration:
    """The capacity bound that orders the lazy heaps (three GPU types or more) is far looser than
    the queue's keys, so moving shapes until it crosses the best queued key would score tens of
    thousands of shapes.  After a sample, scale it by a key/loose ratio seen so far: the most
    optimistic one when ordering by the bound (phase two), the 90th percentile towards
    optimistic when ordering by the estimate.  Not a bound, so a stop it causes is not
    reported as exhausted."""

    __slots__ = ("ratio", "seen", "ratios")

    def __init__(self) -> None:
        self.ratio: float | None = None
        self.seen = 0  # shapes the lazy order has scored
        self.ratios: list[float] = []

    def scaled(self, lb: float) -> float:
        r = self.ratio
        if r is None or self.seen < 64 or lb in (math.inf, 0.0):
            return lb
        return lb * r

    def learn(self, r: float, lb: float, by_bound: bool) -> None:
        """A shape's key over the loose bound it was pulled at (scores are -throughput < 0 or
        cost > 0; keys are >= loose either way)."""
        self.seen += 1
        if by_bound:
            self.ratio = r if self.ratio is None else (max(self.ratio, r) if lb < 0 else min(self.ratio, r))
        else:
            self.ratios.append(r)
            if self.seen >= 64 and self.seen & (self.seen - 1) == 0:  # 64, 128, 256, ...
                ranked = sorted(self.ratios, reverse=lb < 0)
                self.ratio = ranked[len(ranked) // 10]


class SearchLoop:
    """One pass of the best-first search over ``searcher`` (see the module docstring): the
    spaces, the queue and what orders it."""

    __slots__ = ("searcher", "req", "spaces", "bounds", "pending", "counter", "by_bound", "since_gain",
                 "stop_at", "calib", "keys", "keys_version", "first_level")

    def __init__(self, searcher: Searcher, budget: int | None, *, by_bound_only: bool) -> None:
        req = searcher.req
        self.searcher, self.req = searcher, req
        searcher.stats.exhausted = False  # this pass's own proof, or none
        self.stop_at = searcher.stats.work + (budget if budget is not None else req.max_evaluations)
        self.spaces = build_spaces(searcher)
        self.bounds = ShapeBounds(searcher)
        self.pending: list[tuple] = []
        self.counter = itertools.count()
        self.by_bound = by_bound_only  # the second phase orders by the bound itself (see run)
        self.since_gain = 0.0  # evaluations since the best plan last improved (patience)
        self.calib = Calibration()
        self.keys: list[float] = []  # next_key per space, until the excess or the space changes
        self.keys_version = -1
        # Shapes enter at level 0 when cost matters (placement), else with their granular bound at 1.
        self.first_level = 0 if searcher.cost_matters else 1
        attach_sorted(searcher, self.spaces)

    def push(self, t: tuple, si: int, shape: tuple[Segment, ...], tau: float, level: int, payload) -> None:
        """Queue a shape with ``t`` (``ShapeBounds.tight``), keyed by its bound or its estimate."""
        key = t[0] if self.by_bound else self.bounds.estimate(t[2])
        heapq.heappush(self.pending, (key, next(self.counter), si, shape, tau, level, payload, t[0], t[2]))

    def run(self) -> None:
        searcher, req, pending = self.searcher, self.req, self.pending
        while True:
            self.fill_pending()
            if not pending:
                searcher.stats.exhausted = self.proven_done(searcher.threshold())
                return
            if self.since_gain >= req.patience and not self.by_bound:
                if not (req.collect_pareto or (proof_in_reach(searcher, self) if searcher.estimate_limits
                                               else proof_possible(searcher))):
                    # The bound's order is for the proof; with none to be had, the estimate's
                    # order was the better one to spend the search on, and it has run dry (a
                    # Pareto front asked for takes the plans of both, as before).
                    return
                self._order_by_bound()
                continue
            entry = heapq.heappop(pending)
            key, bound, parts = entry[_KEY], entry[_BOUND], entry[8]
            before = searcher.threshold()
            if bound >= before:
                if self.by_bound:
                    searcher.stats.exhausted = self.proven_done(before)
                    return
                continue  # cannot enter the top N
            if searcher.stats.work >= self.stop_at:
                return
            best_before = searcher.top[0].score if searcher.top else math.inf
            if self.since_gain >= req.patience * (2 if self.by_bound else 1) and not (
                    self.by_bound and self.proof_is_near(before)):
                return
            fresh = key if self.by_bound else self.bounds.estimate(parts)
            if fresh > key and pending and fresh > pending[0][_KEY]:
                # What was learnt since it was queued puts it behind others: re-queue.
                heapq.heappush(pending, (fresh, next(self.counter), *entry[2:]))
                continue
            level = entry[5]
            if level == 0:
                self._place(entry)
            elif level == 1:
                self._split(entry, before)
            else:
                self._evaluate(entry, best_before)

    def _order_by_bound(self) -> None:
        """Phase two: the estimates found the good plans; now go through the rest in order of the
        bound, which proves the top N optimal (exhausted) where the space is small and otherwise
        stops after twice as many fruitless evaluations."""
        self.by_bound = True
        self.since_gain = 0.0
        self.pending[:] = [(e[_BOUND], *e[1:]) for e in self.pending]
        heapq.heapify(self.pending)
        self.calib = Calibration()
        self.keys_version = -1

    def _place(self, entry: tuple) -> None:
        """Level 0: refine the bound with whole blocks and the head layer (a few microseconds)
        and, when cost matters, each order's placement; the real split comes next."""
        _, _, si, shape, tau, _, _, _, parts = entry
        searcher, space = self.searcher, self.spaces[si]
        g = searcher.parts.granular_busiest_s(shape)
        known = (parts[0], parts[2])
        if not searcher.cost_matters:
            t = self.bounds.tight(space, shape, g, known=known)
            if t is not None:
                self.push(t, si, shape, max(tau, g), 1, None)
            return
        best = None
        memo = searcher.memos.model.placed_costs
        for order in orders(shape):
            placed = searcher.build_stages(order)
            if placed is None:
                continue
            ckey = (space.mbs, order_key(order))
            costs = memo.get(ckey)
            if costs is None:
                costs = memo[ckey] = searcher.egress.placed_costs_lb(space.mbs, placed)
            rent, p2p = costs
            rings = searcher.egress.rings_egress_lb(shape)
            t = self.bounds.tight(space, shape, g, (rent, p2p + rings), known=known)
            if t is not None and (best is None or t[0] < best[0]):
                best = t
        if best is not None:
            self.push(best, si, shape, max(tau, g), 1, None)

    def _split(self, entry: tuple, before: float) -> None:
        """Level 1: each order's split and placement give its rent and cross-zone traffic exactly
        (a pipeline or ring crossing zones can cost more than the GPUs).  Each order is queued
        on its own bound: the worse one is often never evaluated."""
        _, _, si, shape, tau, _, _, _, parts = entry
        searcher, space = self.searcher, self.spaces[si]
        skip, split = searcher.skip_shapes, searcher.split_orders
        for order in orders(shape):
            if split is not None:
                split.append((entry[_BOUND], parts[0], space, shape, order))
            if skip and self._fits_without_levers(space.mbs, order, skip):
                continue
            prep = searcher.prepare(space.mbs, order, tau)
            if prep is None:
                continue
            costs = searcher.fast.rent_and_egress(space.mbs, fast_stages(prep[0], prep[1])) \
                if searcher.cost_matters else None
            t = self.bounds.tight(space, shape, prep[2], costs, split_known=True, known=(parts[0], 0.0))
            if t is not None:
                self.push(t, si, shape, tau, 2, (order, prep))
            elif before < math.inf:
                # Split only to miss a cap, a floor or the top N: a quarter of an evaluation
                # of patience (the work budget counts it the same), or a search whose
                # shapes mostly miss a limit after the split would run to its budget.
                self.since_gain += 0.25

    def _fits_without_levers(self, mbs: int, order: tuple[Segment, ...], skip: dict[tuple, float]) -> bool:
        """A ``pays`` lever search (``Searcher.skip_shapes``): the order is a shape the search
        without levers fitted with memory limiting neither its split nor its polish, so no lever
        makes it fit better (levers.py).  It counts as the fruitless evaluation it would have
        been, with that search's simulated over bounded time for its depth, so the patience stop
        and the queue's order stay near where they were."""
        searcher = self.searcher
        placed = searcher.build_stages(order)
        ratio = None if placed is None else skip.get(placed_key(mbs, placed))
        if ratio is None:
            return False
        searcher.learn_excess(len(placed), ratio)
        self.since_gain += 1.0
        return True

    def _evaluate(self, entry: tuple, best_before: float) -> None:
        """Level 2: evaluate (and polish) the split order; patience: the queue's order is an
        estimate, so stop once many evaluations in a row no longer improve the best plan by
        more than 0.1 %."""
        _, _, si, _, tau, _, (order, prep), _, parts = entry
        searcher = self.searcher
        mbs = self.spaces[si].mbs
        ev = searcher.evaluate_shape(mbs, order, tau, prep)
        if ev is not None and ev.res.fits:
            ratio = ev.res.iteration_time_s / parts[0]
            searcher.learn_excess(parts[3], ratio)
            if searcher.fit_freely is not None and not searcher.memory_limited:
                searcher.fit_freely[placed_key(mbs, prep[0])] = ratio
        after = searcher.threshold()
        best_after = searcher.top[0].score if searcher.top else math.inf
        if best_after < best_before and (best_before == math.inf or best_before - best_after > 1e-3 * abs(best_before)):
            self.since_gain = 0.0
        elif after < math.inf:  # no patience before the first plan that meets the request
            self.since_gain += 1.0

    # ---- moving shapes from the spaces to the queue ---------------------------------------

    def next_bound(self, space: Space) -> float:
        return space.sorted.peek() if space.sorted is not None else self.bounds.loose(space)

    def next_key(self, space: Space) -> float:
        """What the next shape of a space would be queued at, or a guess of it."""
        if space.sorted is None:
            return self.calib.scaled(self.bounds.loose(space))
        if not space.sorted.has_next():
            return math.inf
        bound = space.sorted.peek()
        if self.by_bound:
            return bound
        excess = self.searcher.typical_excess(space.sorted.peek_stages())
        return bound / excess if self.bounds.throughput else bound * excess  # (cost: the egress too, a guess)

    def fill_pending(self) -> None:
        """Move shapes to the queue while some space's next one would go in front of it."""
        searcher, spaces, pending = self.searcher, self.spaces, self.pending
        if self.keys_version != searcher.excess_version:
            self.keys_version = searcher.excess_version
            self.keys = [self.next_key(sp) for sp in spaces]
        keys, next_key = self.keys, self.next_key
        lazy = [(i, sp) for i, sp in enumerate(spaces) if sp.sorted is None]
        max_scored = self.req.max_shapes_scored
        scaled, loose = self.calib.scaled, self.bounds.loose
        while True:
            for i, sp in lazy:  # their key (next_key's) follows the calibration, which moves with every pull
                keys[i] = scaled(loose(sp))
            key = min(keys, default=math.inf)
            si = keys.index(key) if keys else -1  # (the first space with the least key)
            if key == math.inf or self.calib.seen >= max_scored:
                return
            if pending and pending[0][_KEY] <= key:
                return
            space = spaces[si]
            if space.sorted is not None:
                if space.sorted.peek() >= searcher.threshold():
                    # In order of the bound: no shape left here can enter the top N (the
                    # threshold only falls), where each would have been queued to be dropped
                    # (the floor row's A100 search: 3928 of its 4000 shapes).
                    keys[si] = math.inf
                    continue
                # Scored with the same bound as ``tight`` (numpy): only the estimate is left to check.
                shape, t = space.sorted.pop()
                keys[si] = next_key(space)
                if len(shape) == 1 and shape[0].gpu in searcher.settled_types:
                    continue
                if self.bounds.within_estimate(shape, t[2], t[1]):
                    self.push(t, si, shape, t[1], self.first_level, None)
                continue
            self._pull_lazy(si, space)

    def _pull_lazy(self, si: int, space: Space) -> None:
        """Bound the next shape of a lazy space (three GPU types or more) and queue it."""
        searcher, bounds = self.searcher, self.bounds
        lb = bounds.loose(space)
        idx = space.heap.pop()
        shape = tuple(s for lst, i in zip(space.lists, idx) if (s := lst[i]) is not None)
        self.keys[si] = self.next_key(space)
        if not shape or sum(s.num_stages for s in shape) > searcher.max_stages or (
                len(shape) == 1 and shape[0].gpu in searcher.settled_types):
            return
        g = searcher.parts.granular_busiest_s(shape)
        t = bounds.tight(space, shape, g)
        if t is None:
            return
        if lb not in (math.inf, 0.0):
            self.calib.learn((t[0] if self.by_bound else bounds.estimate(t[2])) / lb, lb, self.by_bound)
        # Its granular bound is in already: without costs to look at, go straight to the split.
        self.push(t, si, shape, max(t[1], g), self.first_level, None)

    # ---- stopping ---------------------------------------------------------------------------

    def proof_is_near(self, threshold: float) -> bool:
        """Few shapes left whose bound beats the threshold: finish the proof rather than stop."""
        if any(sp.sorted is None for sp in self.spaces):
            return False
        left = len(self.pending) + sum(sp.sorted.count_below(threshold) for sp in self.spaces)
        return left <= REACH * self.req.patience

    def left_below(self, threshold: float, limit: float) -> int:
        """Shapes queued or still in the (scored) spaces whose bound beats ``threshold``, counted
        until past ``limit``."""
        left = len(self.pending)
        for sp in self.spaces:
            if left > limit:
                break
            left += sp.sorted.count_below(threshold)
        return left

    def proven_done(self, threshold: float) -> bool:
        return all(self.next_bound(sp) >= threshold for sp in self.spaces)
