"""``simulate(plan)``: iteration time by named parts, peak memory, cost and throughput of a plan.

Read top to bottom: ``simulate`` walks the stages; for each, ``_stage_replicas`` evaluates
its replicas (forward + backward per micro-batch, optimizer step, memory with its micro-batches
in flight), ``_dp_ring`` its gradient all-reduce and ``_boundary`` the link to the next stage
(activation forward, gradient back, over the replica pairs the routing rule uses).  The 1F1B
pipeline time follows from those (``pipeline_time``), and ``compose`` turns pipeline, slowest
sync + update, rent and egress into the iteration's time, cost and throughput: the same
functions the planner's fast path calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sailor_core.catalog.gpus import get_gpu, normalize_gpu_name
from sailor_core.catalog.models import get_model, tp_split_problem
from sailor_core.errors import InputError, PlanError
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.network.model import NetworkModel, default_network
from sailor_core.profiles import default_profile_db
from sailor_core.plan import routing
from sailor_core.plan.types import (RECOMPUTE_MODES, RECOMPUTE_NONE, ZERO_STAGES, Plan, Replica, Stage,
                                    validate_plan)
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime, get_regime
from sailor_core.simulator import compose
from sailor_core.simulator import stage as st
from sailor_core.simulator.levers import recomputed_profile, zero_shards, zero_sync_factor
from sailor_core.simulator.memory import MemoryBreakdown, inflight_microbatches, stage_memory
from sailor_core.simulator.result import ReplicaResult, SimResult, StageResult
from sailor_core.simulator.pipeline_time import StageTiming, one_f_one_b_time, stage_timing
from sailor_core.simulator.tables import layer_table


class ProfileSource(Protocol):
    def get(self, model: str, gpu: str, tp_degree: int, micro_batch_size: int,
            seq_len: int | None = None, *, regime: str | None = None) -> ModelProfile: ...


def _default_profiles() -> ProfileSource:
    return default_profile_db()


@dataclass(frozen=True, slots=True, kw_only=True)
class _PlanProfiles:
    """A plan's profiles, all under its regime, fetched once per (GPU, TP degree)."""

    source: ProfileSource
    model: str
    micro_batch_size: int
    seq_len: int
    regime: TrainingRegime
    fetched: dict[tuple[str, int], ModelProfile]

    def of(self, gpu: str, tp_degree: int) -> ModelProfile:
        p = self.fetched.get((gpu, tp_degree))
        if p is None:
            p = self.fetched[(gpu, tp_degree)] = self.source.get(
                self.model, gpu, tp_degree, self.micro_batch_size, self.seq_len, regime=self.regime.name)
        return p


def _plan_profiles(plan: Plan, source: ProfileSource) -> _PlanProfiles:
    # One job runs under one regime (compose.job_regime), which the first replica's profile
    # decides unless the plan names one.
    seq_len = plan.effective_seq_len()
    first = plan.stages[0].replicas[0]
    first_profile = source.get(plan.model, first.gpu, first.tp_degree, plan.micro_batch_size, seq_len,
                               regime=plan.regime)
    return _PlanProfiles(
        source=source, model=plan.model, micro_batch_size=plan.micro_batch_size, seq_len=seq_len,
        regime=compose.job_regime(plan.regime, first_profile),
        fetched={(first.gpu, first.tp_degree): first_profile},
    )


