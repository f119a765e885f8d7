"""``simulate(plan)``: iteration time by named parts, peak memory, cost and throughput of a plan.

Composition (each piece is a function of ``stage``/``schedule``/``memory``):

* per stage: the straggler's forward + backward per micro-batch, the number of
  micro-batches its busiest replica gets (micro-batch m -> replica m mod D_i);
* per boundary: activation + gradient transfer over the slowest replica pair the
  routing uses, on the actual link (zone, GPU type, TP width of both sides);
* 1F1B pipeline time from those (``schedule.one_f_one_b``);
* then every stage all-reduces its gradients over its replicas (bucketed ring,
  slowest link) and steps its optimizer; stages do this in parallel, so the
  slowest stage's sync + update ends the iteration.

Cost: GPU-hours at the catalog's (spot) prices for the iteration's duration, plus
egress of the activations/gradients and gradient rings that leave a zone.
"""

from __future__ import annotations

from typing import Protocol

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.network.model import NetworkModel, default_network
from sailor_core.plan import routing
from sailor_core.plan.types import Plan, validate_plan
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime, get_regime
from sailor_core.simulator import stage as st
from sailor_core.simulator.memory import MemoryBreakdown, inflight_microbatches, stage_memory
from sailor_core.simulator.result import ReplicaResult, SimResult, StageResult
from sailor_core.simulator.pipeline_time import StageTiming, one_f_one_b, stage_timing
from sailor_core.simulator.tables import layer_table


class ProfileSource(Protocol):
    def get(self, model: str, gpu: str, tp_degree: int, micro_batch_size: int,
            seq_len: int | None = None, *, regime: str | None = None) -> ModelProfile: ...


def _default_profiles() -> ProfileSource:
    from sailor_core.profiles import default_profile_db

    return default_profile_db()


