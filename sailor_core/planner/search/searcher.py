"""One planning run: the request's GPUs, the segment lists, placing and splitting shapes, and
evaluating, offering and polishing plans (the best-first loop that drives it is ``loop``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan, Replica, Stage
from sailor_core.planner.fastsim import FastResult, FastSim, FastStage
from sailor_core.planner.kinds import Kind, shared_kind_cache, valid_tp_degrees
from sailor_core.planner.placement import StagePlacement, place_pipelines, place_stages
from sailor_core.planner.request import Objective, PlanRequest
from sailor_core.planner.search.bounds import granular_busiest_s
from sailor_core.planner.search.memo import process_memo
from sailor_core.planner.search.shapes import Segment, d_grid, largest_divisor_at_most, order_key, stages_key
from sailor_core.planner.split import StageSlot, busiest_s, min_max_split
from sailor_core.simulator.memory import inflight_microbatches
from sailor_core.simulator.tables import layer_table


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
    num_disagreements: int = 0  # returned plans whose fastsim figures differ from simulate's
    num_splits: int = 0  # min-max splits computed (a split costs about a quarter of an evaluation)
    fitting: list[Evaluated] = field(default_factory=list)

    @property
    def work(self) -> int:
        """What the evaluation budget counts: evaluations, and splits at four to one."""
        return self.num_evaluated + self.num_splits // 4


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
                    ds = set(d_grid(d_max))
                else:
                    ds = {d_max}
                ds.add(largest_divisor_at_most(num_mb, d_max))
                one_zone = min(d_max, zone_max)
                ds.add(one_zone)
                ds.add(largest_divisor_at_most(num_mb, one_zone))
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
        key = order_key(shape)
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
        key = (mbs, order_key(shape))
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



def better(a: Evaluated, b: Evaluated) -> bool:
    """Feasible beats infeasible; fitting beats not fitting; then the score."""
    return (not a.feasible, not a.res.fits, a.score) < (not b.feasible, not b.res.fits, b.score)
