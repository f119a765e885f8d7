"""Best-first search over pipeline shapes, uneven layer splits and placements.

Search space (per micro-batch size):

* a *segment* is a run of consecutive stages on one GPU type: its TP degree,
  data-parallel degree, number of stages and zone placement rule;
* a *shape* is at most one segment per GPU type, in an order (larger-memory GPUs
  first, where 1F1B keeps more micro-batches in flight, and the reverse);
* each shape's layers are split unevenly (``split.min_max_split``) to balance
  the segments' different speeds and memory, then polished by moving stage
  boundaries one layer at a time while ``simulate`` says the objective improves;
* optionally (``mixed_stages``) leftover GPUs of any type join a stage as extra
  replicas when they are not slower than its straggler and the objective improves.

Every candidate is scored by ``simulate`` itself, so the ranking, the caps and
the floor are checked against the same figures ``sailor simulate`` prints.

Pruning: shapes are generated lazily in order of a cheap, valid bound (an upper
bound on throughput from the segments' compute capacity, or a lower bound on
cost), re-ranked by a tighter valid bound (adds pipeline warm-up/cool-down), and
the search stops once no unexplored shape's bound can enter the top N.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.catalog.models import get_model
from sailor_core.plan import Plan, Replica, Stage
from sailor_core.planner.kinds import Kind, KindCache, valid_tp_degrees
from sailor_core.planner.placement import StagePlacement, place_pipelines, place_stages
from sailor_core.planner.request import Objective, PlanRequest
from sailor_core.planner.split import StageSlot, busiest_s, min_max_split
from sailor_core.planner.fastsim import FastResult, FastSim, FastStage
from sailor_core.simulator.memory import inflight_microbatches
from sailor_core.simulator.stage import boundary_transfer_s, endpoint
from sailor_core.simulator.tables import layer_table


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    gpu: str
    kind: Kind
    tp_degree: int
    dp_degree: int
    num_stages: int
    rule: str  # "stage" or "pipeline" (see placement)
    capacity: float  # num_stages / (microbatches per replica * slowness)
    slowness: float  # per-micro-batch time of a block on this kind / on the fastest kind (>= that)
    num_microbatches: int  # per replica (the busiest)
    min_usd_per_hr: float

    @property
    def num_gpus(self) -> int:
        return self.num_stages * self.dp_degree * self.tp_degree


_NONE = None  # "this GPU type is not used" in a per-type list


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
        return _stages_key(self.mbs, self.stages)


def _stages_key(mbs: int, stages: tuple[FastStage, ...]) -> tuple:
    return (mbs, tuple(
        (s.layer_start, s.layer_end, tuple((k.gpu, k.tp_degree, z, n) for k, z, n in s.groups))
        for s in stages
    ))


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
    num_disagreements: int = 0  # returned plans whose fastsim figures differ from simulate's
    fitting: list[Evaluated] = field(default_factory=list)


def _d_grid(d_max: int) -> list[int]:
    out, d = [], 1
    while d <= d_max:
        out.append(d)
        if d * 3 // 2 <= d_max and d >= 2 and d * 3 // 2 != d:
            out.append(d * 3 // 2)
        d *= 2
    out.append(d_max)
    return sorted(set(out))


def _largest_divisor_at_most(n: int, limit: int) -> int:
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


class Searcher:
    """One planning run; see the module docstring."""

    def __init__(self, request: PlanRequest, *, profiles, network) -> None:
        self.req = request
        self.profiles = profiles
        self.network = network
        spec = get_model(request.model)
        self.model = spec
        self.num_layers = spec.num_layer_indices
        self.kinds = KindCache(request.model, request.seq_len, request.regime, profiles)
        self.zone_gpus: dict[str, dict[str, int]] = {}
        for (gpu, zone), n in request.availability.items():
            self.zone_gpus.setdefault(gpu, {})[zone] = n
        self.gpu_types = sorted(self.zone_gpus)
        self.stats = SearchStats()
        self.top: list[Evaluated] = []
        self._seen_plans: set = set()
        self._sim_cache: dict = {}
        self._variants: dict = {}
        self.fast = FastSim(model=request.model, global_batch_size=request.global_batch_size,
                            network=network, spot=request.spot, regime=request.regime)
        self.max_stages = max(1, min(request.max_stages, self.num_layers))
        # With three or more GPU types most combinations of per-type stage counts overflow
        # max_stages and the lazy order wades through them: cap each type's share instead.
        k = len(self.gpu_types)
        self.max_stages_per_type = self.max_stages if k <= 2 else max(2, self.max_stages // k + 2)
        # Shapes whose throughput bound clears the floor by this factor are searched (see plan_job).
        self.floor_margin = 1.0
        self.cap_margin = 1.0  # likewise for the cost caps (< 1 looks only well under the cap)

    def variants(self, kind: Kind) -> list[Kind]:
        """``kind`` under every regime a plan holding it may run in.

        ``simulate`` runs a plan under its first replica's profile's regime (unless the request
        names one), and another regime can make a GPU type several times faster or slower
        (estimated profiles), so a valid bound must take the fastest of these.
        """
        if self.req.regime is not None:
            return [kind]
        key = (kind.gpu, kind.tp_degree, kind.micro_batch_size)
        hit = self._variants.get(key)
        if hit is not None:
            return hit
        firsts = [f for g in self.gpu_types for tp in valid_tp_degrees(self.req.model, g, self.req.max_tp_degree)
                  if (f := self.kinds.get(g, tp, kind.micro_batch_size)) is not None]
        out = [kind]
        for f in firsts:
            v = self.kinds.in_regime_of(kind, f)
            if all(v is not o for o in out):
                out.append(v)
        self._variants[key] = out
        return out

    # ---- scoring ----------------------------------------------------------------------

    def score_of(self, res) -> float:
        if self.req.objective is Objective.THROUGHPUT:
            return -res.throughput_samples_per_s
        return res.usd_per_iteration

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
        key = (mbs, stages)
        hit = self._sim_cache.get(key)
        if hit is not None:
            return hit
        res = self.fast.evaluate(mbs, list(stages))
        self.stats.num_evaluated += 1
        ev = Evaluated(score=self.score_of(res), mbs=mbs, stages=stages, res=res,
                       feasible=res.fits and self.meets_limits(res))
        self._sim_cache[key] = ev
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
        if key in self._seen_plans:
            return
        self._seen_plans.add(key)
        limit = self.req.top_n + 20
        if len(self.top) >= limit and ev.score >= self.top[-1].score:
            return
        self.top.append(ev)
        self.top.sort(key=lambda e: (e.score, e.num_gpus))  # stable: earlier (better-bounded) first
        del self.top[limit:]

    # ---- segments ---------------------------------------------------------------------

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

    def segments_for(self, gpu: str, mbs: int, num_mb: int, ref: list[float]) -> list[Segment]:
        zones = self.zone_gpus[gpu]
        live = {z: n for z, n in zones.items() if n > 0}
        min_price = min(gpu_price_usd_per_hr(gpu, z, spot=self.req.spot) for z in live)
        full_range = (self.req.objective is Objective.COST or self.req.max_usd_per_hour is not None
                      or self.req.max_usd_per_iteration is not None or self.req.collect_pareto)
        out: list[Segment] = []
        for tp in valid_tp_degrees(self.req.model, gpu, self.req.max_tp_degree):
            kind = self.kinds.get(gpu, tp, mbs)
            if kind is None:
                continue
            ratio = min(
                (v.time_s(i, i + 1) / ref[i]) for v in self.variants(kind)
                for i in range(self.num_layers) if ref[i] > 0
            ) if any(r > 0 for r in ref) else 1.0
            total_rep = sum(n // tp for n in live.values())
            zone_max = max(n // tp for n in live.values())
            for num_stages in range(1, self.max_stages_per_type + 1):
                d_max = min(total_rep // num_stages, num_mb)
                if d_max < 1:
                    break
                if full_range:
                    ds = set(_d_grid(d_max))
                else:
                    ds = {d_max}
                ds.add(_largest_divisor_at_most(num_mb, d_max))
                one_zone = min(d_max, zone_max)
                ds.add(one_zone)
                ds.add(_largest_divisor_at_most(num_mb, one_zone))
                for d in sorted(ds):
                    n_per_rep = -(-num_mb // d)
                    cap = num_stages / (n_per_rep * ratio)
                    rules = ["stage"]
                    # Whole pipelines per zone only differ from the stage rule when a stage's
                    # replicas do not fit one zone (else the stage rule keeps everything local).
                    if (len(live) > 1 and d > zone_max
                            and sum(n // (tp * num_stages) for n in live.values()) >= d):
                        rules.append("pipeline")
                    for rule in rules:
                        out.append(Segment(
                            gpu=gpu, kind=kind, tp_degree=tp, dp_degree=d, num_stages=num_stages,
                            rule=rule, capacity=cap, slowness=ratio, num_microbatches=n_per_rep,
                            min_usd_per_hr=num_stages * d * tp * min_price,
                        ))
        return out

    # ---- building a plan from a shape -------------------------------------------------

    def build_stages(self, shape: tuple[Segment, ...]) -> list[tuple[Kind, StagePlacement]] | None:
        stages: list[tuple[Kind, StagePlacement]] = []
        prev_zone: str | None = None
        first = shape[0].kind
        for seg in shape:
            zones = {z: n for z, n in self.zone_gpus[seg.gpu].items() if n > 0}
            if seg.rule == "pipeline":
                placed = place_pipelines(zones, seg.tp_degree, seg.dp_degree, seg.num_stages)
            else:
                placed = place_stages(zones, seg.tp_degree, seg.dp_degree, seg.num_stages, prev_zone)
            if placed is None:
                return None
            kind = self.kinds.in_regime_of(seg.kind, first)
            for p in placed:
                stages.append((kind, p))
            last = placed[-1]
            prev_zone = max(last, key=lambda p: (p[1], p[0]))[0]
        return stages

    def to_plan(self, ev: Evaluated) -> Plan:
        return Plan(
            model=self.req.model, global_batch_size=self.req.global_batch_size, micro_batch_size=ev.mbs,
            stages=tuple(
                Stage(layer_start=s.layer_start, layer_end=s.layer_end, replicas=tuple(
                    Replica(gpu=k.gpu, tp_degree=k.tp_degree, zone=z) for k, z, n in s.groups for _ in range(n)))
                for s in ev.stages
            ),
            seq_len=self.req.seq_len, regime=self.req.regime,
        )

    @staticmethod
    def fast_stages(stages: list[tuple[Kind, StagePlacement]], ends: list[int]) -> tuple[FastStage, ...]:
        out, start = [], 0
        for (kind, placed), end in zip(stages, ends):
            out.append(FastStage(start, end, tuple((kind, z, n) for z, n in placed)))
            start = end
        return tuple(out)

    def prepare(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float):
        """(stages, ends, busiest-stage time) of the min-max split of one ordered shape, or None."""
        stages = self.build_stages(shape)
        if stages is None:
            return None
        num_mb = self.req.global_batch_size // mbs
        P = len(stages)
        slots = []
        for i, (kind, placed) in enumerate(stages):
            d = sum(c for _, c in placed)
            n = -(-num_mb // d)
            slots.append(StageSlot(kind=kind, num_microbatches=n,
                                   num_inflight=inflight_microbatches(i, P, n)))
        ends = min_max_split(slots, self.num_layers, lower_bound_s=tau_lb)
        if ends is None:
            self.stats.memory_failures += 1
            return None
        return stages, ends, busiest_s(slots, ends)

    def evaluate_shape(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float,
                       prepared=None) -> Evaluated | None:
        if prepared is None:
            prepared = self.prepare(mbs, shape, tau_lb)
            if prepared is None:
                return None
        stages, ends, _ = prepared
        self.stats.num_shapes += 1
        ev = self.evaluate(mbs, self.fast_stages(stages, ends))
        # Polish only shapes that may enter the top N: within 25 % of its last entry (the
        # min-max split ignores p2p, sync and warm-up; polishing has gained up to ~20 %).
        cutoff = self.threshold()
        gate = 0.25 if len(stages) <= 6 else 0.05  # long pipelines polish only their busiest stage
        if ev.res.fits and ev.score < cutoff * (1 - gate if cutoff < 0 else 1 + gate):
            ev = self.polish(mbs, stages, ends, ev)
        self.offer(ev)
        return ev

    def polish(self, mbs: int, stages, ends: list[int], ev: Evaluated) -> Evaluated:
        """Move stage boundaries one layer at a time while the simulated objective improves (the
        min-max split ignores p2p, sync and the warm-up, so a neighbour can be better).

        Short pipelines (<= 6 stages) try every boundary and also shift a whole inner stage (two
        adjacent boundaries together, which single moves cannot reach when either alone is
        worse); longer ones move the boundaries of the busiest stage.
        """
        best, best_ends = ev, list(ends)
        for _ in range(8):
            res = best.res
            last = len(best_ends) - 1
            busiest = max(range(len(best_ends)), key=lambda i: res.busy_s[i])
            if len(best_ends) <= 6:
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
                trial = self.evaluate(mbs, self.fast_stages(stages, cand))
                if _better(trial, best):
                    best, best_ends, found = trial, cand, True
        return (best, best_ends) if found else None


def _better(a: Evaluated, b: Evaluated) -> bool:
    """Feasible beats infeasible; fitting beats not fitting; then the score."""
    return (not a.feasible, not a.res.fits, a.score) < (not b.feasible, not b.res.fits, b.score)


# ---- lazy best-first enumeration of shapes -------------------------------------------


class _ProductHeap:
    """Index tuples over per-type lists in nondecreasing order of an additive key."""

    def __init__(self, keys: list[list[float]]) -> None:
        self.keys = keys
        self.heap: list[tuple[float, tuple[int, ...]]] = []
        self.seen: set[tuple[int, ...]] = set()
        if all(keys):
            start = tuple(0 for _ in keys)
            self._push(start)

    def _push(self, idx: tuple[int, ...]) -> None:
        if idx in self.seen:
            return
        self.seen.add(idx)
        heapq.heappush(self.heap, (sum(k[i] for k, i in zip(self.keys, idx)), idx))

    def peek(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def pop(self) -> tuple[int, ...]:
        _, idx = heapq.heappop(self.heap)
        for j in range(len(idx)):
            if idx[j] + 1 < len(self.keys[j]):
                self._push(idx[:j] + (idx[j] + 1,) + idx[j + 1:])
        return idx


@dataclass(slots=True)
class _MbsSpace:
    mbs: int
    num_mb: int
    ref: list[float]  # per layer: the fastest kind's forward + backward
    ref_total_s: float  # over the layers the capacity bound counts
    all_total_s: float  # every layer on its fastest kind: no iteration is shorter
    lists: list[list[Segment | None]]
    heap: _ProductHeap
    min_time_by_kinds: dict = field(default_factory=dict)


def run_search(searcher: Searcher, budget: int | None = None) -> None:
    """Best-first search (see the module docstring); ``budget`` caps this call's evaluations."""
    req = searcher.req
    stop_at = searcher.stats.num_evaluated + (budget if budget is not None else req.max_evaluations)
    throughput = req.objective is Objective.THROUGHPUT
    spaces: list[_MbsSpace] = []
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
        for gpu in searcher.gpu_types:
            segs: list[Segment | None] = list(searcher.segments_for(gpu, mbs, num_mb, ref))
            segs.append(_NONE)
            if throughput:
                segs.sort(key=lambda s: -s.capacity if s else 0.0)
            else:
                segs.sort(key=lambda s: s.min_usd_per_hr if s else 0.0)
            lists.append(segs)
        if throughput:
            keys = [[-(s.capacity if s else 0.0) for s in lst] for lst in lists]
        else:
            keys = [[(s.min_usd_per_hr if s else 0.0) for s in lst] for lst in lists]
        spaces.append(_MbsSpace(mbs=mbs, num_mb=num_mb, ref=ref, ref_total_s=sum(ref),
                                all_total_s=sum(ref_all), lists=lists,
                                heap=_ProductHeap(keys)))

    gbs = req.global_batch_size

    def loose(space: _MbsSpace) -> float:
        key = space.heap.peek()
        if key == math.inf:
            return math.inf
        if throughput:
            return -gbs * (-key) / space.ref_total_s if key < 0 else 0.0
        return key * space.all_total_s / 3600.0

    pending: list[tuple[float, int, int, tuple[Segment, ...]]] = []
    counter = itertools.count()

    def tight(space: _MbsSpace, shape: tuple[Segment, ...], busiest: float = 0.0
              ) -> tuple[float, float] | None:
        """(score bound, busiest-stage bound) of a shape, or None if the limits rule it out.

        ``busiest``: the busiest stage of the shape's min-max split when known; every split of
        the shape has a stage at least that busy, and no iteration is shorter than its busiest stage.
        """
        cap = sum(s.capacity for s in shape)
        tau = space.ref_total_s / cap
        t_lb = max(tau, busiest, link_lb(space, shape)) + sync_lb(shape)
        rate = sum(s.min_usd_per_hr for s in shape)
        # Limits are checked on the bound; once the split is known, also on an estimate adding
        # the warm-up/cool-down of the other stages ((P - 1) busiest steps over n micro-batches),
        # which is not a bound but keeps far-off shapes from eating the budget of the margin passes.
        t_chk = t_lb
        if busiest > 0 and (searcher.cap_margin < 1 or searcher.floor_margin > 1):
            num_stages = sum(s.num_stages for s in shape)
            n_min = min(s.num_microbatches for s in shape)
            t_chk = t_lb + busiest * (num_stages - 1) / max(n_min, 1)
        if req.max_usd_per_hour is not None and rate > req.max_usd_per_hour * searcher.cap_margin * (1 + 1e-9):
            return None
        if req.max_usd_per_iteration is not None and rate * t_chk / 3600 > req.max_usd_per_iteration * searcher.cap_margin * (1 + 1e-9):
            return None
        if req.min_throughput_samples_per_s is not None and gbs / t_chk < req.min_throughput_samples_per_s * searcher.floor_margin * (1 - 1e-9):
            return None
        score = -gbs / t_lb if throughput else rate * t_lb / 3600
        return score, tau

    sync_memo: dict = {}
    link_memo: dict = {}

    def link_s(a: Segment, b: Segment) -> float:
        """Activation + gradient of one micro-batch between replicas of a and b (same zone if any)."""
        key = (a.gpu, a.tp_degree, b.gpu, b.tp_degree, a.kind.micro_batch_size)
        t = link_memo.get(key)
        if t is None:
            za = sorted(searcher.zone_gpus[a.gpu])
            zb = sorted(searcher.zone_gpus[b.gpu])
            common = sorted(set(za) & set(zb))
            pair = (common[0], common[0]) if common else (za[0], zb[0])
            nbytes = min(layer_table(v.profile).output_bytes[min(1, searcher.num_layers - 1)]
                         for v in searcher.variants(a.kind))
            t = link_memo[key] = boundary_transfer_s(
                searcher.network, nbytes, endpoint(pair[0], a.gpu, a.tp_degree),
                endpoint(pair[1], b.gpu, b.tp_degree))
        return t

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

    def sync_lb(shape: tuple[Segment, ...]) -> float:
        """The stage holding the most parameters holds at least 1/P of them; its ring is at best
        a same-zone ring of its segment's replicas.  (A bound up to TP-sharding rounding.)"""
        num_stages = sum(s.num_stages for s in shape)
        best = math.inf
        for seg in shape:
            if seg.dp_degree == 1:
                return 0.0
            key = (seg.gpu, seg.tp_degree, seg.dp_degree, num_stages)
            t = sync_memo.get(key)
            if t is None:
                kind = seg.kind
                nbytes = min(v.total_params * v.regime.grad_bytes_per_param
                             for v in searcher.variants(kind)) / num_stages
                t = min(
                    searcher.fast.ring_s(nbytes, seg.gpu, zone, seg.dp_degree)
                    for zone, n in searcher.zone_gpus[seg.gpu].items() if n > 0
                )
                sync_memo[key] = t
            best = min(best, t)
        return best

    # With caps or a floor the good shapes sit in a band of cost or capacity that the lazy
    # order reaches late; for up to two GPU types, score every shape at once instead.
    banded = not throughput or req.max_usd_per_hour is not None or req.max_usd_per_iteration is not None
    for si, space in enumerate(spaces):
        if banded and len(space.lists) <= 2:
            for shape in _materialize(space, searcher, req, limit=4000):
                t = tight(space, shape)
                if t is not None:
                    heapq.heappush(pending, (t[0], next(counter), si, shape, t[1]))
            space.heap = _ProductHeap([])

    space_heap = [(loose(sp), i) for i, sp in enumerate(spaces)]
    heapq.heapify(space_heap)

    # The capacity bound that orders the lazy heaps is far looser than the tight bound, so
    # moving shapes until it crosses the best pending bound would score tens of thousands of
    # shapes.  After a sample, scale it by the most optimistic tight/loose ratio seen so far:
    # an estimate, not a bound, so a stop it causes is not reported as exhausted.
    calib = {"ratio": None, "seen": 0}

    def calibrated(lb: float) -> float:
        r = calib["ratio"]
        if r is None or calib["seen"] < 64 or lb in (math.inf, 0.0):
            return lb
        return lb * r

    def fill_pending() -> None:
        # Move shapes from the lazy heaps while some heap's (calibrated) bound beats the best pending one.
        while space_heap:
            lb, si = space_heap[0]
            if lb == math.inf or calib["seen"] >= req.max_shapes_scored:
                return
            if pending and pending[0][0] <= calibrated(lb):
                return
            best_space = spaces[si]
            idx = best_space.heap.pop()
            heapq.heapreplace(space_heap, (loose(best_space), si))
            shape = tuple(s for lst, i in zip(best_space.lists, idx) if (s := lst[i]) is not None)
            if not shape or sum(s.num_stages for s in shape) > searcher.max_stages:
                continue
            t = tight(best_space, shape)
            if t is None:
                continue
            if lb not in (math.inf, 0.0):
                # Scores are -throughput (< 0) or cost (> 0); tight >= loose either way.
                r = t[0] / lb
                calib["ratio"] = r if calib["ratio"] is None else (
                    max(calib["ratio"], r) if lb < 0 else min(calib["ratio"], r))
                calib["seen"] += 1
            heapq.heappush(pending, (t[0], next(counter), si, shape, t[1]))

    def proven_done(threshold: float) -> bool:
        return all(lb >= threshold for lb, _ in space_heap)

    since_gain = 0
    while True:
        fill_pending()
        if not pending:
            searcher.stats.exhausted = not space_heap or proven_done(searcher.threshold())
            return
        bound, _, si, shape, tau, *prepared = heapq.heappop(pending)
        before = searcher.threshold()
        if bound >= before:
            searcher.stats.exhausted = proven_done(before)
            return
        if searcher.stats.num_evaluated >= stop_at or since_gain >= req.patience:
            return
        space = spaces[si]
        if not prepared:
            # Refine the bound with the real split (memory, layer granularity, the heavy head
            # layer): cheap next to an evaluation, and it reorders most optimistic shapes.
            splits = [(order, searcher.prepare(space.mbs, order, tau)) for order in _orders(shape)]
            splits = [(o, p) for o, p in splits if p is not None]
            if not splits:
                continue
            t = tight(space, shape, min(p[2] for _, p in splits))
            if t is None:
                continue
            heapq.heappush(pending, (t[0], next(counter), si, shape, tau, splits))
            continue
        for order, prep in prepared[0]:
            searcher.evaluate_shape(space.mbs, order, tau, prep)
        # Patience: the bounds are loose (memory and the embedding/head layers are not in them),
        # so stop once many shapes in a row no longer move the top N by more than 0.1 %.
        after = searcher.threshold()
        if after < before and (before == math.inf or abs(after - before) > 1e-3 * abs(before)):
            since_gain = 0
        elif after < math.inf:  # no patience before the first plan that meets the request
            since_gain += 1