def simulate(
    plan: Plan,
    *,
    profiles: ProfileSource | None = None,
    network: NetworkModel | None = None,
    spot: bool = True,
    validate: bool = True,
) -> SimResult:
    """Simulate one training iteration of ``plan`` (see the module docstring).

    Raises PlanError for an invalid plan and ProfileError when a (GPU, TP, micro-batch)
    has neither a profile nor an estimate.
    """
    if validate:
        validate_plan(plan)
    looked_up = _plan_profiles(plan, profiles if profiles is not None else _default_profiles())
    network = network if network is not None else default_network()
    stages: list[StageResult] = []
    timings: list[StageTiming] = []
    link_s: list[float] = []
    link_counts: list[int] = []
    links: list[tuple[float, int, float]] = []  # (seconds, busiest NIC's micro-batches, bytes)
    rings: list[tuple[float, float]] = []  # DP rings beside the stages' last sends
    egress_terms: list[list[float]] = []
    tied_s, tied_egress = _tied_ring(looked_up, network, plan)
    last_index = len(plan.stages) - 1
    for i in range(len(plan.stages)):
        result, timing, egress, link, ring = _simulate_stage(looked_up, network, plan, i,
                                                             tied_s if i in (0, last_index) else 0.0)
        stages.append(result)
        timings.append(timing)
        egress_terms.append(egress)
        rings.append(ring)
        if link is not None:
            link_s.append(link[0])
            link_counts.append(link[1])
            links.append(link)
    egress_terms.append(tied_egress)  # after the stages' (the planner adds them in this order)

    schedule = compose.p2p_schedule(looked_up.regime)
    pipe = one_f_one_b_time(timings, link_s, link_counts, schedule,
                       drain_delay_s=compose.drain_contention_s(schedule, links, rings))
    last = stages[compose.slowest_end([compose.stage_end_s(s.dp_sync_s, s.update_s) for s in stages])]
    iteration_s = compose.iteration_s(pipe, last.dp_sync_s, last.update_s)
    usd_per_hour = compose.add_in_order(
        [compose.rent_usd_per_hr(rep.tp_degree, gpu_price_usd_per_hr(rep.gpu, rep.zone, spot=rep.on_spot(spot)))
         for rep in stage.replicas] for stage in plan.stages)
    gpu_usd = compose.gpu_usd_per_iteration(usd_per_hour, iteration_s)
    egress_usd = compose.add_in_order(egress_terms)
    why_not = _why_not(stages)
    samples_per_s = compose.throughput_samples_per_s(plan.global_batch_size, iteration_s)
    return SimResult(
        iteration_time_s=iteration_s,
        breakdown=compose.iteration_breakdown(pipe, last.dp_sync_s, last.update_s),
        throughput_samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * looked_up.seq_len,
        usd_per_iteration=compose.usd_per_iteration(gpu_usd, egress_usd),
        usd_per_hour=usd_per_hour,
        gpu_usd_per_iteration=gpu_usd,
        egress_usd_per_iteration=egress_usd,
        peak_memory_bytes=max(s.peak_memory_bytes for s in stages),
        fits=why_not is None,
        why_not=why_not,
        bottleneck=pipe.bottleneck,
        num_gpus=plan.num_gpus,
        num_microbatches=plan.num_microbatches,
        global_batch_size=plan.global_batch_size,
        seq_len=looked_up.seq_len,
        regime=looked_up.regime.name,
        stages=tuple(stages),
    )


def _simulate_stage(looked_up: _PlanProfiles, network: NetworkModel, plan: Plan, index: int, tied_s: float = 0.0,
                    ) -> tuple[StageResult, StageTiming, list[float], tuple[float, int, float] | None,
                               tuple[float, float]]:
    """Stage ``index`` of ``plan``: its result, itself as a pipeline resource, the USD per
    iteration of what it sends across zones (``compose.stage_egress_terms``), its link to
    the next stage (seconds per micro-batch, micro-batches the busiest NIC carries, bytes the
    slowest pair moves per micro-batch) or None, and its DP ring as it meets its last sends
    (``stage.overlapped_dp_ring``); ``tied_s``: the embedding group's sum it takes part in
    (``_tied_ring``)."""
    stage = plan.stages[index]
    num_mb = plan.num_microbatches
    counts = routing.microbatches_per_replica(num_mb, stage.dp_degree)
    widest = max(s.dp_degree for s in plan.stages)
    replicas, steps, fwds = _stage_replicas(looked_up, stage, index, len(plan.stages), counts,
                                            widest / stage.dp_degree)
    sync_s, sync_bytes, hop_bytes, hop_usd, ring = _dp_ring(looked_up, network, stage)
    sync_s += tied_s
    p2p_s, p2p_bytes, crossings, link = 0.0, 0, [], None
    if index + 1 < len(plan.stages):
        nxt = plan.stages[index + 1]
        p2p_s, p2p_bytes, crossings, busiest, wire_bytes = _boundary(looked_up, network, stage, nxt, num_mb)
        link = (p2p_s, busiest, wire_bytes)
    straggler = 0
    for r in range(1, len(steps)):
        if steps[r] > steps[straggler]:
            straggler = r
    update_s = 0.0
    for rep in replicas:
        if rep.update_s > update_s:
            update_s = rep.update_s
    result = StageResult(
        index=index, layer_start=stage.layer_start, layer_end=stage.layer_end, replicas=replicas,
        straggler=straggler, compute_s_per_microbatch=steps[straggler], num_microbatches=max(counts),
        p2p_s_per_microbatch=p2p_s, p2p_bytes_per_microbatch=p2p_bytes,
        dp_sync_s=sync_s, dp_sync_bytes=sync_bytes, update_s=update_s,
    )
    egress = compose.stage_egress_terms(hop_bytes, hop_usd, p2p_bytes, crossings)
    return result, stage_timing(steps, counts, fwds), egress, link, ring


