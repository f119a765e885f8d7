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

Bounds, refined in steps so that only shapes still in front pay for the next:

0. capacity: the segments' compute capacity with fractional layers (an upper bound
   on throughput, or a lower bound on cost), plus the smallest DP ring, the links'
   steady state (``_steady_links_s``), the pipeline's warm-up and cool-down
   (``_pipe_work_rate``, ``_warm_up_with_links_s``), compute, links and DP sync
   together for two segments (``joint_lb``, and in numpy ``_pipeline_lines`` with the
   stages where the segments meet: moving work off one segment shortens its ring but
   lengthens the other's compute), and the rings and stage boundaries that must cross
   zones (egress, with rent and time together: ``joint_cost_lb``);
1. granular: whole blocks per stage and the LM head on one of them
   (``granular_busiest_s``), and, when cost matters, the placement's exact rent
   and the egress of every micro-batch crossing a zone between stages;
2. split: the real min-max split of each order (memory, real layer times) and its
   exact rent and egress; each order is queued on its own.

All three are valid bounds, so pruning (a bound that cannot enter the top N) is
safe.  The queue, though, is ordered by an *estimate*: the bound with its
iteration time scaled by the typical excess of simulated over bounded time seen
so far on pipelines as deep (deep pipelines lose more to p2p and bubbles than a
bound can see).  That finds the good plans early; once many evaluations in a row
do not improve the best plan (``patience``) the search switches to bound order, which either
proves the top N optimal (``exhausted``, as on small clusters) or stops after
twice the patience.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from dataclasses import dataclass, field

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan, Replica, Stage
from sailor_core.planner.kinds import Kind, shared_kind_cache, valid_tp_degrees
from sailor_core.planner.placement import StagePlacement, place_pipelines, place_stages
from sailor_core.planner.request import Objective, PlanRequest
from sailor_core.planner.split import StageSlot, busiest_s, min_max_split
from sailor_core.planner.fastsim import FastResult, FastSim, FastStage
from sailor_core.simulator.memory import inflight_microbatches
from sailor_core.network.model import Endpoint
from sailor_core.simulator.stage import boundary_transfer_s, endpoint
from sailor_core.simulator.tables import layer_table


@dataclass(slots=True, eq=False)
class Segment:
    """A run of consecutive stages on one GPU type (see the module docstring).  Never changed
    once built; not frozen because searches build them by the ten thousand (a frozen
    dataclass's constructor takes 4 us instead of 0.9 us with 13 fields)."""

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
    block_busy_s: float  # num_microbatches x the fastest block (any variant): a stage's busy time per block
    head_busy_s: float  # num_microbatches x the fastest last layer: what the stage holding it adds
    egress_usd: float = 0.0  # a lower bound on its own p2p egress per iteration (stages in different zones)

    @property
    def num_gpus(self) -> int:
        return self.num_stages * self.dp_degree * self.tp_degree


_NONE = None  # "this GPU type is not used" in a per-type list
_GRID = 8  # intervals of a segment's share of the blocks in the joint compute/sync bound
_CHUNK = 2048  # shapes refined at once (numpy temporaries of a few lines x this stay in cache)


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
    num_splits: int = 0  # min-max splits computed (a split costs about a quarter of an evaluation)
    fitting: list[Evaluated] = field(default_factory=list)

    @property
    def work(self) -> int:
        """What the evaluation budget counts: evaluations, and splits at four to one."""
        return self.num_evaluated + self.num_splits // 4


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
        self.kinds = shared_kind_cache(request.model, request.seq_len, request.regime, profiles)
        self.zone_gpus: dict[str, dict[str, int]] = {}
        for (gpu, zone), n in request.availability.items():
            self.zone_gpus.setdefault(gpu, {})[zone] = n
        self.gpu_types = sorted(self.zone_gpus)
        self.stats = SearchStats()
        self.top: list[Evaluated] = []
        self.seen_plans: set = set()
        self._sim_cache: dict = {}
        self._variants: dict = {}
        self._block_head: dict = {}
        self._granular: dict = {}
        # Splits and placements of ordered shapes, by segment attributes: the passes and
        # the sub-searches of one request meet the same shapes again.
        self.prepared_memo: dict = {}
        # The same for the process, keyed by all a split depends on besides the kinds (which
        # the memo lives with): placements by the pools of the shape's GPU types.
        self._process_splits = process_memo(self.kinds, network, "splits", max_entries=1 << 15)
        self._kind_figures = process_memo(self.kinds, network, "kind figures", max_entries=1 << 14)
        self.placed_memo: dict = {}
        # A segment's placement depends on its type's pools alone: for the process.
        self._segment_places = process_memo(self.kinds, network, "segment placements", max_entries=1 << 15)
        self.placed_costs_memo: dict = {}
        self.bound_memos: dict[str, dict] = {}  # run_search's per-segment bound parts, kept across passes
        self._boundary_bytes: dict = {}
        self._round_trip: dict = {}
        self._segments: dict = {}
        self.fewest_crossings_memo: dict = {}  # (shared by sub-searches: same zones per GPU type)
        # Segment lists and their numpy columns, for the process (see segments_for): replay
        # requests one after the other mostly change one GPU type's pools, not the other's.
        self.segment_lists = process_memo(self.kinds, network, "segment lists")
        self._crossing_usd: dict = {}  # per kind: USD of one micro-batch's boundary both ways across zones
        self.sorted_memo: dict = {}  # micro-batch size -> every shape scored (see run_search)
        # The simulator's memoised figures live as long as the kinds they were keyed on (by id).
        fkey = ("fastsim", request.global_batch_size, id(network), request.spot, request.regime)
        fast = self.kinds.extras.get(fkey)
        if fast is None or fast.network is not network:
            fast = self.kinds.extras[fkey] = FastSim(
                model=request.model, global_batch_size=request.global_batch_size,
                network=network, spot=request.spot, regime=request.regime)
        fast.trim()
        self.fast = fast
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
        self.relaxed_memo: dict = {}  # see api.relaxed
        self.estimate_limits = False  # check caps and floor on bound x excess too (see plan_job)
        # GPU types whose one-type shapes a search of their own has settled: every one that could
        # enter this search's top N was evaluated there and its plans offered here (plan_job).
        self.settled_types: set[str] = set()

    def sub_searcher(self, request: PlanRequest) -> "Searcher":
        """A Searcher for ``request`` (same model) that reuses what this one worked out."""
        sub = Searcher(request, profiles=self.profiles, network=self.network)
        sub.kinds = self.kinds  # same model and regime: share the kinds (and their memo)
        # Same kinds and zones per GPU type: a shape's split, placement and rent are the same here.
        sub.prepared_memo = self.prepared_memo
        sub.placed_memo = self.placed_memo
        sub.placed_costs_memo = self.placed_costs_memo
        sub.fewest_crossings_memo = self.fewest_crossings_memo
        if request.availability == self.req.availability:
            # Same GPU types too: the same regime variants, so the same bound parts.
            sub.bound_memos = self.bound_memos
            sub._variants = self._variants
            sub._block_head = self._block_head
            sub._granular = self._granular
        return sub

    def seed_from(self, other: "Searcher") -> None:
        """Start from ``other``'s top N (same objective and limits): only plans that beat them matter."""
        self.top = list(other.top)
        self.seen_plans = set(other.seen_plans)

    def done_searching(self) -> None:
        """No more ``run_search`` passes: drop the scored shapes, whose streams hold the search's
        closures and so the searcher (a cycle that would wait for the collector plan_job pauses)."""
        self.sorted_memo.clear()

    @property
    def cost_matters(self) -> bool:
        """Placement decides rent and egress, which only the cost objective and the caps look at."""
        r = self.req
        return (r.objective is Objective.COST or r.max_usd_per_hour is not None
                or r.max_usd_per_iteration is not None)

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

    def block_and_head_s(self, kind: Kind) -> tuple[float, float]:
        """(fastest block, fastest last layer) of ``kind`` over its variants, per micro-batch.

        A stage holding b blocks takes at least b times the first; the stage holding the last
        layer (the LM head: one to two blocks' worth of compute) also the second.
        """
        key = (kind.gpu, kind.tp_degree, kind.micro_batch_size)
        hit = self._block_head.get(key)
        if hit is None:
            vs = self.variants(kind)
            hit = self._kind_figures.get(("block and head", tuple(vs)))
            if hit is None:
                L = self.num_layers
                if L >= 3:
                    block = min(v.time_s(i, i + 1) for v in vs for i in range(1, L - 1))
                    head = min(v.time_s(L - 1, L) for v in vs)
                else:
                    block, head = min(v.time_s(i, i + 1) for v in vs for i in range(L)), 0.0
                hit = self._kind_figures[("block and head", tuple(vs))] = (block, head)
            self._block_head[key] = hit
        return hit

    def gradient_bytes_lb(self, mbs: int) -> tuple[float, float]:
        """(whole model, one block): gradient bytes a DP ring of any kind of this search carries
        for them, TP shards counted whole (shard x degree), the least over kinds and regime
        variants layer by layer, so that the bytes of any split's stages add up to at least the
        first."""
        # Kinds and variants only: the same for every search of these GPU types in the process.
        key = ("gradient bytes", mbs, tuple(self.gpu_types), self.req.max_tp_degree)
        hit = self.kinds.extras.get(key)
        if hit is None:
            L = self.num_layers
            per_layer = [math.inf] * L
            for g in self.gpu_types:
                for tp in valid_tp_degrees(self.req.model, g, self.req.max_tp_degree):
                    kind = self.kinds.get(g, tp, mbs)
                    for v in self.variants(kind) if kind is not None else ():
                        table = layer_table(v.profile)
                        scale = tp * v.regime.grad_bytes_per_param
                        for i in range(L):
                            per_layer[i] = min(per_layer[i], scale * table.params(i, i + 1))
            blocks = per_layer[1:L - 1] if L >= 3 else per_layer
            hit = self.kinds.extras[key] = (sum(per_layer), min(blocks))
        return hit

    def ideal_score(self, gpus: list[str]) -> float:
        """The best score any plan on only these GPU types could have (inf: none meets the
        limits): every GPU busy the whole iteration on its fastest kind for each layer, with no
        bubble, link or sync.  A micro-batch's layer takes its kind's TP degree times its time
        in GPU-seconds, so an iteration on N GPUs lasts at least the least GPU-seconds of the
        batch over N, and costs at least those GPU-seconds at the cheapest price."""
        L, gbs = self.num_layers, self.req.global_batch_size
        key = ("ideal GPU-seconds", tuple(gpus), tuple(self.gpu_types), tuple(self.micro_batch_sizes()), gbs,
               self.req.max_tp_degree)
        gpu_s = self.kinds.extras.get(key)
        if gpu_s is None:
            gpu_s = math.inf
            for mbs in self.micro_batch_sizes():
                per_layer = [math.inf] * L
                for g in gpus:
                    for tp in valid_tp_degrees(self.req.model, g, self.req.max_tp_degree):
                        kind = self.kinds.get(g, tp, mbs)
                        for v in self.variants(kind) if kind is not None else ():
                            for i in range(L):
                                per_layer[i] = min(per_layer[i], tp * v.time_s(i, i + 1))
                gpu_s = min(gpu_s, gbs // mbs * sum(per_layer))
            self.kinds.extras[key] = gpu_s
        pools = [(g, z, n) for g in gpus for z, n in self.zone_gpus.get(g, {}).items() if n > 0]
        if gpu_s == math.inf or not pools:
            return math.inf
        t = gpu_s / sum(n for _, _, n in pools)
        usd = gpu_s * min(gpu_price_usd_per_hr(g, z, spot=self.req.spot) for g, z, _ in pools) / 3600
        r = self.req
        if r.min_throughput_samples_per_s is not None and gbs / t < r.min_throughput_samples_per_s * (1 - 1e-9):
            return math.inf
        if r.max_usd_per_iteration is not None and usd > r.max_usd_per_iteration * (1 + 1e-9):
            return math.inf
        return -gbs / t if r.objective is Objective.THROUGHPUT else usd

    def learn_excess(self, num_stages: int, ratio: float) -> None:
        self.excess_version += 1
        self.excess[num_stages] = min(self.excess.get(num_stages, math.inf), ratio)
        total, count = self._log_excess.get(num_stages, (0.0, 0))
        self._log_excess[num_stages] = (total + math.log(max(ratio, 1.0)), count + 1)

    def learn_excess_from(self, other: "Searcher") -> None:
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

    @property
    def num_blocks(self) -> int:
        return self.num_layers - 2 if self.num_layers >= 3 else self.num_layers

    def granular_busiest_s(self, shape: tuple[Segment, ...]) -> float:
        """A lower bound on the busiest stage of every split of ``shape`` (see ``granular_busiest_s``)."""
        key = tuple(sorted((s.num_stages, s.block_busy_s, s.head_busy_s) for s in shape))
        hit = self._granular.get(key)
        if hit is None:
            hit = self._granular[key] = granular_busiest_s(key, self.num_blocks)
        return hit

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
        if key in self.seen_plans:
            return
        self.seen_plans.add(key)
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
        key = (gpu, mbs, num_mb, tuple(ref))
        hit = self._segments.get(key)
        if hit is None:
            terms = self._segment_terms(gpu, mbs, ref)
            # Sub-searches of one request (same zones per GPU type) often work the same list out:
            # shared by everything it depends on.
            full_range = (self.req.objective is Objective.COST or self.req.max_usd_per_hour is not None
                          or self.req.max_usd_per_iteration is not None or self.req.collect_pareto)
            # Shared by the process (kinds and network are the memo's): the type's pools (prices,
            # placements and crossings follow from them) and the terms decide the list.
            shared = (gpu, tuple(self.zone_gpus[gpu].items()), self.req.spot, num_mb, full_range,
                      self.max_stages_per_type, terms)
            hit = self.segment_lists.get(shared)
            if hit is None:
                hit = self.segment_lists[shared] = self._segments_for(gpu, num_mb, full_range, terms)
            self._segments[key] = hit
        return hit

    def _segment_terms(self, gpu: str, mbs: int, ref: list[float]) -> tuple:
        """Per TP degree with a kind: (TP, kind, slowness against ``ref``, fastest block and last
        layer (``block_and_head_s``), USD per micro-batch crossing zones (None: no p2p crosses))."""
        p2p_crosses = self.cost_matters and sum(1 for n in self.zone_gpus[gpu].values() if n > 0) > 1
        out = []
        ref_key = tuple(ref)
        for tp in valid_tp_degrees(self.req.model, gpu, self.req.max_tp_degree):
            kind = self.kinds.get(gpu, tp, mbs)
            if kind is None:
                continue
            # The same variants against the same reference, in every request of these GPU types.
            key = ("slowness", tuple(self.variants(kind)), ref_key)
            ratio = self._kind_figures.get(key)
            if ratio is None:
                ratio = self._kind_figures[key] = min(
                    (v.time_s(i, i + 1) / ref[i]) for v in self.variants(kind)
                    for i in range(self.num_layers) if ref[i] > 0
                ) if any(r > 0 for r in ref) else 1.0
            out.append((tp, kind, ratio, *self.block_and_head_s(kind),
                        self.crossing_usd_per_byte(kind) if p2p_crosses else None))
        return tuple(out)

    def _segments_for(self, gpu: str, num_mb: int, full_range: bool, terms: tuple) -> list[Segment]:
        live = {z: n for z, n in self.zone_gpus[gpu].items() if n > 0}
        min_price = min(gpu_price_usd_per_hr(gpu, z, spot=self.req.spot) for z in live)
        out: list[Segment] = []
        for tp, kind, ratio, block_s, head_s, per_byte in terms:
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
                    # Whole pipelines per zone only differ from the stage rule when the segment
                    # does not fit one zone: the stage rule then sends every micro-batch across
                    # a zone boundary between stages, this one crosses zones in the DP rings.
                    if (len(live) > 1 and d * num_stages > zone_max
                            and sum(n // (tp * num_stages) for n in live.values()) >= d):
                        rules.append("pipeline")
                    for rule in rules:
                        # A lower bound on the segment's own p2p egress: consecutive stages placed
                        # whole in different zones send every micro-batch across, both ways,
                        # whatever zone the segment starts after; none under the pipeline rule
                        # (its p2p stays in a zone) or for a one-zone type.
                        egress = self.fewest_crossings(gpu, tp, d, num_stages) * num_mb * per_byte \
                            if per_byte is not None and rule == "stage" and num_stages > 1 else 0.0
                        out.append(Segment(
                            gpu=gpu, kind=kind, tp_degree=tp, dp_degree=d, num_stages=num_stages,
                            rule=rule, capacity=cap, slowness=ratio, num_microbatches=n_per_rep,
                            min_usd_per_hr=num_stages * d * tp * min_price,
                            block_busy_s=n_per_rep * block_s, head_busy_s=n_per_rep * head_s,
                            egress_usd=egress,
                        ))
        return out

    # ---- building a plan from a shape -------------------------------------------------

    def build_stages(self, shape: tuple[Segment, ...]) -> list[tuple[Kind, StagePlacement]] | None:
        key = _order_key(shape)
        if key in self.placed_memo:
            return self.placed_memo[key]
        out = self.placed_memo[key] = self._build_stages(shape)
        return out

    def _build_stages(self, shape: tuple[Segment, ...]) -> list[tuple[Kind, StagePlacement]] | None:
        stages: list[tuple[Kind, StagePlacement]] = []
        prev_zone: str | None = None
        first = shape[0].kind
        for seg in shape:
            zones = {z: n for z, n in self.zone_gpus[seg.gpu].items() if n > 0}
            key = (seg.gpu, tuple(zones.items()), seg.tp_degree, seg.dp_degree, seg.num_stages, seg.rule,
                   prev_zone if seg.rule == "stage" else None)
            if key in self._segment_places:
                placed = self._segment_places[key]
            elif seg.rule == "pipeline":
                placed = self._segment_places[key] = place_pipelines(
                    zones, seg.tp_degree, seg.dp_degree, seg.num_stages)
            else:
                placed = self._segment_places[key] = place_stages(
                    zones, seg.tp_degree, seg.dp_degree, seg.num_stages, prev_zone)
            if placed is None:
                return None
            kind = self.kinds.in_regime_of(seg.kind, first)
            for p in placed:
                stages.append((kind, p))
            last = placed[-1]
            prev_zone = max(last, key=lambda p: (p[1], p[0]))[0]
        return stages

    def placed_costs_lb(self, mbs: int, stages: list[tuple[Kind, StagePlacement]]) -> tuple[float, float]:
        """(USD per hour, a lower bound on the egress USD per iteration) of a placed shape before
        its split: the rent is exact; every micro-batch routed across a zone boundary carries at
        least the smallest activation both ways (the rings' egress depends on the split: left out)."""
        fast = self.fast
        num_mb = self.req.global_batch_size // mbs
        usd_per_hr = egress = 0.0
        for i, (kind, placed) in enumerate(stages):
            for zone, n in placed:
                usd_per_hr += n * kind.tp_degree * fast.price(kind.gpu, zone)
            if i + 1 == len(stages):
                break
            nxt_kind, nxt = stages[i + 1]
            if placed == nxt:
                continue  # the same replicas per zone: m mod D sends every micro-batch within its zone
            if len(placed) == 1 and len(nxt) == 1:
                crossing = num_mb * self.round_trip_usd_per_byte(placed[0][0], nxt[0][0])
            else:
                src = tuple((kind, z, n) for z, n in placed)
                dst = tuple((nxt_kind, z, n) for z, n in nxt)
                crossing = sum(carried * self.round_trip_usd_per_byte(src[a][1], dst[b][1])
                               for (a, b), carried in fast._group_pairs(num_mb, src, dst).items()
                               if src[a][1] != dst[b][1])
            if crossing:
                egress += crossing * self.min_boundary_bytes(kind)
        return usd_per_hr, egress

    def crossing_usd_per_byte(self, kind: Kind) -> float:
        """USD of one micro-batch's boundary, both ways, between two zones of its GPU type, at
        the least (the cheapest pair, the smallest activation over its regime variants)."""
        pkey = (kind.gpu, kind.tp_degree, kind.micro_batch_size)
        per_byte = self._crossing_usd.get(pkey)
        if per_byte is None:
            zones = [z for z, n in self.zone_gpus[kind.gpu].items() if n > 0]
            price = min(self.round_trip_usd_per_byte(a, b) for a in zones for b in zones if a != b)
            per_byte = self._crossing_usd[pkey] = price * min(self.min_boundary_bytes(v) for v in self.variants(kind))
        return per_byte

    def fewest_crossings(self, gpu: str, tp: int, d: int, num_stages: int) -> int:
        """The fewest boundaries between consecutive stages placed whole in different zones,
        over the zones the stage placement may start after (0 for a one-zone type)."""
        key = (gpu, tp, d, num_stages)
        fewest = self.fewest_crossings_memo.get(key)
        if fewest is None:
            zones = {z: n for z, n in self.zone_gpus[gpu].items() if n > 0}
            fewest = 0 if len(zones) < 2 else math.inf
            for prev in (None, *sorted(zones)) if fewest else ():
                placed = place_stages(zones, tp, d, num_stages, prev)
                if placed is None:
                    fewest = 0
                    break
                crossings = sum(1 for a, b in zip(placed, placed[1:])
                                if len(a) == 1 and len(b) == 1 and a[0][0] != b[0][0])
                fewest = min(fewest, crossings)
            self.fewest_crossings_memo[key] = fewest
        return fewest

    def round_trip_usd_per_byte(self, za: str, zb: str) -> float:
        key = (za, zb)
        hit = self._round_trip.get(key)
        if hit is None:
            hit = self._round_trip[key] = (self.network.egress_usd_per_byte(za, zb)
                                           + self.network.egress_usd_per_byte(zb, za))
        return hit

    def min_boundary_bytes(self, kind: Kind) -> int:
        key = id(kind)
        hit = self._boundary_bytes.get(key)
        if hit is None:
            out = layer_table(kind.profile).output_bytes
            hit = self._boundary_bytes[key] = min(out[: max(1, self.num_layers - 1)])
        return hit

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
        key = (mbs, _order_key(shape))
        if key in self.prepared_memo:
            return self.prepared_memo[key]
        out = self.prepared_memo[key] = self._prepare(mbs, shape, tau_lb)
        return out

    def _prepare(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float):
        self.stats.num_splits += 1
        stages = self.build_stages(shape)
        if stages is None:
            return None
        num_mb = self.req.global_batch_size // mbs
        # The split depends on the stages' kinds and replica counts, not their zones: shared by
        # the process (the first bound asked decides where the bisection ends: in the key).
        split_key = (num_mb, tau_lb, tuple([(kind, sum(c for _, c in placed)) for kind, placed in stages]))
        hit = self._process_splits.get(split_key)
        if hit is None:
            P = len(stages)
            slots = []
            for i, (kind, d) in enumerate(split_key[2]):
                n = -(-num_mb // d)
                slots.append(StageSlot(kind=kind, num_microbatches=n,
                                       num_inflight=inflight_microbatches(i, P, n)))
            ends = min_max_split(slots, self.num_layers, lower_bound_s=tau_lb)
            hit = self._process_splits[split_key] = (ends, None if ends is None else busiest_s(slots, ends))
        ends, busiest = hit
        if ends is None:
            self.stats.memory_failures += 1
            return None
        return stages, ends, busiest

    def evaluate_shape(self, mbs: int, shape: tuple[Segment, ...], tau_lb: float,
                       prepared=None) -> Evaluated | None:
        if prepared is None:
            prepared = self.prepare(mbs, shape, tau_lb)
            if prepared is None:
                return None
        stages, ends, _ = prepared
        self.stats.num_shapes += 1
        ev = self.evaluate(mbs, self.fast_stages(stages, ends))
        # Polish only shapes that may become the best plan: within a margin of it (the min-max
        # split ignores p2p, sync and warm-up; polishing has gained up to ~20 %, mostly a few %).
        cutoff = self.top[0].score if self.top else math.inf
        gate = 0.25 if len(stages) <= 6 else 0.05  # long pipelines polish only their busiest stage
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
            better = self.polish(ev.mbs, placed, ends, ev, full=True)
            if better is not ev:
                self.offer(better)

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
                if better(trial, best):
                    best, best_ends, found = trial, cand, True
        return (best, best_ends) if found else None


def granular_busiest_s(segments, num_blocks: int) -> float:
    """Smallest ``t`` such that stages of busy time at most ``t`` can hold every block whole.

    ``segments``: (stages, busy seconds per block, busy seconds of the last layer) per segment.
    A stage of busy time <= t holds at most floor(t / r) blocks, the one holding the last layer
    floor((t - h) / r); the capacity bound (``tau``) counts fractions of blocks, which on deep
    pipelines of a few blocks per stage and with the heavy LM head is 25-35 % too optimistic.
    Counts only change at the breakpoints k r and h + k r, so step through them from the
    fractional bound.  (The embedding is left out: a bound may ignore work.)
    """
    if num_blocks <= 0 or any(r <= 0 for _, r, _ in segments):
        return 0.0
    t = num_blocks / sum(n / r for n, r, _ in segments)
    while True:
        count, loss, nxt = 0, math.inf, math.inf
        for n, r, h in segments:
            k = int(t / r + 1e-9)
            count += n * k
            nxt = min(nxt, (k + 1) * r)
            if t >= h:
                kh = int((t - h) / r + 1e-9)
                loss = min(loss, k - kh)
                nxt = min(nxt, h + (kh + 1) * r)
            else:
                nxt = min(nxt, h)
        if loss < math.inf and count - loss >= num_blocks:
            return t
        t = nxt


def better(a: Evaluated, b: Evaluated) -> bool:
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


class _SortedShapes:
    """Shapes of at most two per-type lists (index -1 or past the end: type unused), best first,
    with their bound's parts: a bound on the busiest stage, and ``tight``'s (iteration time,
    USD per hour, egress USD per iteration, stages).  With a ``stream`` (``_ShapeStream``) the
    lists are grown on demand, in the same order a full sort would give."""

    def __init__(self, first: list[Segment], second: list[Segment], ia, ib, scores, busiest, parts) -> None:
        self.first, self.second = first, second
        self.ia, self.ib, self.scores = ia.tolist(), ib.tolist(), scores.tolist()
        self.busiest = busiest.tolist()
        self.parts = [x.tolist() for x in parts]  # per part, a list over the shapes
        self.pos = 0
        self.cut = math.inf
        self.stream: _ShapeStream | None = None

    def _have(self, count: int) -> bool:
        """Whether there are at least ``count`` shapes (growing the lists if need be)."""
        return count <= len(self.scores) or (self.stream is not None and self.stream.grow(count))

    def peek(self) -> float:
        """The best bound left (those cut off included)."""
        return self.scores[self.pos] if self._have(self.pos + 1) else self.cut

    def fresh(self) -> _SortedShapes:
        """A copy to walk from the start (the lists are shared, only ever appended to)."""
        out = _SortedShapes.__new__(_SortedShapes)
        out.first, out.second, out.ia, out.ib, out.scores = self.first, self.second, self.ia, self.ib, self.scores
        out.busiest, out.parts, out.stream = self.busiest, self.parts, self.stream
        out.pos, out.cut = 0, self.cut
        return out

    def has_next(self) -> bool:
        return self._have(self.pos + 1)

    def count_below(self, score: float) -> int:
        if self.cut < score:
            return 1 << 30  # some were cut off: no proof
        if self.stream is not None:
            self.stream.grow_below(score)
        return bisect.bisect_left(self.scores, score, lo=self.pos) - self.pos

    def peek_stages(self) -> int:
        self._have(self.pos + 1)
        a, b = self.ia[self.pos], self.ib[self.pos]
        return ((self.first[a].num_stages if a < len(self.first) else 0)
                + (self.second[b].num_stages if b < len(self.second) else 0))

    def pop(self) -> tuple[tuple[Segment, ...], tuple]:
        """The next shape and its bound as ``tight`` gives it: (score, busiest stage, parts)."""
        self._have(self.pos + 1)
        i = self.pos
        a, b = self.ia[i], self.ib[i]
        self.pos += 1
        shape = tuple(seg for seg in (self.first[a] if a < len(self.first) else None,
                                      self.second[b] if b < len(self.second) else None) if seg is not None)
        return shape, (self.scores[i], self.busiest[i], tuple(x[i] for x in self.parts))


class _ShapeStream:
    """Grows a ``_SortedShapes`` in exactly the order sorting every refined shape would give
    (final bound, then scoring order), refining shapes only as far as the walk gets.

    Refining only raises a bound, and the shapes to refine come in order of their first bound,
    so a refined shape whose final bound is below the next unrefined one's first bound can be
    placed: no shape still to refine can come before it, ties included (strictly below).  The
    shapes never refined (past the best 20000) keep their first bound, at least every refined
    shape's first bound: they join once all are refined.  A search walks a few hundred of
    some 15000 shapes: the refinement (a fifth of a two-type search) mostly goes."""

    __slots__ = ("scored", "final_of", "never", "rows", "lists", "pool_idx", "pool_score",
                 "never_added", "chunk")

    def __init__(self, scored: _ScoredShapes, target: _SortedShapes, *, final_of, never, rows) -> None:
        import numpy as np

        self.scored = scored
        self.final_of = final_of  # refined indices -> (those within the limits, their final bounds)
        self.never = never  # () -> the same for the shapes never refined
        self.rows = rows  # indices -> (ia, ib, busiest, parts) arrays, as _SortedShapes takes them
        # The lists it grows (not the _SortedShapes itself, which holds the stream: no cycle).
        self.lists = (target.ia, target.ib, target.scores, target.busiest, *target.parts)
        self.pool_idx = np.empty(0, dtype=np.int64)  # final, not placed yet, sorted by (bound, index)
        self.pool_score = np.empty(0)
        self.never_added = False
        self.chunk = 256  # shapes refined at once, doubling to _CHUNK (few are needed at first)

    def _next_unplaced_lb(self) -> float:
        """A bound on every shape not in the pool or placed yet (inf: none)."""
        s = self.scored
        if s.num_refined < len(s.first):
            return s.next_pre()
        return math.inf

    def _step(self) -> bool:
        """Place what can be placed, else refine (or take in) more; False when all is placed."""
        import numpy as np

        lb = self._next_unplaced_lb()
        if lb == math.inf and not self.never_added:
            self._merge(*self.never())
            self.never_added = True
        take = int(np.searchsorted(self.pool_score, lb, side="left"))
        if take:
            idx, score = self.pool_idx[:take], self.pool_score[:take]
            self.pool_idx, self.pool_score = self.pool_idx[take:], self.pool_score[take:]
            ia, ib, busiest, parts = self.rows(idx)
            for mine, more in zip(self.lists, (ia, ib, score, busiest, *parts)):
                mine.extend(more.tolist())
            return True
        s = self.scored
        if s.num_refined >= len(s.first):
            return False
        sel = s.first[s.num_refined:s.num_refined + self.chunk]
        s.num_refined += len(sel)
        self.chunk = min(2 * self.chunk, _CHUNK)
        self._merge(*self.final_of(sel))
        return True

    def _merge(self, idx, score) -> None:
        import numpy as np

        if not len(idx):
            return
        all_idx = np.concatenate([self.pool_idx, idx])
        all_score = np.concatenate([self.pool_score, score])
        order = np.lexsort((all_idx, all_score))
        self.pool_idx, self.pool_score = all_idx[order], all_score[order]

    def grow(self, count: int) -> bool:
        scores = self.lists[2]
        while len(scores) < count:
            if not self._step():
                return False
        return True

    def grow_below(self, score: float) -> None:
        """Place every shape whose bound is below ``score``."""
        scores = self.lists[2]
        while not (scores and scores[-1] >= score) and self._step():
            pass


class _ScoredShapes:
    """Shapes of one micro-batch size with a first bound, refined (``refine``: the granular
    and joint bounds, which only raise it) in order of that bound, as far as asked."""

    __slots__ = ("refine", "_sorted_below", "pre", "first", "num_refined", "final", "never_refined", "_streamed")

    def __init__(self, *, refine, sorted_below, pre, first, never_refined, streamed) -> None:
        self.refine, self._sorted_below = refine, sorted_below
        self._streamed = streamed  # (self) -> _SortedShapes (no cycle: the searcher's memos are freed by refcount)
        self.pre, self.first = pre, first  # first bound; the shapes to refine, best first
        self.num_refined = 0
        self.final = []  # arrays of refined bounds within the limits
        self.never_refined = never_refined  # sorted first bounds of the rest: final as they are

    def next_pre(self) -> float:
        return float(self.pre[self.first[self.num_refined]]) if self.num_refined < len(self.first) else math.inf

    def sorted_below(self, cut: float) -> _SortedShapes:
        """The shapes whose bound is below ``cut``, best first (no shape left to refine may be)."""
        return self._sorted_below(cut, self.num_refined)

    def streamed(self) -> _SortedShapes:
        """Every shape within the limits, best first, refined on demand (``_ShapeStream``)."""
        return self._streamed(self)

    def refine_next(self, count: int) -> None:
        sel = self.first[self.num_refined:self.num_refined + count]
        self.num_refined += len(sel)
        if len(sel):
            self.final.append(self.refine(sel))


def _settle_cut(scored: list[_ScoredShapes], keep: int, chunk: int = _CHUNK) -> float:
    """The (keep + 1)-th best final bound over every shape of ``scored`` (inf if there are no
    more than ``keep``), refining shapes only as far as that needs: best first bound first,
    until the next first bound is no better than the (keep + 1)-th best final bound known.
    Refining only raises a bound, so the shapes left unrefined cannot come below it (and the
    shapes below it are exactly those a full refinement would put there)."""
    import numpy as np

    while True:
        pool = np.concatenate([s.never_refined[:keep + 1] for s in scored]
                              + [x for s in scored for x in s.final] or [np.empty(0)])
        cut = float(np.partition(pool, keep)[keep]) if len(pool) > keep else math.inf
        nxt = min(scored, key=lambda s: s.next_pre(), default=None)
        if nxt is None or nxt.next_pre() >= cut:
            return cut
        nxt.refine_next(chunk)


def _granular_many(sa, ra, ha, sb, rb, hb, num_blocks: int, iterations: int = 24):
    """``granular_busiest_s`` of many two-segment shapes at once (numpy bisection; an absent
    segment has 0 stages).  Returns the low end of the last interval: a bound, to ~1e-7."""
    import numpy as np

    if num_blocks <= 0:
        return np.zeros(len(sa))
    inv = np.where(sa > 0, sa / ra, 0.0) + np.where(sb > 0, sb / rb, 0.0)
    lo = num_blocks / inv
    hi = lo + np.where(sa > 0, ra + ha, 0.0) + np.where(sb > 0, rb + hb, 0.0)

    has_a, has_b = sa > 0, sb > 0
    ra1, rb1 = np.where(has_a, ra, 1.0), np.where(has_b, rb, 1.0)

    def fits(t):
        ka = np.where(has_a, np.floor(t / ra1 + 1e-9), 0.0)
        kb = np.where(has_b, np.floor(t / rb1 + 1e-9), 0.0)
        base = sa * ka + sb * kb
        # The last layer's stage loses the blocks its head time displaces (or cannot be it).
        loss_a = np.where(has_a & (t >= ha), ka - np.floor(np.maximum(t - ha, 0.0) / ra1 + 1e-9), np.inf)
        loss_b = np.where(has_b & (t >= hb), kb - np.floor(np.maximum(t - hb, 0.0) / rb1 + 1e-9), np.inf)
        return base - np.minimum(loss_a, loss_b) >= num_blocks

    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = fits(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return lo


_PROCESS_MEMO_SIZE = 1024  # entries per process memo (a replay's requests meet a few hundred lists)


def process_memo(kinds, network, name: str, max_entries: int = _PROCESS_MEMO_SIZE) -> dict:
    """A dict that lives as long as ``kinds`` (one model's, see ``kinds.shared_kind_cache``) for
    ``network``, for what planning calls one after the other can share; emptied when full."""
    key = ("process memo", name)
    hit = kinds.extras.get(key)
    if hit is None or hit[0] is not network:
        hit = kinds.extras[key] = (network, {})
    memo = hit[1]
    if len(memo) >= max_entries:
        memo.clear()
    return memo


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


def _steady_links_s(num_microbatches: int, link_s: float, num_stages: int) -> float:
    """What links add, at the least, to the pipeline time of a segment beyond n sum(t) / s.

    In 1F1B (``schedule._longest``) a stage's path holds its step and (n - 1) times the mean
    of its and a neighbour's step plus their link l, so for the neighbours (t, t') with the
    largest sum an iteration lasts at least n (t + t') / 2 + (n - 1) l / 2, and at least
    n t_max.  The largest neighbour sum is at least (2 sum t - 2 t_max) / (s - 1); the least
    over t_max of the larger of the two is n sum(t) / s + (n - 1) l / 2 (s - 1) / s."""
    if num_stages < 2:
        return 0.0
    return (num_microbatches - 1) * link_s / 2 * (num_stages - 1) / num_stages


def _pipeline_lines(floor_s, a1, k1, a2, k2, steps_a, steps_b, num_stages_a, num_stages_b, n_a, n_b, link_s):
    """Lower bounds on the pipeline time of a two-segment shape as lines in x, the share of the
    block work segment a does: (intercepts, slopes), numpy arrays with the lines on axis 0.

    ``floor_s``: a bound whatever the split.  Each segment's compute and links' steady state:
    a1 x + k1 and a2 (1 - x) + k2 (see ``joint_lb``).  Where the segments meet: in 1F1B
    (``schedule._longest``) each of the two boundary stages' paths holds its step and n - 1
    times the mean of both steps plus the link l, with its own n, so an iteration T lasts at
    least ((n_a + 1) t_a + (n_a - 1) t_b + (n_a - 1) l) / 2, and the same from b's side.  No
    stage is busier than T, so a boundary stage's step is at least its segment's step sum
    (x steps_a, (1 - x) steps_b: the work times the slowness) minus (stages - 1) T / n.  The
    least T meeting that is the largest of the linear solutions with each side counted or
    dropped: each a line in x.  ``PIPELINE_RISING`` / ``PIPELINE_FALLING`` name the lines
    that may rise / fall."""
    import numpy as np

    ones = np.ones_like(np.asarray(floor_s, dtype=float))
    us, vs = [floor_s * ones, k1 * ones, (a2 + k2) * ones], [0 * ones, a1 * ones, -a2 * ones]
    p, q = (num_stages_a - 1) / n_a, (num_stages_b - 1) / n_b
    for n, ca, cb in ((n_a, (n_a + 1) / 2, (n_a - 1) / 2), (n_b, (n_b - 1) / 2, (n_b + 1) / 2)):
        fixed = (n - 1) * link_s / 2
        d_a, d_b, d_ab = 1 + ca * p, 1 + cb * q, 1 + ca * p + cb * q
        us += [fixed * ones, fixed / d_a, (cb * steps_b + fixed) / d_b, (cb * steps_b + fixed) / d_ab]
        vs += [0 * ones, ca * steps_a / d_a, -cb * steps_b / d_b, (ca * steps_a - cb * steps_b) / d_ab]
    return np.array(us, dtype=float), np.array(vs, dtype=float)


# _pipeline_lines' order: floor, a's compute, b's compute, then per boundary side: the link
# alone (flat), a's step (rises), b's step (falls), both (either).
PIPELINE_RISING, PIPELINE_FALLING = (1, 4, 6, 8, 10), (2, 5, 6, 9, 10)


def _min_max_lines(u, v, intervals, rising=None, falling=None):
    """For each interval [lo, hi]: the least over x in it of the largest line u + v x, per
    column (numpy; lines on axis 0).  The largest line is convex in x: its least is where the
    rising and falling lines cross, the largest of any rising/falling pair's crossing, unless
    that lies outside the interval, where the rising lines at lo or the falling ones at hi
    decide; flat lines count throughout.  ``rising`` / ``falling``: the only lines that may
    rise / fall (indices; default all), to pair fewer."""
    import numpy as np

    rise, fall = v > 0, v < 0
    i, j, i_rises, j_rises = _line_pairs(len(u), rising, falling)
    # A pair's crossing, (v_i u_j - v_j u_i) / (v_i - v_j), is the same number either way
    # round, so each unordered pair is computed once and counts if either line may rise
    # while the other falls.
    ui, vi, uj, vj = u[i], v[i], u[j], v[j]
    with np.errstate(divide="ignore", invalid="ignore"):
        pair = (vi * uj - vj * ui) / (vi - vj)
    counts = (i_rises[:, None] & rise[i] & fall[j]) | (j_rises[:, None] & rise[j] & fall[i])
    cross = np.where(counts, pair, -np.inf).max(axis=0) if len(i) else np.full(u.shape[1:], -np.inf)
    flat = np.where(rise | fall, -np.inf, u).max(axis=0)
    base = np.maximum(cross, flat)
    r = slice(None) if rising is None else list(rising)
    f = slice(None) if falling is None else list(falling)
    up_u, up_v = np.where(rise[r], u[r], -np.inf), np.where(rise[r], v[r], 0.0)
    down_u, down_v = np.where(fall[f], u[f], -np.inf), np.where(fall[f], v[f], 0.0)
    return [np.maximum(base, np.maximum((up_u + up_v * lo).max(axis=0), (down_u + down_v * hi).max(axis=0)))
            for lo, hi in intervals]


@functools.lru_cache(maxsize=64)
def _line_pairs(num_lines: int, rising, falling):
    """Unordered pairs (i < j) of lines where one may rise while the other falls: (i, j, whether
    i may rise with j falling, whether j may rise with i falling), as numpy arrays."""
    import numpy as np

    may_rise = set(range(num_lines)) if rising is None else set(rising)
    may_fall = set(range(num_lines)) if falling is None else set(falling)
    pairs = [(a, b, a in may_rise and b in may_fall, b in may_rise and a in may_fall)
             for a in range(num_lines) for b in range(a + 1, num_lines)]
    pairs = [p for p in pairs if p[2] or p[3]]
    return (np.array([p[0] for p in pairs], dtype=int), np.array([p[1] for p in pairs], dtype=int),
            np.array([p[2] for p in pairs], dtype=bool), np.array([p[3] for p in pairs], dtype=bool))


@functools.lru_cache(maxsize=1 << 12)
def _warm_up_coefficients(num_microbatches: int, num_stages: int) -> tuple[float, float]:
    """(alpha, reached) of ``_warm_up_with_links_s`` for one segment."""
    keep = 1 - 1 / num_microbatches
    reached = 0.0
    for k in range(num_stages):
        reached = reached * keep - k / num_microbatches
    return 1 - keep ** num_stages, reached


def _warm_up_with_links_s(steps_s, num_microbatches, num_stages, link_s):
    """A lower bound on the pipeline time of one segment whose stage steps sum to ``steps_s``,
    with links of at least ``link_s`` between its stages (numpy arrays or floats).

    ``_pipe_work_rate`` with the links: in 1F1B stage k's path holds the steps and the links
    before it and its own n steps, ``sum_{j<k} (t_j + l) + n t_k <= T``.  Every stage taking
    all the time its path allows holds the most; the step sum so reached is affine in T,
    alpha T - gamma l, with alpha = 1 - (1 - 1/n)^s (the warm-up bound) and gamma from the
    same recursion with T = 0, l = 1.  (Allowing negative steps only loosens it.)"""
    import numpy as np

    if not isinstance(steps_s, np.ndarray):
        alpha, reached = _warm_up_coefficients(int(num_microbatches), int(num_stages))
        return (steps_s - reached * link_s) / alpha
    n = np.asarray(num_microbatches, dtype=float)
    s = np.asarray(num_stages)
    keep = 1 - 1 / n
    reached = np.zeros(np.broadcast(n, s).shape)
    for k in range(int(np.max(s))):
        reached = np.where(k < s, reached * keep - k / n, reached)
    alpha = 1 - keep ** s
    return (steps_s - reached * link_s) / alpha


def _pipe_work_rate(order: tuple[Segment, ...]) -> float:
    """Block work (in fastest-kind seconds per micro-batch) a pipeline of these segments, in this
    order, can hold per second of iteration.

    In 1F1B (``schedule._longest``) stage k's busiest replica needs at least
    ``n_k t_k + sum_{j<k} t_j``: its own micro-batches, after the first one's forward through
    the stages before it and before the last one's backward through them.  For an iteration
    of T, the most work the stages can hold with every such path within T is a linear
    programme solved from the last stage back: a stage that holds anything takes all the time
    its path allows, ``(T - sum_{j<k} t_j) / n_k``, and holds that over its slowness; it is
    worth it while 1 / slowness beats what the time is worth to the stages after it.
    Capacity (``Segment.capacity``) is the same with the warm-up left out."""
    rate = 0.0
    for seg in reversed(order):
        inv = 1.0 / seg.slowness
        if rate < inv:
            rate = inv - (inv - rate) * (1 - 1 / seg.num_microbatches) ** seg.num_stages
    return rate


def _pipe_work_rate_many(inv_a, drain_a, inv_b, drain_b):
    """``_pipe_work_rate`` of many two-segment shapes at once, in the better of their two orders
    (numpy; per segment 1 / slowness and (1 - 1 / n) ** stages; an unused type: 0 and 1)."""
    import numpy as np

    held_a, held_b = inv_a * (1 - drain_a), inv_b * (1 - drain_b)  # each segment last, alone
    a_then_b = np.where(held_b >= inv_a, held_b, inv_a - (inv_a - held_b) * drain_a)
    b_then_a = np.where(held_a >= inv_b, held_a, inv_b - (inv_b - held_a) * drain_b)
    return np.maximum(a_then_b, b_then_a)


def _order_key(shape: tuple[Segment, ...]) -> tuple:
    return tuple((s.gpu, s.tp_degree, s.dp_degree, s.num_stages, s.rule, s.kind.micro_batch_size) for s in shape)


def _orders(shape: tuple[Segment, ...]) -> list[tuple[Segment, ...]]:
    """Larger-memory GPUs first (early 1F1B stages hold more micro-batches), and the reverse."""
    if len(shape) == 1:
        return [shape]
    first = tuple(sorted(shape, key=lambda s: (-get_gpu(s.gpu).memory_bytes, s.gpu)))
    return [first, first[::-1]]