def _materialize(space: _MbsSpace, searcher: Searcher, req: PlanRequest, *, limit: int
                 ) -> list[tuple[Segment, ...]]:
    """Every shape over (at most) two per-type lists, pre-scored with numpy; the best ``limit``."""
    import numpy as np

    lists = [[s for s in lst if s is not None] for lst in space.lists]
    arrays = []
    for lst in lists:
        arrays.append(dict(
            cap=np.array([s.capacity for s in lst] + [0.0]),
            rate=np.array([s.min_usd_per_hr for s in lst] + [0.0]),
            stages=np.array([s.num_stages for s in lst] + [0]),
        ))
    if len(arrays) == 1:
        idx = [np.arange(len(lists[0]))]
        grid = [{k: v[idx[0]] for k, v in arrays[0].items()}]
        absent = [np.zeros(len(idx[0]), dtype=bool)]
    else:
        ia, ib = np.meshgrid(np.arange(len(lists[0]) + 1), np.arange(len(lists[1]) + 1), indexing="ij")
        ia, ib = ia.ravel(), ib.ravel()
        keep = ~((ia == len(lists[0])) & (ib == len(lists[1])))
        ia, ib = ia[keep], ib[keep]
        idx = [ia, ib]
        grid = [{k: v[i] for k, v in arr.items()} for arr, i in zip(arrays, idx)]
        absent = [ia == len(lists[0]), ib == len(lists[1])]
    cap = sum(g["cap"] for g in grid)
    rate = sum(g["rate"] for g in grid)
    stages = sum(g["stages"] for g in grid)
    t_lb = space.ref_total_s / cap
    ok = stages <= searcher.max_stages
    if req.max_usd_per_hour is not None:
        ok &= rate <= req.max_usd_per_hour * searcher.cap_margin * (1 + 1e-9)
    if req.max_usd_per_iteration is not None:
        ok &= rate * t_lb / 3600 <= req.max_usd_per_iteration * searcher.cap_margin * (1 + 1e-9)
    if req.min_throughput_samples_per_s is not None:
        ok &= req.global_batch_size / t_lb >= req.min_throughput_samples_per_s * searcher.floor_margin * (1 - 1e-9)
    score = -req.global_batch_size / t_lb if req.objective is Objective.THROUGHPUT else rate * t_lb / 3600
    score = np.where(ok, score, np.inf)
    count = int(ok.sum())
    if count == 0:
        return []
    take = min(limit, count)
    best = np.argpartition(score, take - 1)[:take] if take < len(score) else np.arange(len(score))
    best = best[np.argsort(score[best], kind="stable")]
    out = []
    for j in best:
        if not np.isfinite(score[j]):
            continue
        out.append(tuple(lists[t][int(idx[t][j])] for t in range(len(lists)) if not absent[t][j]))
    return out


def _orders(shape: tuple[Segment, ...]) -> list[tuple[Segment, ...]]:
    """Larger-memory GPUs first (early 1F1B stages hold more micro-batches), and the reverse."""
    if len(shape) == 1:
        return [shape]
    first = tuple(sorted(shape, key=lambda s: (-get_gpu(s.gpu).memory_bytes, s.gpu)))
    return [first, first[::-1]]