def _stage_replicas(looked_up: _PlanProfiles, stage: Stage, index: int, num_stages: int, counts: list[int],
                    lookahead_scale: float = 1.0,
                    ) -> tuple[tuple[ReplicaResult, ...], list[float], list[float]]:
    """Each replica's result, its forward + backward and its forward of one micro-batch
    (``lookahead_scale``: see ``memory.inflight_microbatches``)."""
    start, end = stage.layer_start, stage.layer_end
    replicas: list[ReplicaResult] = []
    steps: list[float] = []
    fwds: list[float] = []
    # Replicas of one (GPU, TP) holding the same number of micro-batches are identical: evaluate
    # once; results are frozen, so identical replicas share one.
    same: dict[tuple[str, int, int], tuple] = {}
    results: dict[tuple[Replica, int, int], ReplicaResult] = {}
    opt_shards = zero_shards(stage.zero_stage, stage.dp_degree)
    for r, rep in enumerate(stage.replicas):
        inflight = inflight_microbatches(index, num_stages, counts[r], lookahead_scale)
        # A replica holding no more micro-batches than in flight runs no forward beside gradients.
        key = (rep.gpu, rep.tp_degree, inflight, counts[r] > inflight)
        known = same.get(key)
        if known is None:
            prof = recomputed_profile(looked_up.of(rep.gpu, rep.tp_degree), stage.recompute)
            table = layer_table(prof)
            mem = stage_memory(prof, start, end, inflight, looked_up.regime, get_gpu(rep.gpu).memory_bytes,
                               stage.dp_degree, counts[r], stage.zero_stage)
            known = same[key] = (
                prof, table.fwd_s(start, end), table.bwd_s(start, end),
                st.stage_update_s(prof, start, end, opt_shards), mem, table.measured(start, end),
            )
        prof, fwd, bwd, upd, mem, measured = known
        steps.append(fwd + bwd)
        fwds.append(fwd)
        rkey = (rep, counts[r], inflight)
        result = results.get(rkey)
        if result is None:
            result = results[rkey] = ReplicaResult(
                gpu=rep.gpu, tp_degree=rep.tp_degree, zone=rep.zone, num_microbatches=counts[r],
                fwd_s=fwd, bwd_s=bwd, update_s=upd, memory=mem, profile_source=prof.source,
                measured=measured,
            )
        replicas.append(result)
    return tuple(replicas), steps, fwds


def _dp_ring(looked_up: _PlanProfiles, network: NetworkModel, stage: Stage,
             ) -> tuple[float, float, float, list[float], tuple[float, float]]:
    """A stage's gradient all-reduce over its replicas: (seconds, bytes one GPU all-reduces,
    bytes per ring hop, USD per byte of each hop that leaves a zone, the ring as it meets the
    stage's last sends: ``stage.overlapped_dp_ring``); under ZeRO its reduce-scatters and
    all-gather (``levers.zero_sync_factor``)."""
    thinnest = min(stage.replicas, key=lambda rep: rep.tp_degree)
    sync_bytes = st.dp_sync_bytes(looked_up.of(thinnest.gpu, thinnest.tp_degree), stage.layer_start,
                                  stage.layer_end, looked_up.regime)
    sync_s = st.stage_dp_sync_s(network, sync_bytes, [(rep.zone, rep.gpu, rep.tp_degree) for rep in stage.replicas])
    hop_usd = compose.ring_hop_usd_per_byte(network, [rep.zone for rep in stage.replicas])
    hop_bytes = compose.ring_hop_bytes(stage.dp_degree, sync_bytes, thinnest.tp_degree) if hop_usd else 0.0
    factor = zero_sync_factor(stage.zero_stage, looked_up.regime) if stage.dp_degree > 1 else 1.0
    if factor != 1.0:
        sync_s, hop_bytes = sync_s * factor, hop_bytes * factor
    tp = thinnest.tp_degree
    ring = st.overlapped_dp_ring(sync_s, sync_bytes, stage.dp_degree,
                                 tp if all(rep.tp_degree == tp for rep in stage.replicas) else None)
    return sync_s, sync_bytes, hop_bytes, hop_usd, ring


