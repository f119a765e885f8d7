"""One composition of an iteration's time, egress and cost: ``simulate`` and the planner's fast
path (``planner/fastsim.py``) both call these functions, so the model is written once.

Time is a sum of named parts (as in vidur): the 1F1B pipeline's ``compute``, ``bubble`` and
``p2p`` (``pipeline_time``), then the end of the iteration, which the slowest stage's
data-parallel sync (``dp_sync``) and optimizer step (``update``) decide: every stage syncs and
steps in parallel once the pipeline drains.

Cost per iteration is the GPUs' rent for the iteration's duration plus the egress of what leaves
a zone: each hop of a stage's gradient ring that crosses a zone boundary, and each micro-batch's
activation (and its gradient back) routed between replicas in different zones.

Sums add their terms in an explicit order (never ``sum()``, whose float algorithm changed in
Python 3.12): plan order, then ring hops before boundary routes.  ``simulate`` adds one term per
replica; the fast path one per group of identical replicas, so the two agree to rounding, not
always to the last bit (``tests/planner/test_fastsim.py``).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from sailor_core.network.model import NetworkModel
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime, get_regime
from sailor_core.simulator.pipeline_time import PipelineTime

SECONDS_PER_HOUR = 3600.0


# ---- regime -------------------------------------------------------------------------------------


def job_regime(plan_regime: str | None, first_profile: ModelProfile) -> TrainingRegime:
    """The regime a plan runs under: the one it names, else the one its first replica's profile
    was measured under (every other replica's profile is then taken under the same one)."""
    return get_regime(plan_regime or first_profile.regime)


# Frameworks whose pipeline sends and receives both block: DeepSpeed's PipelineEngine, under
# which Sailor's published profiles and measured runs were taken.  Every other regime is Sailor's
# own engine, which prefetches its next receive (``pipeline_time.P2P_SCHEDULES``).
BLOCKING_P2P_REGIMES = frozenset({"megatron-fp32-adamw"})


def partitions_boundaries(regime: TrainingRegime) -> bool:
    """Whether the framework partitions a boundary's tensors over the TP group (DeepSpeed's
    pipeline engine: ``stage.partitioned_boundary_s``)."""
    return regime.name in BLOCKING_P2P_REGIMES


def ties_embedding_across_stages(regime_name: str) -> bool:
    """Whether the framework ties a tied model's LM head to its embedding across a pipeline's
    stages (``TrainingRegime.ties_embedding_across_stages``): then the last stage holds a copy of
    the matrix (``memory.tied_copy_params``) and sums its gradient with the first stage's in an
    embedding group (``stage.tied_sync_s``), as Megatron and Sailor's own engine
    (``runtime/process_groups.py``) do.  Under DeepSpeed's pipeline engine (Sailor's profiles and
    measured runs) that sum is ``TiedLayerSpec``'s (``_exec_reduce_tied_grads``), and Sailor's
    Megatron-DeepSpeed models declare none: OPT's head is a ``LayerSpec(OPTLMHeadPipe)`` with a
    matrix of its own (its profile's head counts it), Llama's a ``LlamaLMHead``, GPT-Neo's
    pipeline ends with a LayerNorm and has no head.  There the last stage holds what its
    profile's head counts and its stage's DP ring carries it, as the first stage's carries the
    embedding.  Time and memory both ask this one predicate."""
    return get_regime(regime_name).ties_embedding_across_stages


def p2p_schedule(regime: TrainingRegime) -> str:
    """How the job's framework moves activations between stages (``pipeline_time``)."""
    return "blocking" if regime.name in BLOCKING_P2P_REGIMES else "prefetch"


# ---- time ---------------------------------------------------------------------------------------


def stage_end_s(sync_s: float, update_s: float) -> float:
    """What a stage adds after the pipeline drains: its gradient sync, then its optimizer step."""
    return sync_s + update_s


def slowest_end(stage_end_s: Sequence[float]) -> int:
    """The stage whose ``stage_end_s`` ends the iteration (the first of equals)."""
    best = 0
    for i in range(1, len(stage_end_s)):
        if stage_end_s[i] > stage_end_s[best]:
            best = i
    return best


def iteration_breakdown(pipe: PipelineTime, sync_s: float, update_s: float) -> dict[str, float]:
    """The iteration's named parts (``result.BREAKDOWN_KEYS``), given the slowest stage's end."""
    return {"compute": pipe.compute_s, "bubble": pipe.bubble_s, "p2p": pipe.p2p_s,
            "dp_sync": sync_s, "update": update_s}


def iteration_s(pipe: PipelineTime, *end_parts_s: float) -> float:
    """The pipeline's parts, then the slowest stage's end parts, added in this order.
    ``simulate`` passes (sync, update), so its breakdown adds up to the total; the fast path
    passes their ``stage_end_s``, which it memoises per stage."""
    total = pipe.compute_s + pipe.bubble_s + pipe.p2p_s
    for part in end_parts_s:
        total += part
    return total


# ---- a stage's last send beside its DP ring ----------------------------------------------------


def send_ring_contention_s(*, send_s: float, send_bytes: float, ring_s: float, ring_bytes: float) -> float:
    """How much later a stage's last input-gradient send ends because its DP ring leaves the same
    node at the same time (the engine launches the ring's buckets during the last backward and
    posts the send right after it: ``runtime/trainer.py``), both counted from that send's start.

    Max-min fair sharing of the node's NIC: each flow alone runs at its own rate (bytes over the
    seconds the network model gives it); the NIC moves at least the faster of the two, ``cap``.
    Sharing it, a flow gets half of ``cap``, or what the other leaves when the other's own path
    (a WAN link) holds it below half, never more than its own rate; once either ends, the other
    has the NIC to itself again.  Two flows of one rate: the send takes ``min(send_s, ring_s)``
    longer.  (The ring's own delay is not returned: it started before the pipeline's drain, which
    the model charges it after, see ``drain_contention_s``.)"""
    if send_s <= 0 or ring_s <= 0 or send_bytes <= 0 or ring_bytes <= 0:
        return 0.0
    send_rate, ring_rate = send_bytes / send_s, ring_bytes / ring_s
    cap = send_rate if send_rate > ring_rate else ring_rate
    send_share = min(1.0, max(cap / 2, cap - ring_rate) / send_rate)  # of its own rate
    ring_share = min(1.0, max(cap / 2, cap - send_rate) / ring_rate)
    shared_send_s, shared_ring_s = send_s / send_share, ring_s / ring_share
    if shared_send_s <= shared_ring_s:
        return shared_send_s - send_s
    # the ring ends first; the send then has moved only send_share of what it would have alone
    return shared_ring_s * (1.0 - send_share)


def drain_contention_s(schedule: str, links: Sequence[tuple[float, float]],
                       rings: Sequence[tuple[float, float]]) -> float:
    """What the pipeline's drain loses to stages whose last send shares a NIC with their DP ring.

    ``links[k]``: link k as ``simulate`` and the fast path keep it, (seconds, micro-batches its
    busiest NIC carries, bytes) of the activation forward plus its gradient back over its
    slowest replica pair (``stage.boundary_transfer_s``, ``stage.boundary_wire_bytes``; one
    way is taken as half of both, as the pipeline's ``l / 2``);
    ``rings[k]``: (seconds, bytes leaving one replica's node) of stage k's DP ring when the
    engine runs it beside its sends (``stage.overlapped_dp_ring``), else (0, 0).  Stage k >= 1's
    last send carries the last micro-batch's gradient back over link k - 1 as its ring starts
    (model: both at the end of its last backward; the ring's overlap with that backward is not
    counted, as elsewhere).  That gradient passes every stage's last send in turn before stage
    0's last backward ends the pipeline, so the delays add (exact for stages of equal speed; a
    slower upstream stage can absorb some: an upper bound).  Stage 0 sends no gradient.  Under
    blocking sends (DeepSpeed) every send has completed before the all-reduce starts: none."""
    if schedule != "prefetch":
        return 0.0
    total = 0.0
    for k in range(1, len(rings)):
        ring_s, ring_bytes = rings[k]
        if ring_s > 0:
            link_s, _, link_bytes = links[k - 1]
            total += send_ring_contention_s(send_s=link_s / 2, send_bytes=link_bytes / 2,
                                            ring_s=ring_s, ring_bytes=ring_bytes)
    return total


def throughput_samples_per_s(global_batch_size: int, iteration_s: float) -> float:
    return global_batch_size / iteration_s if iteration_s > 0 else 0.0


# ---- egress -------------------------------------------------------------------------------------


def ring_hop_fraction(dp_degree: int) -> float:
    """Share of the all-reduced bytes each hop of a ring of ``dp_degree`` carries: 2 (D - 1) / D
    (reduce-scatter, then all-gather)."""
    return 2 * (dp_degree - 1) / dp_degree


def ring_hop_bytes(dp_degree: int, sync_bytes: float, tp_degree: int) -> float:
    """Bytes each hop of a stage's ring carries: ``sync_bytes`` (one GPU's gradient, see
    ``stage.dp_sync_bytes``) from each of the thinnest replica's ``tp_degree`` GPUs."""
    return ring_hop_fraction(dp_degree) * sync_bytes * tp_degree


def ring_egress_usd_per_byte_lb(dp_degree: int, cheapest_usd_per_byte: float) -> float:
    """A lower bound on the egress USD per all-reduced byte (sync bytes x TP degree) of a ring
    whose replicas span two zones or more: it crosses at least two zone boundaries."""
    return 2 * ring_hop_fraction(dp_degree) * cheapest_usd_per_byte


def ring_hop_usd_per_byte(network: NetworkModel, zones: Iterable[str]) -> list[float]:
    """Egress price of each ring hop that leaves a zone, in ring order: ``zones`` are the ring's
    members' zones in the order the ring visits them (a stage's replicas, ``plan.types.Stage``),
    the last member sending back to the first.  A ring grouped by zone leaves each zone once
    (none when all its members share one); interleaved zones pay for every change."""
    order = list(zones)
    if len(order) < 2:
        return []
    return [network.egress_usd_per_byte(a, b) for a, b in zip(order, order[1:] + order[:1]) if a != b]


def round_trip_usd_per_byte(network: NetworkModel, zone_a: str, zone_b: str) -> float:
    """Egress price of a byte sent from ``zone_a`` to ``zone_b`` plus one sent back."""
    return network.egress_usd_per_byte(zone_a, zone_b) + network.egress_usd_per_byte(zone_b, zone_a)


def boundary_crossings(network: NetworkModel, routes: Iterable[tuple[int, str, str]],
                       ) -> list[tuple[int, float]]:
    """(micro-batches, USD per byte both ways) of each route (micro-batches carried, source
    zone, destination zone) between two stages that leaves a zone: an activation goes one way,
    its gradient the other."""
    return [(carried, round_trip_usd_per_byte(network, a, b)) for carried, a, b in routes if a != b]


def stage_egress_terms(hop_bytes: float, hop_usd_per_byte: Iterable[float], boundary_bytes: int,
                       crossings: Iterable[tuple[int, float]]) -> list[float]:
    """USD per iteration of each ring hop leaving a zone, then of each boundary crossing
    (``boundary_crossings``; ``boundary_bytes``: one micro-batch's activation)."""
    terms = [hop_bytes * usd for usd in hop_usd_per_byte]
    terms += [carried * boundary_bytes * usd for carried, usd in crossings]
    return terms


# ---- cost ---------------------------------------------------------------------------------------


def rent_usd_per_hr(num_gpus: int, usd_per_gpu_hr: float) -> float:
    return num_gpus * usd_per_gpu_hr


def add_in_order(terms_per_stage: Iterable[Iterable[float]]) -> float:
    """The sum of every stage's terms, added one by one in plan order (the order fixes the
    last bit: see the module doc)."""
    total = 0.0
    for terms in terms_per_stage:
        for term in terms:
            total += term
    return total


def gpu_usd_per_iteration(usd_per_hr: float, iteration_s: float) -> float:
    return usd_per_hr * iteration_s / SECONDS_PER_HOUR


def usd_per_iteration(gpu_usd: float, egress_usd: float) -> float:
    return gpu_usd + egress_usd
