"""One planning run (``Searcher``): the request's GPUs and limits, the segment lists, placing
and splitting shapes, and evaluating, offering and polishing plans, with the top N found so far
(its thresholds).  The best-first loop that drives it is ``loop.run_search``."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan, Replica, Stage
from sailor_core.planner.fastsim import FastResult, FastSim, FastStage
from sailor_core.planner.kinds import shared_kind_cache
from sailor_core.planner.request import PlanRequest
from sailor_core.planner.search.bounds import ideal_iteration, steady_links_s
from sailor_core.planner.search.egress import EgressParts
from sailor_core.planner.search.figures import KindFigures
from sailor_core.planner.search.memo import SearchMemos
from sailor_core.planner.search.parts import SegmentParts
from sailor_core.planner.search.shapes import (
    Placed,
    Segment,
    build_segments,
    fast_stages,
    order_key,
    place_shape,
    placed_key,
    stages_key,
)
from sailor_core.planner.split import StageSlot, busiest_s, min_max_split
from sailor_core.simulator.memory import inflight_microbatches


@dataclass(slots=True)
class Evaluated:
    score: float  # lower is better: -throughput or USD/iteration
    mbs: int
    stages: tuple[FastStage, ...]
    res: FastResult
    feasible: bool  # fits memory and meets caps and floor

    @property
    def num_gpus(self) -> int:
        return sum(k.tp_degree * n for s in self.stages for k, _, n in s.groups)

    @property
    def key(self) -> tuple:
        return stages_key(self.mbs, self.stages)


@dataclass(slots=True)
class SearchStats:
    num_evaluated: int = 0
    num_shapes: int = 0
    any_fits: bool = False
    best_throughput: Evaluated | None = None  # fastest plan that fits, caps ignored
    cheapest: Evaluated | None = None  # cheapest (USD/iteration) plan that fits, floor ignored
    cheapest_per_hour: Evaluated | None = None
    memory_failures: int = 0
    exhausted: bool = False
    # The DP degrees (a ``shapes.DP_SPACES`` key) ``exhausted`` covers when not the search's own
    wider_proof: str | None = None
    num_disagreements: int = 0  # returned plans whose fastsim figures differ from simulate's
    num_splits: int = 0  # min-max splits computed (a split costs about a quarter of an evaluation)
    fitting: list[Evaluated] = field(default_factory=list)

    @property
    def work(self) -> int:
        """What the evaluation budget counts: evaluations, and splits at four to one."""
        return self.num_evaluated + self.num_splits // 4


def better(a: Evaluated, b: Evaluated) -> bool:
    """Feasible beats infeasible; fitting beats not fitting; then the score."""
    return (not a.feasible, not a.res.fits, a.score) < (not b.feasible, not b.res.fits, b.score)


def _top_key(ev: Evaluated) -> tuple[float, int]:
    return ev.score, ev.num_gpus


class Searcher:
    """One planning run; see the module docstring.  ``kinds`` and ``memos``: a sub-search's,
    handed over by ``sub_searcher``."""

    def __init__(self, request: PlanRequest, *, profiles, network, kinds=None,
                 memos: SearchMemos | None = None) -> None:
        self.req = request
        self.profiles = profiles
        self.network = network
        self.model = get_model(request.model)
        self.num_layers = self.model.num_layer_indices
        if kinds is None:
            kinds = shared_kind_cache(request.model, request.seq_len, request.regime, profiles)
        self.kinds = kinds
        self.zone_gpus: dict[str, dict[str, int]] = {}
        for (gpu, zone), n in request.availability.items():
            self.zone_gpus.setdefault(gpu, {})[zone] = n
        self.gpu_types = sorted(self.zone_gpus)
        self.stats = SearchStats()
        self.top: list[Evaluated] = []  # the best plans offered, best first (top N + 20)
        self.seen_plans: set = set()  # Evaluated.key of every plan offered
        self.memos = memos if memos is not None else SearchMemos.new(kinds, network, self.num_blocks)
        self.fast = self._fast_sim()
        self.max_stages = max(1, min(request.max_stages, self.num_layers))
        # With three or more GPU types most combinations of per-type stage counts overflow
        # max_stages and the lazy order wades through them: cap each type's share instead.
        k = len(self.gpu_types)
        self.max_stages_per_type = self.max_stages if k <= 2 else max(2, self.max_stages // k + 2)
        # Per pipeline depth: the smallest ratio of a simulated iteration to its shape's bound,
        # and the sum of log ratios and their count (their geometric mean orders the queue).
        self.excess: dict[int, float] = {}
        self._log_excess: dict[int, tuple[float, int]] = {}
        self.excess_version = 0
        self.estimate_limits = False  # check caps and floor on bound x excess too (see plan_job)
        # GPU types whose one-type shapes a search of their own has settled: every one that could
        # enter this search's top N was evaluated there and its plans offered here (plan_job).
        self.settled_types: set[str] = set()
        # The data-parallel degrees searched, when not ``dp_space``'s choice (plan_job's widening pass).
        self.dp_space_override: str | None = None
        # One GPU type: each shape's alone bound (``SegmentParts.blocked_s``, a placement per segment)
        # added as the walk reaches it, not when scored (the widening pass walks its best few).
        self.lazy_alone_bound = False
        # Where a ``pays`` lever search may follow: per ``placed_key`` of each shape whose plan fits
        # with memory limiting neither its split nor its polish (no lever-only shape, which that
        # search skips: ``skip_shapes``, levers.py), its simulated over bounded time (``learn_excess``).
        # Its sub-searches add to the same dict.
        self.fit_freely: dict[tuple, float] | None = None
        self.skip_shapes: dict[tuple, float] | None = None
        # Where such a search may follow: every order this search split, as (score bound, iteration
        # time bound, space, shape, order) at the split (levers.cannot_pay reads them).
        self.split_orders: list[tuple] | None = None
        # memory limited the last evaluate_shape's split, or its polish met a plan that does not fit
        self.memory_limited = False
        self.figures = KindFigures(kinds=kinds, model=request.model, regime=request.regime,
                                   max_tp_degree=request.max_tp_degree, gpu_types=self.gpu_types,
                                   num_layers=self.num_layers, memos=self.memos)
        # (a Pareto front is drawn from the plans evaluated: the bounds of a segment's own
        # placement, which prove many of them worse without evaluating them, would narrow it)
        self.parts = SegmentParts(network=network, zone_gpus=self.zone_gpus, num_layers=self.num_layers,
                                  max_stages=self.max_stages, figures=self.figures, memos=self.memos,
                                  placed=not request.collect_pareto)
        self.egress = EgressParts(network=network, zone_gpus=self.zone_gpus,
                                  global_batch_size=request.global_batch_size, fast=self.fast,
                                  figures=self.figures, memos=self.memos)

    def _fast_sim(self) -> FastSim:
        """The simulator's memoised figures live as long as the kinds they were keyed on (by id);
        those of the network alone as long as the kinds of every lever setting (a lever search's
        FastSim shares them with the plain one's: ``FastSim(shared=...)``)."""
        return self._fast_sim_in(self.kinds.extras, self.kinds.family_extras)

    def _fast_sim_in(self, extras: dict, family_extras: dict) -> FastSim:
        request, network = self.req, self.network
        fkey = ("fastsim", request.global_batch_size, id(network), request.spot, request.regime)
        fast = extras.get(fkey)
        if fast is None or fast.network is not network:
            shared = None if family_extras is extras else self._fast_sim_in(family_extras, family_extras)
            fast = extras[fkey] = FastSim(
                model=request.model, global_batch_size=request.global_batch_size,
                network=network, spot=request.spot, regime=request.regime, shared=shared)
        fast.trim()
        return fast

    def sub_searcher(self, request: PlanRequest) -> Searcher:
        """A Searcher for ``request`` (same model: a part of this one's GPUs, another objective
        or fewer limits) handed this one's kinds and the memos it may share (``SearchMemos``)."""
        memos = self.memos.for_sub_search(self.kinds, self.network, self.num_blocks,
                                          same_availability=request.availability == self.req.availability)
        sub = Searcher(request, profiles=self.profiles, network=self.network, kinds=self.kinds, memos=memos)
        sub.fit_freely = self.fit_freely
        return sub

    def seed_from(self, other: Searcher) -> None:
        """Start from ``other``'s top N (same objective and limits): only plans that beat them matter."""
        self.top = list(other.top)
        self.seen_plans = set(other.seen_plans)

    def done_searching(self) -> None:
        """No more ``run_search`` passes: drop the scored shapes, whose streams hold the search's
        bound parts and so its memos (a cycle that would wait for the collector plan_job pauses)."""
        self.memos.own.scored.clear()

    @property
    def cost_matters(self) -> bool:
        """Placement decides rent and egress, which only the cost objective and the caps look at."""
        r = self.req
        return (r.ranking.by_cost or r.max_usd_per_hour is not None
                or r.max_usd_per_iteration is not None)

    @property
    def num_blocks(self) -> int:
        return self.num_layers - 2 if self.num_layers >= 3 else self.num_layers

    def micro_batch_sizes(self) -> list[int]:
        gbs = self.req.global_batch_size
        if self.req.micro_batch_sizes:
            return sorted({b for b in self.req.micro_batch_sizes if gbs % b == 0})
        out, b = [], 1
        while b <= min(gbs, 64):
            if gbs % b == 0:
                out.append(b)
            b *= 2
        return out

    def ideal_score(self, gpus: list[str]) -> float:
        """The best score any plan on only these GPU types could have (inf: none meets the
        limits): ``bounds.ideal_iteration`` on every GPU available of these types."""
        gpu_s = self.figures.ideal_gpu_s(gpus, self.micro_batch_sizes(), self.req.global_batch_size)
        pools = [(g, z, n) for g in gpus for z, n in self.zone_gpus.get(g, {}).items() if n > 0]
        if gpu_s == math.inf or not pools:
            return math.inf
        r, gbs = self.req, self.req.global_batch_size
        t, usd = ideal_iteration(gpu_s, sum(n for _, _, n in pools),
                                 min(gpu_price_usd_per_hr(g, z, spot=r.spot) for g, z, _ in pools))
        if r.min_throughput_samples_per_s is not None and gbs / t < r.min_throughput_samples_per_s * (1 - 1e-9):
            return math.inf
        if r.max_usd_per_iteration is not None and usd > r.max_usd_per_iteration * (1 + 1e-9):
            return math.inf
        return usd if r.ranking.by_cost else -gbs / t

    # ---- what the search learns: simulated over bounded time, by depth ----------------------

    def learn_excess(self, num_stages: int, ratio: float) -> None:
        self.excess_version += 1
        self.excess[num_stages] = min(self.excess.get(num_stages, math.inf), ratio)
        total, count = self._log_excess.get(num_stages, (0.0, 0))
        self._log_excess[num_stages] = (total + math.log(max(ratio, 1.0)), count + 1)

    def learn_excess_from(self, other: Searcher) -> None:
        """Take in what another search of the same model learnt (a one-type sub-search: the same
        bounds and simulator on part of the same GPUs)."""
        for num_stages, ratio in other.excess.items():
            self.excess[num_stages] = min(self.excess.get(num_stages, math.inf), ratio)
        for num_stages, (total, count) in other._log_excess.items():
            mine = self._log_excess.get(num_stages, (0.0, 0))
            self._log_excess[num_stages] = (mine[0] + total, mine[1] + count)
        self.excess_version += 1

    def typical_excess(self, num_stages: int) -> float:
        hit = self._log_excess.get(num_stages)
        return math.exp(hit[0] / hit[1]) if hit else 1.0

    # ---- scoring, the top N and its thresholds ---------------------------------------------

    def score_of(self, res) -> float:
        return self.req.ranking.score(throughput_samples_per_s=res.throughput_samples_per_s,
                                      usd_per_iteration=res.usd_per_iteration)

    def meets_limits(self, res) -> bool:
        """Caps and floor, on a FastResult or a SimResult."""
        r = self.req
        if r.max_usd_per_iteration is not None and res.usd_per_iteration > r.max_usd_per_iteration:
            return False
        if r.max_usd_per_hour is not None and res.usd_per_hour > r.max_usd_per_hour:
            return False
        if (r.min_throughput_samples_per_s is not None
                and res.throughput_samples_per_s < r.min_throughput_samples_per_s):
            return False
        return True

    def evaluate(self, mbs: int, stages: tuple[FastStage, ...]) -> Evaluated:
        """The plan's figures (fastsim: ``simulate``'s), each plan evaluated once per search."""
        memo = self.memos.own.evaluated
        key = (mbs, stages)
        hit = memo.get(key)
        if hit is not None:
            return hit
        res = self.fast.evaluate(mbs, list(stages))
        self.stats.num_evaluated += 1
        ev = Evaluated(score=self.score_of(res), mbs=mbs, stages=stages, res=res,
                       feasible=res.fits and self.meets_limits(res))
        memo[key] = ev
        st = self.stats
        if res.fits:
            st.any_fits = True
            st.fitting.append(ev)
            if st.best_throughput is None or res.throughput_samples_per_s > st.best_throughput.res.throughput_samples_per_s:
                st.best_throughput = ev
            if st.cheapest is None or res.usd_per_iteration < st.cheapest.res.usd_per_iteration:
                st.cheapest = ev
            if st.cheapest_per_hour is None or res.usd_per_hour < st.cheapest_per_hour.res.usd_per_hour:
                st.cheapest_per_hour = ev
        else:
            st.memory_failures += 1
        return ev

    def threshold(self) -> float:
        """Score a shape's bound must beat to matter: the N-th best feasible score so far."""
        n = self.req.top_n + (20 if self.req.collect_pareto else 0)
        if len(self.top) < n:
            return math.inf
        return self.top[n - 1].score

    def offer(self, ev: Evaluated) -> None:
        if not ev.feasible:
            return
        key = ev.key
        if key in self.seen_plans:
            return
        self.seen_plans.add(key)
        limit = self.req.top_n + 20
        if len(self.top) >= limit and ev.score >= self.top[-1].score:
            return
        # After every equal one, as a stable sort of the list with it appended would put it
        # (earlier, better-bounded plans first); the list is kept sorted, so bisect.
        bisect.insort_right(self.top, ev, key=_top_key)
        del self.top[limit:]

    def to_plan(self, ev: Evaluated) -> Plan:
        return Plan(
            model=self.req.model, global_batch_size=self.req.global_batch_size, micro_batch_size=ev.mbs,
            stages=tuple(
                Stage(layer_start=s.layer_start, layer_end=s.layer_end, replicas=tuple(
                    Replica(gpu=k.gpu, tp_degree=k.tp_degree, zone=z) for k, z, n in s.groups for _ in range(n)),
                      recompute=s.groups[0][0].recompute,
                      zero_stage=s.groups[0][0].zero_stage if s.dp_degree > 1 else 0)
                for s in ev.stages
            ),
            seq_len=self.req.seq_len, regime=self.req.regime,
        )

    fast_stages = staticmethod(fast_stages)

    # ---- segments, placements and splits ----------------------------------------------------

    def segments_for(self, gpu: str, mbs: int, num_mb: int, ref: list[float], *,
                     every_degree: bool = False) -> list[Segment]:
        """Every segment of ``gpu`` at this micro-batch size, with slowness against ``ref`` (per
        layer, the fastest kind's time): ``shapes.build_segments``, memoised.  ``every_degree``:
        every DP degree, not only those that can be best (the exhaustive yardstick's space)."""
        memo = self.memos.own.segments
        degrees = "every" if every_degree else self.dp_space
        key = (gpu, mbs, num_mb, tuple(ref), degrees)
        hit = memo.get(key)
        if hit is None:
            terms = self._segment_terms(gpu, mbs, ref)
            r = self.req
            cut = None if every_degree else self._capacity_cut(sum(ref))
            # Shared by the process (kinds and network are the memo's): the type's pools (prices,
            # placements and crossings follow from them), the terms and the cut decide the list.
            shared = (gpu, tuple(self.zone_gpus[gpu].items()), r.spot, num_mb, degrees,
                      self.max_stages_per_type, terms, cut)
            lists = self.memos.process.segment_lists
            hit = lists.get(shared)
            if hit is None:
                hit = lists[shared] = build_segments(
                    gpu, self.zone_gpus[gpu], spot=r.spot, num_mb=num_mb, degrees=degrees,
                    max_stages=self.max_stages_per_type, terms=terms, fewest_crossings=self.egress.crossings_counter(gpu),
                    matters=None if cut is None else self._beats_threshold(*cut, gpu=gpu, terms=terms))
            memo[key] = hit
        return hit

    def _capacity_cut(self, work_s: float) -> tuple[float, float] | None:
        """(threshold, block work) below which a one-type throughput search's segments matter, or
        None.  A seeded search (the widening pass, the lever rungs, a type's own search) starts
        with a threshold; its scoring (``scored._capacity_and_rent``) drops every shape whose
        capacity bound cannot beat it, and with one GPU type a shape is one segment, so such a
        segment need not be built (nor its columns, rings and placements): the same shapes are
        scored, in the same order.  The threshold only falls during a search, so a list built
        with an earlier one (``own.segments``) holds every segment a later pass needs."""
        r = self.req
        limit = self.threshold()
        if (len(self.gpu_types) != 1 or limit == math.inf or r.ranking.by_cost or r.has_cost_caps
                or r.min_throughput_samples_per_s is not None):
            return None
        return limit, work_s

    def _beats_threshold(self, limit: float, work_s: float, *, gpu: str, terms: tuple):
        """``build_segments``' ``matters``: whether a segment alone beats ``limit`` on the capacity
        bound (``scored._capacity_and_rent``'s test, under the throughput objective without limits)
        and, given its TP degree, stages and micro-batches per replica, on the capacity bound plus
        its links' steady state (``bounds.steady_links_s``), which ``scored._pipeline``'s bound of a
        lone segment holds: the same arithmetic, so a segment it drops is one scoring drops.  Both
        only fall as the degree grows (fewer micro-batches per replica)."""
        gbs = self.req.global_batch_size
        links = {tp: self.parts.own_link_s(gpu, tp, kind) for tp, kind, *_ in terms}

        def matters(capacity: float, tp: int | None = None, num_stages: int = 1, n_per_rep: int = 1) -> bool:
            t = work_s / capacity
            if tp is not None:
                t = t + steady_links_s(n_per_rep, links[tp], num_stages)
            return -gbs / t < limit

        return matters

    @property
    def dp_space(self) -> str:
        """The data-parallel degrees this search covers (``shapes.DP_SPACES``): when fewer GPUs
        can win (cost objective, caps, a Pareto front) every efficient one for one GPU type, a
        grid of them for several; else per number of zones the most they hold."""
        if self.dp_space_override is not None:
            return self.dp_space_override
        r = self.req
        wide = (r.ranking.by_cost or r.max_usd_per_hour is not None or r.max_usd_per_iteration is not None
                or r.collect_pareto)
        if not wide:
            return "zones"
        return "efficient" if len(self.gpu_types) == 1 else "grid"

    def _segment_terms(self, gpu: str, mbs: int, ref: list[float]) -> tuple:
        """Per TP degree with a kind: (TP, kind, slowness against ``ref``, fastest block and last
        layer (``block_and_head_s``), USD per micro-batch crossing zones (None: no p2p crosses))."""
        p2p_crosses = self.cost_matters and sum(1 for n in self.zone_gpus[gpu].values() if n > 0) > 1
        out = []
        ref_key = tuple(ref)
        figures = self.figures
        for tp, kind in figures.kinds_of(gpu, mbs):
            out.append((tp, kind, figures.slowness(kind, ref, ref_key), *figures.block_and_head_s(kind),
                        self.egress.crossing_usd_per_byte(kind) if p2p_crosses else None))
        return tuple(out)

    def build_stages(self, shape: tuple[Segment, ...]) -> Placed | None:
        """The placed stages of an ordered shape (``shapes.place_shape``), or None."""
        memo = self.memos.model.placed
        key = order_key(shape)
        if key in memo:
            return memo[key]
        out = memo[key] = place_shape(shape, self.zone_gpus, self.kinds, self.memos.process.segment_places)
        return out

    def prepare(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float):
        """(stages, ends, busiest-stage time, whether memory limited the split) of the min-max
        split of one ordered shape, or None."""
        memo = self.memos.model.prepared
        key = (mbs, order_key(shape))
        if key in memo:
            return memo[key]
        out = memo[key] = self._prepare(mbs, shape, tau_lb)
        return out

    def _prepare(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float):
        self.stats.num_splits += 1
        stages = self.build_stages(shape)
        if stages is None:
            return None
        return self.split_placed(mbs, stages, tau_lb)

    def split_placed(self, mbs: int, stages: Placed, tau_lb: float):
        """``prepare``'s answer for placed stages (not counted as a split; not memoised by order)."""
        num_mb = self.req.global_batch_size // mbs
        # The split depends on the stages' kinds and replica counts, not their zones: shared by
        # the process (the first bound asked decides where the bisection ends: in the key).
        split_key = (num_mb, tau_lb, tuple([(kind, sum(c for _, c in placed)) for kind, placed in stages]))
        splits = self.memos.process.splits
        hit = splits.get(split_key)
        if hit is None:
            P = len(stages)
            slots = []
            for i, (kind, d) in enumerate(split_key[2]):
                n = -(-num_mb // d)
                slots.append(StageSlot(kind=kind, num_microbatches=n,
                                       num_inflight=inflight_microbatches(i, P, n), dp_degree=d))
            hits: list[int] = []
            ends = min_max_split(slots, self.num_layers, lower_bound_s=tau_lb, memory_hits=hits)
            hit = splits[split_key] = (ends, None if ends is None else busiest_s(slots, ends), bool(hits))
        ends, busiest, memory_bound = hit
        if ends is None:
            self.stats.memory_failures += 1
            return None
        return stages, ends, busiest, memory_bound

    # ---- evaluating and polishing a split shape ----------------------------------------------

    def evaluate_shape(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float,
                       prepared=None) -> Evaluated | None:
        if prepared is None:
            prepared = self.prepare(mbs, shape, tau_lb)
            if prepared is None:
                return None
        stages, ends, _, memory_bound = prepared
        self.stats.num_shapes += 1
        ev = self.evaluate(mbs, fast_stages(stages, ends))
        # Polish only shapes that may become the best plan: within a margin of it (the min-max
        # split ignores p2p, sync and warm-up; polishing has gained up to ~20 %, mostly a few %).
        cutoff = self.top[0].score if self.top else math.inf
        gate = 0.25 if len(stages) <= 6 else 0.05  # long pipelines polish only their busiest stage
        self.memory_limited = memory_bound
        if ev.res.fits and ev.score < cutoff * (1 - gate if cutoff < 0 else 1 + gate):
            ev = self.polish(mbs, stages, ends, ev)
        self.offer(ev)
        return ev

    def polish(self, mbs: int, stages, ends: list[int], ev: Evaluated, *, full: bool = False) -> Evaluated:
        """Move stage boundaries one layer at a time while the simulated objective improves (the
        min-max split ignores p2p, sync and the warm-up, so a neighbour can be better).

        During the search only the boundaries of the busiest stage move; ``full`` (the plans
        that end in the top N, see ``polish_top``) tries every boundary of short pipelines (<= 6
        stages) and also shifts a whole inner stage (two adjacent boundaries together, which
        single moves cannot reach when either alone is worse).
        """
        best, best_ends = ev, list(ends)
        for _ in range(8):
            res = best.res
            last = len(best_ends) - 1
            busiest = max(range(len(best_ends)), key=lambda i: res.busy_s[i])
            if full and len(best_ends) <= 6:
                singles = [(b,) for b in range(last)]
                shifts = [(b, b + 1) for b in range(last - 1)]
            else:
                singles = [(b,) for b in sorted({busiest - 1, busiest} & set(range(last)))]
                shifts = []
            improved = self._try_moves(mbs, stages, best_ends, best, singles)
            if not improved and shifts:
                improved = self._try_moves(mbs, stages, best_ends, best, shifts)
            if not improved:
                break
            best, best_ends = improved
        return best

    def polish_top(self, count: int) -> None:
        """Fully polish the best ``count`` plans found (one GPU kind per stage) and offer the results."""
        for ev in list(self.top[:count]):
            if any(len(st.groups) != 1 and len({k for k, _, _ in st.groups}) != 1 for st in ev.stages):
                continue  # leftover replicas mixed in: not a split of one placement
            placed = [(st.groups[0][0], tuple((z, n) for _, z, n in st.groups)) for st in ev.stages]
            ends = [st.layer_end for st in ev.stages]
            polished = self.polish(ev.mbs, placed, ends, ev, full=True)
            if polished is not ev:
                self.offer(polished)

    def _try_moves(self, mbs: int, stages, best_ends: list[int], best: Evaluated, moves):
        """First-improvement pass over ``moves``; (best, ends) after it, or None if none helped."""
        found = False
        for bounds in moves:
            for delta in (-1, 1):
                cand = list(best_ends)
                for b in bounds:
                    cand[b] += delta
                if not all(x < y for x, y in zip([0, *cand], cand)) or cand[-1] != best_ends[-1]:
                    continue
                trial = self.evaluate(mbs, fast_stages(stages, cand))
                if not trial.res.fits:
                    self.memory_limited = True
                if better(trial, best):
                    best, best_ends, found = trial, cand, True
        return (best, best_ends) if found else None
