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
from sailor_core.simulator.memory import inflight_microbatches
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
        # Keyed by groups of kinds (the keys hold them): see _shape and _boundary.
        self._shapes: dict = {}
        self._boundaries: dict = {}
        self._stages: dict = {}

    def trim(self, max_entries: int = 1 << 17) -> None:
        """Forget memoised figures past a size (the instance outlives one search: see Searcher)."""
        for memo in (self._sync, self._p2p, self._pairs, self._stage_parts,
                     self._shapes, self._boundaries, self._stages):
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

    def _sync_s(self, sync_bytes: float, ring_key: tuple, ring: list[tuple[str, str]]) -> float:
        """``stage_dp_sync_s`` over ``ring`` ((zone, GPU) per replica; ``ring_key`` names it)."""
        key = (sync_bytes, ring_key)
        hit = self._sync.get(key)
        if hit is None:
            hit = self._sync[key] = st.stage_dp_sync_s(self.network, sync_bytes, ring)
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

    def _shape(self, groups: tuple[Group, ...], num_mb: int) -> tuple:
        """What a stage's figures need of its groups alone, whatever its layers: (dp degree,
        ((kind, micro-batches of the group's first replica), ...), the most micro-batches a
        replica gets (at least 1), the thinnest kind, the ring's key for ``_sync``, its (zone,
        GPU) per replica, USD per hour of each group, USD per byte of each ring hop that leaves
        a zone)."""
        d = sum(g[2] for g in groups)
        counts = []
        first_index = 0
        for _, _, n in groups:
            # Under m mod D a group's first (lowest-index) replica gets the most micro-batches,
            # so it alone decides the group's busy and steady-state time and its memory.
            counts.append(max(0, -(-(num_mb - first_index) // d)))
            first_index += n
        thinnest = min((g[0] for g in groups), key=lambda k: k.tp_degree)
        rent = tuple(n * kind.tp_degree * self.price(kind.gpu, zone) for kind, zone, n in groups)
        hop_usd_per_byte: tuple[float, ...] = ()
        if d > 1:
            zones = sorted({z for _, z, _ in groups})
            if len(zones) > 1:
                hop_usd_per_byte = tuple(self.network.egress_usd_per_byte(za, zb)
                                         for za, zb in zip(zones, zones[1:] + zones[:1]))
        hit = self._shapes[(groups, num_mb)] = (
            d, tuple((g[0], c) for g, c in zip(groups, counts)), max(1, *counts), thinnest,
            tuple((k.gpu, z, n) for k, z, n in groups), [(z, k.gpu) for k, z, n in groups for _ in range(n)],
            rent, hop_usd_per_byte,
        )
        return hit

    def _boundary(self, src: tuple[Group, ...], dst: tuple[Group, ...], num_mb: int) -> tuple:
        """What a stage boundary's figures need of the groups on its two sides alone: (the
        distinct (src, dst) endpoints of the replica pairs micro-batches travel between,
        micro-batches the busiest NIC carries, (micro-batches, USD per byte both ways) of each
        pair that leaves a zone, in ``_group_pairs`` order, or () when the same replicas per
        zone follow each other)."""
        net = self.network
        pairs = self._group_pairs(num_mb, src, dst)
        ends = {}
        for ga, gb in pairs:
            (ka, za, _), (kb, zb, _) = src[ga], dst[gb]
            ends[(ka.gpu, ka.tp_degree, za, kb.gpu, kb.tp_degree, zb)] = None
        crossing = []
        if not (len(src) == len(dst) and all(ga[1:] == gb[1:] for ga, gb in zip(src, dst))):
            # (else m mod D keeps every micro-batch in its zone)
            for (ga, gb), carried in pairs.items():
                za, zb = src[ga][1], dst[gb][1]
                if za != zb:
                    crossing.append((carried, net.egress_usd_per_byte(za, zb) + net.egress_usd_per_byte(zb, za)))
        d_src, d_dst = sum(g[2] for g in src), sum(g[2] for g in dst)
        hit = self._boundaries[(src, dst, num_mb)] = (
            tuple(ends), st.link_microbatches(num_mb, d_src, d_dst), tuple(crossing))
        return hit

    def _transfer_s(self, nbytes: int, ends: tuple) -> float:
        """``boundary_transfer_s`` of ``nbytes`` between (gpu, tp, zone) ``ends[:3]`` and ``ends[3:]``."""
        key = (nbytes, ends)
        hit = self._p2p.get(key)
        if hit is None:
            ga, ta, za, gb, tb, zb = ends
            hit = self._p2p[key] = st.boundary_transfer_s(
                self.network, nbytes, st.endpoint(za, ga, ta), st.endpoint(zb, gb, tb))
        return hit

    def _stage(self, stages, i: int, num_mb: int, regime: TrainingRegime, key: tuple, figures: bool) -> list:
        """Stage ``i``'s memo entry: [USD per hour of each group, USD per iteration of each ring
        hop and then each replica pair to the next stage that leaves a zone (in the order a
        plain walk meets them), ``evaluate``'s figures (None unless ``figures``): (its
        StageTiming, sync + update seconds, its link to the next stage (seconds per micro-batch,
        micro-batches the busiest NIC carries) or None, the most micro-batches a replica gets,
        the kind and micro-batches of each group's first replica, {stages from it to the
        pipeline's end: (peak bytes, fits)} that ``evaluate`` fills)]."""
        stage = stages[i]
        a, b, groups = stage.layer_start, stage.layer_end, stage.groups
        nxt = stages[i + 1].groups if i + 1 < len(stages) else None
        shape = self._shapes.get((groups, num_mb)) or self._shape(groups, num_mb)
        d, kinds_counts, most, thinnest, ring_key, ring, rent, hop_usd_per_byte = shape
        boundary = None
        if nxt is not None:
            boundary = self._boundaries.get((groups, nxt, num_mb)) or self._boundary(groups, nxt, num_mb)
        sync_bytes = st.dp_sync_bytes(thinnest.profile, a, b, regime) if d > 1 else 0.0
        egress: list[float] = []
        if hop_usd_per_byte:
            hop = 2 * (d - 1) / d * sync_bytes * thinnest.tp_degree
            egress.extend(hop * usd_per_byte for usd_per_byte in hop_usd_per_byte)
        nbytes = st.boundary_bytes(groups[0][0].profile, b) if boundary is not None else 0
        if boundary is not None and boundary[2]:
            egress.extend(carried * nbytes * usd_per_byte for carried, usd_per_byte in boundary[2])
        entry = self._stages[key] = [rent, tuple(egress), None]
        if not figures:
            return entry
        steps: list[float] = []
        fwds: list[float] = []
        counts: list[int] = []
        update = 0.0
        stage_parts = self._stage_parts
        for kind, count in kinds_counts:
            pkey = (id(kind.profile), a, b)
            parts = stage_parts.get(pkey)
            if parts is None:
                fwd, bwd = st.stage_compute_s(kind.profile, a, b)
                parts = stage_parts[pkey] = (fwd, bwd, st.stage_update_s(kind.profile, a, b))
            fwd, bwd, upd = parts
            update = max(update, upd)
            steps.append(fwd + bwd)
            fwds.append(fwd)
            counts.append(count)
        sync = self._sync_s(sync_bytes, ring_key, ring) if d > 1 else 0.0
        link = None
        if boundary is not None:
            worst_link = 0.0
            for ends in boundary[0]:
                worst_link = max(worst_link, self._transfer_s(nbytes, ends))
            link = (worst_link, boundary[1])
        entry[2] = (stage_timing(steps, counts, fwds), sync + update, link, most, kinds_counts, {})
        return entry

    def rent_and_egress(self, micro_batch_size: int, stages) -> tuple[float, float]:
        """(USD per hour of the GPUs, USD per iteration of cross-zone traffic) of a plan: exact
        from the split and placement alone, so the search can check a cost cap before timing it."""
        num_mb = self.gbs // micro_batch_size
        regime = self.regime_for(stages[0].groups[0][0])
        rname = regime.name
        memo = self._stages
        last = len(stages) - 1
        usd_per_hr = egress = 0.0
        # The terms are summed in the order of a plain walk over groups, ring hops and replica
        # pairs, so the sums are the same to the last bit however they are memoised.
        for i, stage in enumerate(stages):
            key = (stage.layer_start, stage.layer_end, stage.groups,
                   stages[i + 1].groups if i < last else None, num_mb, rname)
            entry = memo.get(key) or self._stage(stages, i, num_mb, regime, key, False)
            for usd in entry[0]:
                usd_per_hr += usd
            for usd in entry[1]:
                egress += usd
        return usd_per_hr, egress

    @staticmethod
    def _stage_memory(stage: FastStage, kinds_counts, depth: int, regime: TrainingRegime) -> tuple[int, bool]:
        """(peak bytes, fits) of a stage with ``depth`` = P - i stages from it to the pipeline's end."""
        a, b = stage.layer_start, stage.layer_end
        peak, fits = 0, True
        for kind, count in kinds_counts:
            # simulate's stage_memory, without its breakdown
            mem = kind.peak_bytes(a, b, inflight_microbatches(0, depth, count), regime)
            if mem > peak:
                peak = mem
            fits = fits and mem <= kind.capacity_bytes
        return peak, fits

    def evaluate(self, micro_batch_size: int, stages: list[FastStage]) -> FastResult:
        num_mb = self.gbs // micro_batch_size
        num_stages = len(stages)
        regime = self.regime_for(stages[0].groups[0][0])
        rname = regime.name
        memo = self._stages
        last = num_stages - 1
        timings = []
        link_s: list[float] = []
        link_counts: list[int] = []
        fits = True
        peak = 0
        end_part = 0.0
        usd_per_hr = egress = 0.0
        # Neighbouring candidates share about half their stages (layers, groups, next groups).
        for i, stage in enumerate(stages):
            key = (stage.layer_start, stage.layer_end, stage.groups,
                   stages[i + 1].groups if i < last else None, num_mb, rname)
            entry = memo.get(key)
            if entry is None or entry[2] is None:
                entry = self._stage(stages, i, num_mb, regime, key, True)
            timing, sync_update, link, most, kinds_counts, mems = entry[2]
            # A group's replicas hold min(P - i, their micro-batches) in flight: deeper is the same.
            depth = num_stages - i if num_stages - i < most else most
            mem = mems.get(depth)
            if mem is None:
                mem = mems[depth] = self._stage_memory(stage, kinds_counts, depth, regime)
            if mem[0] > peak:
                peak = mem[0]
            fits = fits and mem[1]
            timings.append(timing)
            end_part = max(end_part, sync_update)
            if link is not None:
                link_s.append(link[0])
                link_counts.append(link[1])
            # rent_and_egress's sums, in its order
            for usd in entry[0]:
                usd_per_hr += usd
            for usd in entry[1]:
                egress += usd
        pipe = one_f_one_b(timings, link_s, link_counts)
        iteration = pipe.compute_s + pipe.bubble_s + pipe.p2p_s + end_part
        return FastResult(
            iteration_time_s=iteration,
            throughput_samples_per_s=self.gbs / iteration if iteration > 0 else 0.0,
            usd_per_iteration=usd_per_hr * iteration / 3600.0 + egress,
            usd_per_hour=usd_per_hr,
            peak_memory_bytes=peak,
            fits=fits,
            busy_s=tuple([t.busy_s for t in timings]),
            compute_s=tuple([t.step_s for t in timings]),
        )
