"""``simulate`` for candidate plans: the same model, memoised.

The search evaluates thousands of plans whose stages hold many identical
replicas.  ``simulate`` walks every replica; this walks every *group* of
identical replicas (same GPU type, TP degree and zone) and calls the functions
``simulate`` calls: the routing rule (``plan.routing``), the per-stage blocks
(``simulator.stage``, ``simulator.memory``, ``simulator.pipeline_time``) and the
composition of time, egress and cost (``simulator.compose``).  It has no
formula of its own: it only memoises (network answers, per-stage parts, whole
results) and precomputes per-group tables.  One term per group instead of per
replica (rent, boundary crossings) and a stage's sync + update kept as one
memoised figure make the figures agree with ``simulate`` to rounding, not
always to the last bit; ``tests/planner/test_fastsim.py`` checks that on random
plans, and ``plan_job`` re-runs ``simulate`` on every plan it returns.

Neighbouring candidates share most of their stages, so what a stage needs of
its groups and its next stage's groups alone is memoised (``_Costs``,
``_Context``), and so is each stage's part of the result, per (layers, groups,
next groups).  Sums over a plan add the same terms in the same order as a plain
walk over its groups, ring hops and replica pairs, so every figure is the same
to the last bit as without the memos (``tests/planner/test_leaf_replay.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.network.model import NetworkModel
from sailor_core.plan import routing
from sailor_core.planner.kinds import Kind
from sailor_core.regimes import TrainingRegime
from sailor_core.simulator import compose
from sailor_core.simulator import stage as st
from sailor_core.simulator.levers import zero_shards, zero_sync_factor
from sailor_core.simulator.memory import dp_bucket_bytes, dp_synced_params, inflight_microbatches, peak_inputs
from sailor_core.simulator.tables import layer_table
from sailor_core.simulator.pipeline_time import one_f_one_b_time, stage_timing

Group = tuple[Kind, str, int]  # (kind, zone, replicas), in replica order

# A memoised candidate stage takes about 1.5 kB: past this many, start afresh (about 50 MB;
# a search of a few thousand candidates makes about 4 new stages each).
_MAX_STAGE_ENTRIES = 1 << 15
_MAX_PLAN_ENTRIES = 1 << 12  # whole results (see FastSim._plans)


# The memo records below are internal and never change once built; not frozen only because a
# frozen dataclass takes twice as long to build and the search builds thousands.
@dataclass(slots=True, kw_only=True)
class _Costs:
    """What a stage's rent and egress need of its groups and its next stage's, whatever its layers."""

    rent_usd_per_hr: tuple[float, ...]  # per group
    dp_degree: int
    thinnest: Kind  # the smallest TP degree: its GPU holds the most gradient
    hop_usd_per_byte: tuple[float, ...]  # per ring hop that leaves a zone
    crossing: tuple[tuple[int, float], ...]  # (micro-batches, USD per byte both ways) per pair leaving a zone


@dataclass(slots=True, kw_only=True)
class _Context:
    """What a stage's times and memory need of its groups and its next stage's, whatever its layers."""

    costs: _Costs
    kinds_counts: tuple[tuple[Kind, int], ...]  # each group's kind, micro-batches of its first replica
    # the distinct ones, first seen first: a stage's groups in several zones mostly share their
    # kind and count, and its memory (the largest peak, all fit) depends on these alone
    distinct_kinds_counts: tuple[tuple[Kind, int], ...]
    counts: tuple[int, ...]
    most_microbatches: int  # the most a replica gets, at least 1
    ring: tuple[tuple[tuple[str, str, int], int], ...]  # ((zone, gpu, TP degree), replicas) runs (stage.member_runs)
    link_ends: tuple[tuple, ...]  # distinct (gpu, tp, zone, gpu, tp, zone) the next boundary uses
    link_microbatches: int  # micro-batches the busiest NIC on it carries


@dataclass(frozen=True, slots=True)
class FastStage:
    layer_start: int
    layer_end: int
    groups: tuple[Group, ...]

    @property
    def dp_degree(self) -> int:
        return sum(g[2] for g in self.groups)


@dataclass(frozen=True, slots=True)
class FastResult:
    iteration_time_s: float
    throughput_samples_per_s: float
    usd_per_iteration: float
    usd_per_hour: float
    peak_memory_bytes: int
    fits: bool
    busy_s: tuple[float, ...]  # per stage: micro-batches of its busiest replica x straggler time
    compute_s: tuple[float, ...]  # per stage: straggler forward + backward per micro-batch


class FastSim:
    """Evaluates candidate plans of one model, batch and regime (see module docstring)."""

    def __init__(self, *, model: str, global_batch_size: int, network: NetworkModel, spot: bool,
                 regime: str | None, shared: FastSim | None = None) -> None:
        """``shared``: the FastSim of the same model, batch, network, spot and regime on kinds of
        another lever setting, whose figures of the network and prices alone (keyed by bytes,
        zones, GPU types and counts, never by kind) this one takes as its own."""
        self.model = model
        self.gbs = global_batch_size
        self.network = network
        self.spot = spot
        self.regime_name = regime
        self._tied: dict = {}  # (first stage's groups, last stage's, regime) -> embedding group's sum
        # (sync bytes, ring) -> DP sync s; (bytes, ends, partitioned) -> boundary s; routing; prices
        self._sync: dict = shared._sync if shared is not None else {}
        self._p2p: dict = shared._p2p if shared is not None else {}
        self._pairs: dict = shared._pairs if shared is not None else {}
        self._price: dict = shared._price if shared is not None else {}
        # Keyed by kind (it holds the profile): (forward, backward, update) per layer range.
        self._stage_parts: dict = {}
        # Keyed by groups of kinds (the keys hold them).
        self._costs: dict = {}
        self._contexts: dict = {}
        # Keyed by (layers, groups, next groups, micro-batches, regime): a stage of a candidate.
        self._stage_costs_memo: dict = {}
        self._stages: dict = {}
        # Keyed by (kind, layers, what of in flight, micro-batches and DP degree it depends on
        # (memory.peak_inputs), regime): one GPU's peak bytes, which stages of other groups
        # (zones, neighbours, DP degrees) holding the same kind share.
        self._peaks: dict = {}
        # Keyed by (micro-batch size, stages): recent whole results, which a request's searches
        # meet again (a sub-search's plans offered to the main search, the final polish) and
        # so do the next requests of a replay; kept few, as each holds its stages for the collector.
        self._plans: dict = {}

    def trim(self, max_entries: int = 1 << 17) -> None:
        """Forget memoised figures past a size (the instance outlives one search: see Searcher)."""
        for memo in (self._sync, self._tied, self._p2p, self._pairs, self._stage_parts, self._costs, self._contexts,
                     self._stage_costs_memo, self._stages, self._peaks):
            if len(memo) > max_entries:
                memo.clear()

    def regime_for(self, first: Kind) -> TrainingRegime:
        return compose.job_regime(self.regime_name, first.profile)

    def price(self, gpu: str, zone: str) -> float:
        key = (gpu, zone)
        p = self._price.get(key)
        if p is None:
            p = self._price[key] = gpu_price_usd_per_hr(gpu, zone, spot=self.spot)
        return p

    def _sync_s(self, sync_bytes: float, ring: tuple[tuple[tuple[str, str, int], int], ...]) -> float:
        """``stage_dp_sync_s`` over a ring of ((zone, gpu, TP degree), replicas) runs."""
        key = (sync_bytes, ring)
        hit = self._sync.get(key)
        if hit is None:
            hit = self._sync[key] = st.stage_dp_sync_runs_s(self.network, sync_bytes, ring)
        return hit

    def _tied_sum(self, first: tuple[Group, ...], last: tuple[Group, ...], regime: TrainingRegime,
              ) -> tuple[float, tuple[float, ...]]:
        """``simulate``'s embedding group sum of a plan whose first and last stages have these
        groups: its seconds (``stage.tied_sync_s``) and egress terms (``stage.tied_sync_egress_terms``)."""
        key = (first, last, regime.name)
        hit = self._tied.get(key)
        if hit is None:
            groups = (*first, *last)
            thinnest = min(groups, key=lambda g: g[0].tp_degree)[0]
            tied_bytes = st.tied_sync_bytes(thinnest.profile, regime)
            ring = st.member_runs([((zone, kind.gpu, kind.tp_degree), n) for kind, zone, n in groups])
            hit = self._tied[key] = (st.tied_sync_runs_s(self.network, tied_bytes, ring),
                                     tuple(st.tied_sync_egress_runs_terms(self.network, tied_bytes, ring)))
        return hit

    def _transfer_s(self, nbytes: int, ends: tuple, partitioned: bool) -> float:
        """``boundary_transfer_s`` of ``nbytes`` between (gpu, tp, zone) ``ends[:3]`` and ``ends[3:]``."""
        key = (nbytes, ends, partitioned)
        hit = self._p2p.get(key)
        if hit is None:
            ga, ta, za, gb, tb, zb = ends
            hit = self._p2p[key] = st.boundary_transfer_s(
                self.network, nbytes, st.endpoint(za, ga, ta), st.endpoint(zb, gb, tb), partitioned=partitioned)
        return hit

    def _group_pairs(self, num_mb: int, src: tuple[Group, ...], dst: tuple[Group, ...]) -> dict:
        """{(src group, dst group): micro-batches carried} under the m mod D routing."""
        if len(src) == 1 and len(dst) == 1:  # O(1) in routing: not worth a memo entry
            return routing.group_p2p_pairs(num_mb, (src[0][2],), (dst[0][2],))
        key = (num_mb, tuple([g[2] for g in src]), tuple([g[2] for g in dst]))
        hit = self._pairs.get(key)
        if hit is None:
            hit = self._pairs[key] = routing.group_p2p_pairs(num_mb, key[1], key[2])
        return hit

    def _costs_of(self, groups: tuple[Group, ...], nxt: tuple[Group, ...] | None, num_mb: int) -> _Costs:
        net = self.network
        crossing = []
        if nxt is not None:
            crossing = compose.boundary_crossings(net, [
                (carried, groups[ga][1], nxt[gb][1])
                for (ga, gb), carried in self._group_pairs(num_mb, groups, nxt).items()])
        costs = self._costs[(groups, nxt, num_mb)] = _Costs(
            rent_usd_per_hr=tuple(compose.rent_usd_per_hr(n * kind.tp_degree, self.price(kind.gpu, zone))
                                  for kind, zone, n in groups),
            dp_degree=sum(g[2] for g in groups),
            thinnest=min((g[0] for g in groups), key=lambda k: k.tp_degree),
            hop_usd_per_byte=tuple(compose.ring_hop_usd_per_byte(net, [z for _, z, _ in groups])),
            crossing=tuple(crossing),
        )
        return costs

    def _context(self, groups: tuple[Group, ...], nxt: tuple[Group, ...] | None, num_mb: int) -> _Context:
        key = (groups, nxt, num_mb)
        costs = self._costs.get(key) or self._costs_of(groups, nxt, num_mb)
        d = costs.dp_degree
        counts = []
        first_index = 0
        for _, _, n in groups:
            # Under m mod D a group's first (lowest-index) replica gets the most micro-batches,
            # so it alone decides the group's busy and steady-state time and its memory.
            counts.append(routing.replica_num_microbatches(num_mb, d, first_index))
            first_index += n
        ends: dict = {}
        link_microbatches = 0
        if nxt is not None:
            for ga, gb in self._group_pairs(num_mb, groups, nxt):
                (ka, za, _), (kb, zb, _) = groups[ga], nxt[gb]
                ends[(ka.gpu, ka.tp_degree, za, kb.gpu, kb.tp_degree, zb)] = None
            link_microbatches = routing.link_microbatches(num_mb, d, sum(g[2] for g in nxt))
        kinds_counts = tuple((g[0], c) for g, c in zip(groups, counts))
        ctx = self._contexts[key] = _Context(
            costs=costs,
            kinds_counts=kinds_counts,
            distinct_kinds_counts=tuple(dict.fromkeys(kinds_counts)),
            counts=tuple(counts),
            most_microbatches=max(1, *counts),
            ring=st.member_runs([((z, k.gpu, k.tp_degree), n) for k, z, n in groups]),
            link_ends=tuple(ends),
            link_microbatches=link_microbatches,
        )
        return ctx

    @staticmethod
    def _egress_terms(costs: _Costs, stage: FastStage, regime: TrainingRegime,
                      sync_bytes: float | None = None) -> tuple[float, ...]:
        """``compose.stage_egress_terms`` of a stage (its byte counts looked up only when a
        ring hop or a boundary route leaves a zone; ``sync_bytes``: its ``dp_sync_bytes`` if known)."""
        hop_bytes = 0.0
        if costs.hop_usd_per_byte:
            thinnest = costs.thinnest
            if sync_bytes is None:
                sync_bytes = st.dp_sync_bytes(thinnest.profile, stage.layer_start, stage.layer_end, regime)
            hop_bytes = compose.ring_hop_bytes(costs.dp_degree, sync_bytes, thinnest.tp_degree)
            factor = zero_sync_factor(thinnest.zero_stage, regime)
            if factor != 1.0:  # simulate's _dp_ring
                hop_bytes *= factor
        nbytes = st.boundary_bytes(stage.groups[0][0].profile, stage.layer_end) if costs.crossing else 0
        return tuple(compose.stage_egress_terms(hop_bytes, costs.hop_usd_per_byte, nbytes, costs.crossing))

    def _stage_costs(self, stage: FastStage, nxt: tuple[Group, ...] | None, num_mb: int,
                     regime: TrainingRegime, key: tuple, costs: _Costs | None = None,
                     sync_bytes: float | None = None) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(USD per hour of each group, ``_egress_terms``) of a stage, memoised under ``key``."""
        if costs is None:
            groups = stage.groups
            costs = self._costs.get((groups, nxt, num_mb)) or self._costs_of(groups, nxt, num_mb)
        egress = self._egress_terms(costs, stage, regime, sync_bytes) if costs.hop_usd_per_byte or costs.crossing else ()
        memo = self._stage_costs_memo
        if len(memo) >= _MAX_STAGE_ENTRIES:
            memo.clear()
        hit = memo[key] = (costs.rent_usd_per_hr, egress)
        return hit

    def rent_and_egress(self, micro_batch_size: int, stages) -> tuple[float, float]:
        """(USD per hour of the GPUs, USD per iteration of cross-zone traffic) of a plan: exact
        from the split and placement alone, so the search can check a cost cap before timing it."""
        num_mb = self.gbs // micro_batch_size
        regime = self.regime_for(stages[0].groups[0][0])
        rname = regime.name
        memo = self._stage_costs_memo
        last = len(stages) - 1
        rents = []
        egress = []
        for i, stage in enumerate(stages):
            nxt = stages[i + 1].groups if i < last else None
            key = (stage.layer_start, stage.layer_end, stage.groups, nxt, num_mb, rname)
            rent, egress_terms = memo.get(key) or self._stage_costs(stage, nxt, num_mb, regime, key)
            rents.append(rent)
            egress.append(egress_terms)
        if last > 0:  # the embedding group's sum, after the stages' terms as in simulate
            egress.append(self._tied_sum(stages[0].groups, stages[last].groups, regime)[1])
        return compose.add_in_order(rents), compose.add_in_order(egress)

    def _stage(self, stage: FastStage, depth: int, regime: TrainingRegime, key: tuple) -> tuple:
        """A stage's part of ``evaluate`` (``key``: see there): (its USD per hour per group, its
        egress terms (see ``_egress_terms``), its StageTiming, sync + update seconds, its link to
        the next stage (seconds per micro-batch, micro-batches the busiest NIC carries, bytes its
        slowest pair moves) or None, its context, {stages from it to the pipeline's end: (peak
        bytes, fits)}, filled here for ``depth`` and by ``evaluate`` for others, its DP ring as
        it meets its last sends: ``stage.overlapped_dp_ring``)."""
        a, b, groups, nxt, num_mb, _ = key
        ctx = self._contexts.get((groups, nxt, num_mb)) or self._context(groups, nxt, num_mb)
        steps: list[float] = []
        fwds: list[float] = []
        update = 0.0
        stage_parts = self._stage_parts
        costs = ctx.costs
        zero = groups[0][0].zero_stage if costs.dp_degree > 1 else 0
        opt_shards = zero_shards(zero, costs.dp_degree)
        for kind, _ in ctx.kinds_counts:
            pkey = (kind, a, b) if opt_shards == 1 else (kind, a, b, opt_shards)
            parts = stage_parts.get(pkey)
            if parts is None:
                fwd, bwd = st.stage_compute_s(kind.profile, a, b)
                parts = stage_parts[pkey] = (fwd, bwd, st.stage_update_s(kind.profile, a, b, opt_shards))
            fwd, bwd, upd = parts
            update = max(update, upd)
            steps.append(fwd + bwd)
            fwds.append(fwd)
        sync = 0.0
        ring = (0.0, 0.0)
        sync_bytes = None
        if costs.dp_degree > 1:
            sync_bytes = st.dp_sync_bytes(costs.thinnest.profile, a, b, regime)
            sync = self._sync_s(sync_bytes, ctx.ring)
            factor = zero_sync_factor(zero, regime)
            if factor != 1.0:  # simulate's _dp_ring
                sync *= factor
            tp = costs.thinnest.tp_degree
            ring = st.overlapped_dp_ring(sync, sync_bytes, costs.dp_degree,
                                         tp if all(g[0].tp_degree == tp for g in groups) else None)
        link = None
        if nxt is not None:
            nbytes = st.boundary_bytes(groups[0][0].profile, b)
            worst_link = worst_bytes = 0.0
            partitioned = compose.partitions_boundaries(regime)
            for ends in ctx.link_ends:
                t = self._transfer_s(nbytes, ends, partitioned)
                if t >= worst_link:  # simulate's _boundary: the slowest pair, the most bytes of equals
                    wire = st.boundary_wire_bytes(nbytes, ends[1], ends[4])
                    if t > worst_link or wire > worst_bytes:
                        worst_link, worst_bytes = t, wire
            link = (worst_link, ctx.link_microbatches, worst_bytes)
        rent, egress = (self._stage_costs_memo.get(key)
                        or self._stage_costs(stage, nxt, num_mb, regime, key, costs, sync_bytes))
        memo = self._stages
        if len(memo) >= _MAX_STAGE_ENTRIES:
            memo.clear()
        entry = memo[key] = (rent, egress, stage_timing(steps, ctx.counts, fwds),
                             compose.stage_end_s(sync, update), link, ctx, {}, ring)
        return entry

    def _stage_memory(self, stage: FastStage, ctx: _Context, depth: int, regime: TrainingRegime) -> tuple[int, bool]:
        """(peak bytes, fits) of a stage whose replicas run ``depth - 1`` warm-up forwards at most
        (``memory.inflight_microbatches``: P - i stages to the pipeline's end, more beside a
        wider stage)."""
        a, b = stage.layer_start, stage.layer_end
        dp = ctx.costs.dp_degree
        peak, fits = 0, True
        peaks = self._peaks
        if len(peaks) >= _MAX_STAGE_ENTRIES:
            peaks.clear()
        for kind, count in ctx.distinct_kinds_counts:
            inflight = inflight_microbatches(0, depth, count)
            key = (kind, a, b, peak_inputs(inflight, count, dp, kind.zero_stage), id(regime))
            hit = peaks.get(key)
            if hit is not None and hit[0] is regime:
                mem = hit[1]
            else:
                # simulate's stage_memory, without its breakdown
                mem = kind.peak_bytes(a, b, inflight, regime, count, dp)
                if dp > 1:
                    mem += dp_bucket_bytes(dp_synced_params(layer_table(kind.profile), a, b), regime, dp,
                                           kind.zero_stage)
                peaks[key] = (regime, mem)
            if mem > peak:
                peak = mem
            fits = fits and mem <= kind.capacity_bytes
        return peak, fits

    def evaluate(self, micro_batch_size: int, stages: list[FastStage]) -> FastResult:
        key = (micro_batch_size, tuple(stages))
        hit = self._plans.get(key)
        if hit is None:
            if len(self._plans) >= _MAX_PLAN_ENTRIES:
                self._plans.clear()
            hit = self._plans[key] = self._evaluate(micro_batch_size, stages)
        return hit

    def _evaluate(self, micro_batch_size: int, stages: list[FastStage]) -> FastResult:
        num_mb = self.gbs // micro_batch_size
        num_stages = len(stages)
        regime = self.regime_for(stages[0].groups[0][0])
        rname = regime.name
        memo = self._stages
        last = num_stages - 1
        timings = []
        link_s: list[float] = []
        link_counts: list[int] = []
        links = []
        rings: list[tuple[float, float]] = []
        fits = True
        peak = 0
        ends: list[float] = []
        rents = []
        egress = []
        widest = 1
        for stage in stages:
            d = stage.dp_degree
            if d > widest:
                widest = d
        for i, stage in enumerate(stages):
            key = (stage.layer_start, stage.layer_end, stage.groups,
                   stages[i + 1].groups if i < last else None, num_mb, rname)
            entry = memo.get(key) or self._stage(stage, num_stages - i, regime, key)
            rent, egress_terms, timing, end, link, ctx, mems, ring = entry
            # A group's replicas hold min(their warm-up + 1, their micro-batches) in flight: the
            # warm-up is P - i - 1 of the widest stage's micro-batches; deeper is the same.
            depth = int((num_stages - i - 1) * (widest / ctx.costs.dp_degree)) + 1
            if depth > ctx.most_microbatches:
                depth = ctx.most_microbatches
            mem = mems.get(depth)
            if mem is None:
                mem = mems[depth] = self._stage_memory(stage, ctx, depth, regime)
            if mem[0] > peak:
                peak = mem[0]
            fits = fits and mem[1]
            timings.append(timing)
            ends.append(end)
            rings.append(ring)
            if link is not None:
                link_s.append(link[0])
                link_counts.append(link[1])
                links.append(link)
            rents.append(rent)
            egress.append(egress_terms)
        if num_stages > 1:  # the embedding group's sum ends the first and the last stage
            tied, tied_egress = self._tied_sum(stages[0].groups, stages[last].groups, regime)
            egress.append(tied_egress)  # after the stages' terms, as in simulate
            if tied > 0:
                ends[0] += tied
                ends[last] += tied
        schedule = compose.p2p_schedule(regime)
        pipe = one_f_one_b_time(timings, link_s, link_counts, schedule, split=False,
                           drain_delay_s=compose.drain_contention_s(schedule, links, rings))
        # The slowest stage's end as one memoised figure (compose.iteration_s)
        iteration = compose.iteration_s(pipe, ends[compose.slowest_end(ends)])
        usd_per_hr = compose.add_in_order(rents)
        return FastResult(
            iteration_time_s=iteration,
            throughput_samples_per_s=compose.throughput_samples_per_s(self.gbs, iteration),
            usd_per_iteration=compose.usd_per_iteration(compose.gpu_usd_per_iteration(usd_per_hr, iteration),
                                                        compose.add_in_order(egress)),
            usd_per_hour=usd_per_hr,
            peak_memory_bytes=peak,
            fits=fits,
            busy_s=tuple([t.busy_s for t in timings]),
            compute_s=tuple([t.step_s for t in timings]),
        )