def _tied_ring(looked_up: _PlanProfiles, network: NetworkModel, plan: Plan) -> tuple[float, list[float]]:
    """The embedding group's all-reduce of a tied matrix: its seconds (``stage.tied_sync_s``) and
    the USD per iteration of its hops that leave a zone (``stage.tied_sync_egress_terms``); none
    for one stage."""
    if len(plan.stages) < 2:
        return 0.0, []
    members = [*plan.stages[0].replicas, *plan.stages[-1].replicas]
    thinnest = min(members, key=lambda rep: rep.tp_degree)
    tied_bytes = st.tied_sync_bytes(looked_up.of(thinnest.gpu, thinnest.tp_degree), looked_up.regime)
    ring = [(rep.zone, rep.gpu, rep.tp_degree) for rep in members]
    return st.tied_sync_s(network, tied_bytes, ring), st.tied_sync_egress_terms(network, tied_bytes, ring)


def _boundary(looked_up: _PlanProfiles, network: NetworkModel, src: Stage, dst: Stage, num_mb: int,
              ) -> tuple[float, int, list[tuple[int, float]], int, float]:
    """The boundary from ``src`` to the next stage ``dst``: (activation forward + gradient back
    of one micro-batch over the slowest replica pair the routing uses, activation bytes,
    ``compose.boundary_crossings``, micro-batches its busiest NIC carries, the bytes that pair
    moves: ``stage.boundary_wire_bytes``, the most of equally slow pairs)."""
    first = src.replicas[0]
    nbytes = st.boundary_bytes(looked_up.of(first.gpu, first.tp_degree), src.layer_end)
    slowest = slowest_bytes = 0.0
    pair_s: dict[tuple[Replica, Replica], tuple[float, float]] = {}
    routes: list[tuple[int, str, str]] = []
    for (a, b), carried in routing.p2p_pairs(num_mb, src.dp_degree, dst.dp_degree).items():
        sender, receiver = src.replicas[a], dst.replicas[b]
        hit = pair_s.get((sender, receiver))
        if hit is None:
            hit = pair_s[(sender, receiver)] = (
                st.boundary_transfer_s(network, nbytes,
                                       st.endpoint(sender.zone, sender.gpu, sender.tp_degree),
                                       st.endpoint(receiver.zone, receiver.gpu, receiver.tp_degree),
                                       partitioned=compose.partitions_boundaries(looked_up.regime)),
                st.boundary_wire_bytes(nbytes, sender.tp_degree, receiver.tp_degree))
        t, wire = hit
        if t > slowest or (t == slowest and wire > slowest_bytes):
            slowest, slowest_bytes = t, wire
        routes.append((carried, sender.zone, receiver.zone))
    busiest = routing.link_microbatches(num_mb, src.dp_degree, dst.dp_degree)
    return slowest, nbytes, compose.boundary_crossings(network, routes), busiest, slowest_bytes


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.2f} GB"


def describe_memory(mem: MemoryBreakdown) -> str:
    parts = [f"state {_gb(mem.state_bytes)}",
             f"activations {_gb(mem.activation_bytes)} for {mem.num_inflight} micro-batch(es) in flight"]
    if mem.loss_working_bytes:
        parts.append(f"loss {_gb(mem.loss_working_bytes)}")
    if mem.backward_working_bytes:
        parts.append(f"backward {_gb(mem.backward_working_bytes)}")
    if mem.comm_bytes:
        parts.append(f"buffers {_gb(mem.comm_bytes)}")
    if mem.optimizer_working_bytes:
        parts.append(f"optimizer step {_gb(mem.optimizer_working_bytes)}")
    parts.append(f"overhead {_gb(mem.overhead_bytes)}")
    return f"needs {_gb(mem.peak_bytes)} ({' + '.join(parts)}) but the GPU has {_gb(mem.capacity_bytes)}"