def plan_regime(plan: Plan, profile: ModelProfile) -> TrainingRegime:
    """The plan's regime if it names one, else the regime its profiles were measured under."""
    return get_regime(plan.regime or profile.regime)


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
    profiles = profiles if profiles is not None else _default_profiles()
    network = network if network is not None else default_network()
    seq_len = plan.effective_seq_len()
    mbs = plan.micro_batch_size
    num_mb = plan.num_microbatches
    num_stages = len(plan.stages)

    # One job runs under one regime: the plan's, else that of the first replica's profile; every
    # other replica's profile is then taken (measured or estimated) under the same regime.
    first = plan.stages[0].replicas[0]
    first_profile = profiles.get(plan.model, first.gpu, first.tp_degree, mbs, seq_len, regime=plan.regime)
    regime = plan_regime(plan, first_profile)
    lookup: dict[tuple[str, int], ModelProfile] = {(first.gpu, first.tp_degree): first_profile}

    def profile_of(gpu: str, tp: int) -> ModelProfile:
        p = lookup.get((gpu, tp))
        if p is None:
            p = lookup[(gpu, tp)] = profiles.get(plan.model, gpu, tp, mbs, seq_len, regime=regime.name)
        return p

    stage_timings: list[StageTiming] = []
    link_s: list[float] = []
    link_counts: list[int] = []
    egress_usd = 0.0
    partial: list[dict] = []

    for i, stage in enumerate(plan.stages):
        start, end = stage.layer_start, stage.layer_end
        counts = routing.microbatches_per_replica(num_mb, stage.dp_degree)
        replicas = []
        steps: list[float] = []
        fwds: list[float] = []
        worst, straggler = -1.0, 0
        update_s = 0.0
        # Replicas of one (GPU, TP) holding the same number of micro-batches are identical: evaluate once.
        same: dict[tuple[str, int, int], tuple] = {}
        results: dict[tuple, ReplicaResult] = {}
        for r, rep in enumerate(stage.replicas):
            inflight = inflight_microbatches(i, num_stages, counts[r])
            key = (rep.gpu, rep.tp_degree, inflight)
            known = same.get(key)
            if known is None:
                prof = profile_of(rep.gpu, rep.tp_degree)
                table = layer_table(prof)
                mem = stage_memory(prof, start, end, inflight, regime, get_gpu(rep.gpu).memory_bytes)
                known = same[key] = (
                    prof, table.fwd_s(start, end), table.bwd_s(start, end),
                    prof.update_s(table.params(start, end)), mem, table.measured(start, end),
                )
            prof, fwd, bwd, upd, mem, measured = known
            steps.append(fwd + bwd)
            fwds.append(fwd)
            if fwd + bwd > worst:
                worst, straggler = fwd + bwd, r
            if upd > update_s:
                update_s = upd
            # Results are frozen, so identical replicas share one.
            rkey = (rep, counts[r], inflight)
            result = results.get(rkey)
            if result is None:
                result = results[rkey] = ReplicaResult(
                    gpu=rep.gpu, tp_degree=rep.tp_degree, zone=rep.zone, num_microbatches=counts[r],
                    fwd_s=fwd, bwd_s=bwd, update_s=upd, memory=mem, profile_source=prof.source,
                    measured=measured,
                )
            replicas.append(result)
        stage_timings.append(stage_timing(steps, counts, fwds))

        # Data-parallel gradient sync over the replicas, and the egress its ring pays.
        thinnest = min(stage.replicas, key=lambda rep: rep.tp_degree)
        min_tp = thinnest.tp_degree
        sync_bytes = st.dp_sync_bytes(profile_of(thinnest.gpu, min_tp), start, end, regime)
        zones = [rep.zone for rep in stage.replicas]
        sync_s = st.stage_dp_sync_s(network, sync_bytes, [(rep.zone, rep.gpu) for rep in stage.replicas])
        if stage.dp_degree > 1:
            n = stage.dp_degree
            hop_bytes = 2 * (n - 1) / n * sync_bytes * min_tp
            order = st.ring_order(zones)
            for a, b in zip(order, order[1:] + order[:1]):
                egress_usd += hop_bytes * network.egress_usd_per_byte(zones[a], zones[b])

        # Boundary to the next stage: activation forward, gradient back.
        p2p_s = 0.0
        p2p_bytes = 0
        if i + 1 < num_stages:
            nxt = plan.stages[i + 1]
            p2p_bytes = st.boundary_bytes(profile_of(stage.replicas[0].gpu, stage.replicas[0].tp_degree), end)
            pair_s: dict[tuple, float] = {}
            for (a, b), carried in routing.p2p_pairs(num_mb, stage.dp_degree, nxt.dp_degree).items():
                src, dst = stage.replicas[a], nxt.replicas[b]
                t = pair_s.get((src, dst))
                if t is None:
                    t = pair_s[(src, dst)] = st.boundary_transfer_s(
                        network, p2p_bytes,
                        st.endpoint(src.zone, src.gpu, src.tp_degree),
                        st.endpoint(dst.zone, dst.gpu, dst.tp_degree),
                    )
                if t > p2p_s:
                    p2p_s = t
                if src.zone != dst.zone:
                    egress_usd += carried * p2p_bytes * (
                        network.egress_usd_per_byte(src.zone, dst.zone)
                        + network.egress_usd_per_byte(dst.zone, src.zone)
                    )
            link_s.append(p2p_s)
            link_counts.append(routing.link_microbatches(num_mb, stage.dp_degree, nxt.dp_degree))

        partial.append(dict(
            index=i, layer_start=start, layer_end=end, replicas=tuple(replicas), straggler=straggler,
            compute_s_per_microbatch=worst, num_microbatches=max(counts),
            p2p_s_per_microbatch=p2p_s, p2p_bytes_per_microbatch=p2p_bytes,
            dp_sync_s=sync_s, dp_sync_bytes=sync_bytes, update_s=update_s,
        ))

    pipe = one_f_one_b(stage_timings, link_s, link_counts)
    # Stages sync and step in parallel after the pipeline drains: the slowest one ends the iteration.
    last = max(partial, key=lambda s: s["dp_sync_s"] + s["update_s"])
    breakdown = {
        "compute": pipe.compute_s,
        "bubble": pipe.bubble_s,
        "p2p": pipe.p2p_s,
        "dp_sync": last["dp_sync_s"],
        "update": last["update_s"],
    }
    iteration_s = sum(breakdown.values())
    stages = tuple(StageResult(**s) for s in partial)

    usd_per_hour = sum(
        rep.tp_degree * gpu_price_usd_per_hr(rep.gpu, rep.zone, spot=spot)
        for stage in plan.stages for rep in stage.replicas
    )
    gpu_usd = usd_per_hour * iteration_s / 3600.0
    peak = max(s.peak_memory_bytes for s in stages)
    why_not = _why_not(stages)
    samples_per_s = plan.global_batch_size / iteration_s if iteration_s > 0 else 0.0
    return SimResult(
        iteration_time_s=iteration_s,
        breakdown=breakdown,
        throughput_samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * seq_len,
        usd_per_iteration=gpu_usd + egress_usd,
        usd_per_hour=usd_per_hour,
        gpu_usd_per_iteration=gpu_usd,
        egress_usd_per_iteration=egress_usd,
        peak_memory_bytes=peak,
        fits=why_not is None,
        why_not=why_not,
        bottleneck=pipe.bottleneck,
        num_gpus=plan.num_gpus,
        num_microbatches=num_mb,
        global_batch_size=plan.global_batch_size,
        seq_len=seq_len,
        regime=regime.name,
        stages=stages,
    )


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.2f} GB"


