"""``simulate`` for candidate plans, composed from the simulator's own building blocks.

The search evaluates thousands of plans whose stages hold many identical
replicas.  ``simulate`` walks every replica; this walks every *group* of
identical replicas (same GPU type, TP degree and zone) and memoises the
network answers, calling exactly the functions ``simulate`` sums
(``simulator.stage``, ``simulator.memory``, ``simulator.schedule``) in the same
way, so the figures agree to rounding; ``tests/planner`` checks that on random
plans, and ``plan_job`` re-runs ``simulate`` on every plan it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.network.model import NetworkModel
from sailor_core.planner.kinds import Kind
from sailor_core.regimes import TrainingRegime, get_regime
from sailor_core.simulator import stage as st
from sailor_core.simulator.memory import inflight_microbatches, stage_memory
from sailor_core.simulator.schedule import one_f_one_b, stage_timing

Group = tuple[Kind, str, int]  # (kind, zone, replicas), in replica order


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
                 regime: str | None) -> None:
        self.model = model
        self.gbs = global_batch_size
        self.network = network
        self.spot = spot
        self.regime_name = regime
        self._sync: dict = {}
        self._p2p: dict = {}
        self._pairs: dict = {}
        self._price: dict = {}
        # Keyed by id(profile): the profiles live as long as the kinds that hold them (the
        # KindCache this instance is kept with).
        self._stage_parts: dict = {}
        self._memory: dict = {}

    def trim(self, max_entries: int = 1 << 17) -> None:
        """Forget memoised figures past a size (the instance outlives one search: see Searcher)."""
        for memo in (self._sync, self._p2p, self._pairs, self._stage_parts, self._memory):
            if len(memo) > max_entries:
                memo.clear()

    def regime_for(self, first: Kind) -> TrainingRegime:
        # simulate: the plan's regime if it names one, else the first replica's profile regime.
        return get_regime(self.regime_name or first.profile.regime)

    def price(self, gpu: str, zone: str) -> float:
        key = (gpu, zone)
        p = self._price.get(key)
        if p is None:
            p = self._price[key] = gpu_price_usd_per_hr(gpu, zone, spot=self.spot)
        return p

    def _sync_s(self, sync_bytes: float, groups: tuple[Group, ...]) -> float:
        key = (sync_bytes, tuple((k.gpu, z, n) for k, z, n in groups))
        hit = self._sync.get(key)
        if hit is None:
            hit = self._sync[key] = st.stage_dp_sync_s(
                self.network, sync_bytes, [(z, k.gpu) for k, z, n in groups for _ in range(n)])
        return hit

    def _transfer_s(self, nbytes: int, a: Group, b: Group) -> float:
        key = (nbytes, a[0].gpu, a[0].tp_degree, a[1], b[0].gpu, b[0].tp_degree, b[1])
        hit = self._p2p.get(key)
        if hit is None:
            hit = self._p2p[key] = st.boundary_transfer_s(
                self.network, nbytes,
                st.endpoint(a[1], a[0].gpu, a[0].tp_degree),
                st.endpoint(b[1], b[0].gpu, b[0].tp_degree),
            )
        return hit

    def _group_pairs(self, num_mb: int, src: tuple[Group, ...], dst: tuple[Group, ...]) -> dict:
        """{(src group, dst group): micro-batches carried} under the m mod D routing."""
        if len(src) == 1 and len(dst) == 1:
            return {(0, 0): num_mb}
        key = (num_mb, tuple(g[2] for g in src), tuple(g[2] for g in dst))
        hit = self._pairs.get(key)
        if hit is None:
            src_of = [gi for gi, g in enumerate(src) for _ in range(g[2])]
            dst_of = [gi for gi, g in enumerate(dst) for _ in range(g[2])]
            hit = {}
            for (a, b), carried in st.p2p_pairs(num_mb, len(src_of), len(dst_of)).items():
                k = (src_of[a], dst_of[b])
                hit[k] = hit.get(k, 0) + carried
            self._pairs[key] = hit
        return hit

    def rent_and_egress(self, micro_batch_size: int, stages) -> tuple[float, float]:
        """(USD per hour of the GPUs, USD per iteration of cross-zone traffic) of a plan: exact
        from the split and placement alone, so the search can check a cost cap before timing it."""
        num_mb = self.gbs // micro_batch_size
        regime = self.regime_for(stages[0].groups[0][0])
        net = self.network
        usd_per_hr = egress = 0.0
        for i, stage in enumerate(stages):
            a, b = stage.layer_start, stage.layer_end
            d = stage.dp_degree
            for kind, zone, n in stage.groups:
                usd_per_hr += n * kind.tp_degree * self.price(kind.gpu, zone)
            if d > 1:
                zones = sorted({z for _, z, _ in stage.groups})
                if len(zones) > 1:
                    thinnest = min((g[0] for g in stage.groups), key=lambda k: k.tp_degree)
                    sync_bytes = st.dp_sync_bytes(thinnest.profile, a, b, regime)
                    hop = 2 * (d - 1) / d * sync_bytes * thinnest.tp_degree
                    for za, zb in zip(zones, zones[1:] + zones[:1]):
                        egress += hop * net.egress_usd_per_byte(za, zb)
            if i + 1 < len(stages):
                nxt = stages[i + 1]
                if len(stage.groups) == len(nxt.groups) and all(
                        ga[1:] == gb[1:] for ga, gb in zip(stage.groups, nxt.groups)):
                    continue  # the same replicas per zone: m mod D keeps every micro-batch in its zone
                nbytes = st.boundary_bytes(stage.groups[0][0].profile, b)
                for (ga, gb), carried in self._group_pairs(num_mb, stage.groups, nxt.groups).items():
                    za, zb = stage.groups[ga][1], nxt.groups[gb][1]
                    if za != zb:
                        egress += carried * nbytes * (net.egress_usd_per_byte(za, zb)
                                                      + net.egress_usd_per_byte(zb, za))
        return usd_per_hr, egress

    def evaluate(self, micro_batch_size: int, stages: list[FastStage]) -> FastResult:
        num_mb = self.gbs // micro_batch_size
        num_stages = len(stages)
        regime = self.regime_for(stages[0].groups[0][0])
        timings = []
        link_s: list[float] = []
        link_counts: list[int] = []
        fits = True
        peak = 0
        end_part = 0.0
        for i, stage in enumerate(stages):
            a, b = stage.layer_start, stage.layer_end
            d = stage.dp_degree
            steps: list[float] = []
            fwds: list[float] = []
            counts: list[int] = []
            update = 0.0
            first_index = 0
            for kind, zone, n in stage.groups:
                # Neighbouring candidates share most stages: memoise a stage's parts.
                key = (id(kind.profile), a, b)
                parts = self._stage_parts.get(key)
                if parts is None:
                    fwd, bwd = st.stage_compute_s(kind.profile, a, b)
                    parts = self._stage_parts[key] = (fwd, bwd, st.stage_update_s(kind.profile, a, b))
                fwd, bwd, upd = parts
                update = max(update, upd)
                # Under m mod D a group's first (lowest-index) replica gets the most micro-batches,
                # so it alone decides the group's busy and steady-state time and its memory.
                count = max(0, -(-(num_mb - first_index) // d))
                steps.append(fwd + bwd)
                fwds.append(fwd)
                counts.append(count)
                inflight = inflight_microbatches(i, num_stages, count)
                mkey = (id(kind.profile), a, b, inflight, regime.name, kind.capacity_bytes)
                mem = self._memory.get(mkey)
                if mem is None:
                    m = stage_memory(kind.profile, a, b, inflight, regime, kind.capacity_bytes)
                    mem = self._memory[mkey] = (m.peak_bytes, m.fits)
                peak = max(peak, mem[0])
                fits = fits and mem[1]
                first_index += n
            timings.append(stage_timing(steps, counts, fwds))
            thinnest = min((g[0] for g in stage.groups), key=lambda k: k.tp_degree)
            sync_bytes = st.dp_sync_bytes(thinnest.profile, a, b, regime)
            sync = self._sync_s(sync_bytes, stage.groups) if d > 1 else 0.0
            end_part = max(end_part, sync + update)
            if i + 1 < num_stages:
                nxt = stages[i + 1]
                nbytes = st.boundary_bytes(stage.groups[0][0].profile, b)
                worst_link = 0.0
                for (ga, gb), carried in self._group_pairs(num_mb, stage.groups, nxt.groups).items():
                    worst_link = max(worst_link, self._transfer_s(nbytes, stage.groups[ga], nxt.groups[gb]))
                link_s.append(worst_link)
                link_counts.append(st.link_microbatches(num_mb, d, nxt.dp_degree))
        usd_per_hr, egress = self.rent_and_egress(micro_batch_size, stages)
        pipe = one_f_one_b(timings, link_s, link_counts)
        iteration = pipe.compute_s + pipe.bubble_s + pipe.p2p_s + end_part
        return FastResult(
            iteration_time_s=iteration,
            throughput_samples_per_s=self.gbs / iteration if iteration > 0 else 0.0,
            usd_per_iteration=usd_per_hr * iteration / 3600.0 + egress,
            usd_per_hour=usd_per_hr,
            peak_memory_bytes=peak,
            fits=fits,
            busy_s=tuple(t.busy_s for t in timings),
            compute_s=tuple(t.step_s for t in timings),
        )