def _why_not(stages: tuple[StageResult, ...]) -> str | None:
    for s in stages:
        for r, rep in enumerate(s.replicas):
            if not rep.memory.fits:
                return f"stage {s.index} replica {r} ({rep.gpu}, tp {rep.tp_degree}) {describe_memory(rep.memory)}"
    return None


def stage_memory_for(
    model: str,
    gpu: str,
    tp_degree: int,
    micro_batch_size: int,
    num_inflight: int,
    layers: tuple[int, int] | None = None,
    *,
    seq_len: int | None = None,
    regime: str | None = None,
    profiles: ProfileSource | None = None,
) -> MemoryBreakdown:
    """Memory of one GPU holding ``layers`` (half-open; default all) with K micro-batches in flight."""
    return stage_memory_under(NO_LEVERS, model, gpu, tp_degree, micro_batch_size, num_inflight, layers,
                              seq_len=seq_len, regime=regime, profiles=profiles)


NO_LEVERS = (RECOMPUTE_NONE, 0, 1)


def stage_memory_under(
    levers: tuple[str, int, int],
    model: str,
    gpu: str,
    tp_degree: int,
    micro_batch_size: int,
    num_inflight: int,
    layers: tuple[int, int] | None = None,
    **lookup: Any,
) -> MemoryBreakdown:
    """``stage_memory_for`` (``lookup``: its ``seq_len``, ``regime``, ``profiles`` and the
    replica's ``num_microbatches`` per step, 0 or absent: more than in flight) under
    ``levers``: (recomputation, ZeRO stage, the stage's DP degree that ZeRO shards over)."""
    recompute, zero_stage, dp_degree = levers
    spec = get_model(model)
    gpu_spec = get_gpu(normalize_gpu_name(gpu))
    if micro_batch_size < 1:
        raise InputError(f"micro-batch size must be >= 1, got {micro_batch_size}")
    if num_inflight < 1:
        raise InputError(f"micro-batches in flight must be >= 1, got {num_inflight}")
    if recompute not in RECOMPUTE_MODES or zero_stage not in ZERO_STAGES or dp_degree < 1:
        raise InputError(f"recomputation must be one of {', '.join(RECOMPUTE_MODES)}, ZeRO one of "
                         f"{', '.join(map(str, ZERO_STAGES))} and the DP degree >= 1")
    problem = tp_split_problem(spec, tp_degree)
    if problem or tp_degree > gpu_spec.max_gpus_per_node:
        raise PlanError(problem or f"TP degree {tp_degree} does not fit a {gpu_spec.name} node "
                        f"(at most {gpu_spec.max_gpus_per_node} GPUs)")
    n = spec.num_layer_indices
    start, end = layers if layers is not None else (0, n)
    if not 0 <= start < end <= n:
        raise PlanError(f"layers {start}:{end} are not a non-empty range within {spec.name}'s layers 0..{n - 1}")
    profiles = lookup.get("profiles") or _default_profiles()
    regime = lookup.get("regime")
    prof = profiles.get(spec.name, gpu_spec.name, tp_degree, micro_batch_size, lookup.get("seq_len") or spec.seq_len,
                        regime=regime)
    reg = get_regime(regime or prof.regime)
    return stage_memory(recomputed_profile(prof, recompute), start, end, num_inflight, reg, gpu_spec.memory_bytes,
                        dp_degree, num_microbatches=lookup.get("num_microbatches") or 0, zero_stage=zero_stage)


def stage_peak_memory_bytes(
    model: str, gpu: str, tp_degree: int, micro_batch_size: int, num_inflight: int,
    layers: tuple[int, int] | None = None, **kwargs,
) -> int:
    """Peak bytes of one GPU holding that stage; see ``stage_memory_for`` and ``memory``."""
    return stage_memory_for(model, gpu, tp_degree, micro_batch_size, num_inflight, layers, **kwargs).peak_bytes