def describe_memory(mem: MemoryBreakdown) -> str:
    parts = [f"state {_gb(mem.state_bytes)}",
             f"activations {_gb(mem.activation_bytes)} for {mem.num_inflight} micro-batch(es) in flight"]
    if mem.loss_working_bytes:
        parts.append(f"loss {_gb(mem.loss_working_bytes)}")
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
    from sailor_core.catalog.gpus import normalize_gpu_name
    from sailor_core.catalog.models import get_model
    from sailor_core.errors import InputError, PlanError

    spec = get_model(model)
    gpu_spec = get_gpu(normalize_gpu_name(gpu))
    if micro_batch_size < 1:
        raise InputError(f"micro-batch size must be >= 1, got {micro_batch_size}")
    if num_inflight < 1:
        raise InputError(f"micro-batches in flight must be >= 1, got {num_inflight}")
    if tp_degree < 1 or tp_degree > gpu_spec.max_gpus_per_node or spec.num_heads % tp_degree:
        raise PlanError(
            f"TP degree {tp_degree} must divide {spec.name}'s {spec.num_heads} heads and fit a "
            f"{gpu_spec.name} node (at most {gpu_spec.max_gpus_per_node} GPUs)"
        )
    n = spec.num_layer_indices
    start, end = layers if layers is not None else (0, n)
    if not 0 <= start < end <= n:
        raise PlanError(f"layers {start}:{end} are not a non-empty range within {spec.name}'s layers 0..{n - 1}")
    profiles = profiles if profiles is not None else _default_profiles()
    prof = profiles.get(spec.name, gpu_spec.name, tp_degree, micro_batch_size, seq_len or spec.seq_len,
                        regime=regime)
    reg = get_regime(regime or prof.regime)
    return stage_memory(prof, start, end, num_inflight, reg, gpu_spec.memory_bytes)


def stage_peak_memory_bytes(
    model: str, gpu: str, tp_degree: int, micro_batch_size: int, num_inflight: int,
    layers: tuple[int, int] | None = None, **kwargs,
) -> int:
    """Peak bytes of one GPU holding that stage; see ``stage_memory_for`` and ``memory``."""
    return stage_memory_for(model, gpu, tp_degree, micro_batch_size, num_inflight, layers, **kwargs).peak_bytes
