"""Per-stage building blocks of the simulator, exposed for the planner.

Each function is one named part of the iteration time for one stage (or one
stage boundary); ``simulate`` sums exactly these, so a planner that calls them
directly evaluates candidates with the same model.  All are cheap: O(1) stage
sums from prefix tables, network lookups cached per endpoint pair.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from sailor_core.network.model import Endpoint, NetworkModel
# The routing rule lives in plan/routing; tests/planner/test_leaf_replay.py still imports these from here.
from sailor_core.plan.routing import group_p2p_pairs, p2p_pairs  # noqa: F401
from sailor_core.profiles.estimator import DEFAULT_TP_LATENCY_S
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime
from sailor_core.simulator import compose
from sailor_core.simulator.levers import sharded
from sailor_core.simulator.memory import dp_synced_params, embedding_group_params
from sailor_core.simulator.tables import layer_table


def stage_compute_s(profile: ModelProfile, layer_start: int, layer_end: int) -> tuple[float, float]:
    """(forward s, backward s) of one micro-batch on one replica holding layers [start, end)."""
    table = layer_table(profile)
    return table.fwd_s(layer_start, layer_end), table.bwd_s(layer_start, layer_end)


def stage_params(profile: ModelProfile, layer_start: int, layer_end: int) -> int:
    """Parameters one GPU of this replica holds (its TP shard)."""
    return layer_table(profile).params(layer_start, layer_end)


def stage_update_s(profile: ModelProfile, layer_start: int, layer_end: int, opt_shards: int = 1) -> float:
    """Optimizer step of one GPU holding layers [start, end) of ``profile``, its optimizer states
    split ``opt_shards`` ways (ZeRO: ``levers.zero_shards``)."""
    return profile.update_s(sharded(layer_table(profile).params(layer_start, layer_end), opt_shards))


def boundary_bytes(profile: ModelProfile, layer_end: int) -> int:
    """Activation bytes one micro-batch sends from a stage ending at ``layer_end`` (its gradient
    comes back with the same size)."""
    return layer_table(profile).output_bytes[layer_end - 1]


def endpoint(zone: str, gpu: str, tp_degree: int) -> Endpoint:
    """A replica as a p2p endpoint: its ``tp`` GPUs send at once (Sailor: GPU count = min(tp,
    GPUs per node); TP never spans nodes, so that is tp)."""
    return Endpoint(zone=zone, gpu=gpu, num_gpus=tp_degree)


def boundary_transfer_s(
    network: NetworkModel, num_bytes: float, src: Endpoint, dst: Endpoint, *, partitioned: bool = False,
) -> float:
    """Activation forward plus its gradient backward for one micro-batch over one replica pair.

    Equal TP degrees: the tensor crosses once, in slices over every TP pair, and the receiver
    gathers them inside its node (the engine's and Megatron's scatter-gather; the gather is left
    out).  Otherwise every GPU of the receiving replica gets a whole copy, sent by the other's
    GPUs in turn (``runtime/trainer.py``): ``tp_dst`` copies forward and ``tp_src`` back, over
    min(tp) GPU pairs.  ``partitioned``: DeepSpeed's pipeline engine, which adds
    ``partitioned_boundary_s`` (``compose.partitions_boundaries``)."""
    if src.num_gpus == dst.num_gpus:
        extra = partitioned_boundary_s(network, num_bytes, src, dst) if partitioned else 0.0
        return network.p2p_time_s(num_bytes, src, dst) + network.p2p_time_s(num_bytes, dst, src) + extra
    return (network.p2p_time_s(num_bytes * dst.num_gpus, src, dst)
            + network.p2p_time_s(num_bytes * src.num_gpus, dst, src))


# DeepSpeed's PartitionedTensor meta: a LongTensor of a few entries (group size, shape, offsets)
_PARTITION_META_BYTES = 64


def partitioned_boundary_s(network: NetworkModel, num_bytes: float, src: Endpoint, dst: Endpoint) -> float:
    """What DeepSpeed's pipeline engine adds to one micro-batch's round trip over a boundary
    between replicas of equal TP degree ``t > 1``.  With model parallelism it partitions the
    boundary's tensors over the TP group (``pipe_partitioned`` and ``grad_partitioned``, on by
    default): every rank sends a small meta tensor, then its 1/t slice, both blocking sends (the
    slices are ``boundary_transfer_s``'s crossing), and the tensor is rebuilt by an all-gather
    over the TP group twice per micro-batch, as Sailor's pipeline engine (``deepspeed/
    pipe_engine.py`` of eth-easl/sailor, under which its profiles and runs were taken) does:
    the receiver's gather of the activation before its forward (``reconstruct_tensor`` of the
    received input) and the sender's of the received gradient before its backward (the output
    is not gathered again: its data is pointed at the gathered gradient; upstream DeepSpeed
    gathers the output too, a third gather).  The gathers run inside the node on the TP link
    (``NetworkModel.tp_bandwidth_bytes_per_s``), as a ring (``t - 1`` steps of ``bytes / t``)
    that pays the TP collective's latency once, as the estimator's TP all-reduce does."""
    tp = src.num_gpus
    if tp == 1 or dst.num_gpus != tp:
        return 0.0
    wire_bytes = (tp - 1) * num_bytes / tp
    gathers = sum(DEFAULT_TP_LATENCY_S + wire_bytes / network.tp_bandwidth_bytes_per_s(gpu, tp, num_bytes)
                  for gpu in (dst.gpu, src.gpu))
    meta = network.p2p_time_s(_PARTITION_META_BYTES, src, dst) + network.p2p_time_s(_PARTITION_META_BYTES, dst, src)
    return gathers + meta


def boundary_wire_bytes(num_bytes: float, tp_src: int, tp_dst: int) -> float:
    """Bytes ``boundary_transfer_s`` moves for one micro-batch between replicas of these TP
    degrees: the activation forward and its gradient back, once each with equal degrees, else a
    copy per receiving GPU each way (what a link's rate is of, ``compose.drain_contention_s``)."""
    if tp_src == tp_dst:
        return 2.0 * num_bytes
    return float(num_bytes * tp_dst + num_bytes * tp_src)


def dp_sync_bytes(profile: ModelProfile, layer_start: int, layer_end: int, regime: TrainingRegime) -> float:
    """Gradient bytes each data-parallel ring all-reduces: the stage's gradients but a tied
    matrix, which the embedding group sums where the framework has one (``memory.dp_synced_params``,
    ``tied_sync_s``).

    ``profile`` is that of the replica with the smallest TP degree: its GPU holds the stage's
    gradient divided by that degree (Sailor's rule for replicas of different TP).
    """
    return dp_synced_params(layer_table(profile), layer_start, layer_end) * regime.grad_bytes_per_param


def stage_dp_sync_s(network: NetworkModel, sync_bytes: float, replicas: Sequence[tuple[str, str, int]]) -> float:
    """Bucketed ring all-reduce of a stage's gradient over its replicas, (zone, GPU, TP degree)
    each; ``sync_bytes``: what one GPU of the thinnest replica all-reduces (``dp_sync_bytes``).

    Never faster than Sailor's rule, one ring of ``sync_bytes`` with one GPU per side.  With
    equal TP degrees each TP rank has a data-parallel group of its own (the engine, and
    DeepSpeed alike): a replica's ``tp`` GPUs run their rings at once through the node's links,
    a ring of ``tp``-GPU endpoints carrying ``tp x sync_bytes``.  With different TP degrees the
    engine all-reduces the stage's whole gradient over all its ranks (``runtime/trainer.py``):
    one ring of single GPUs, ``sum tp`` members, ``thinnest tp x sync_bytes``."""
    return stage_dp_sync_runs_s(network, sync_bytes, member_runs([(tuple(r), 1) for r in replicas]))


def stage_dp_sync_runs_s(network: NetworkModel, sync_bytes: float,
                         runs: tuple[tuple[tuple[str, str, int], int], ...]) -> float:
    """``stage_dp_sync_s`` of the replicas listed as runs: ((zone, GPU, TP degree), how many in a
    row) in ring order (``member_runs``; the planner's stages are groups of equal replicas)."""
    rings = _sync_rings(runs)
    if rings is None:
        return 0.0
    singles, scale, shared_ring = rings
    one = network.allreduce_runs_time_s(sync_bytes, singles)
    shared = one if shared_ring is None else network.allreduce_runs_time_s(sync_bytes * scale, shared_ring)
    return shared if shared > one else one


def stage_dp_sync_runs_least_s(network: NetworkModel, sync_bytes: float,
                               runs: tuple[tuple[tuple[str, str, int], int], ...]) -> float:
    """A lower bound on ``stage_dp_sync_runs_s`` of ``sync_bytes`` or more over these replicas
    (each of its rings at its least: ``NetworkModel.least_allreduce_runs_time_s``)."""
    rings = _sync_rings(runs)
    if rings is None:
        return 0.0
    singles, scale, shared_ring = rings
    one = network.least_allreduce_runs_time_s(sync_bytes, singles)
    if shared_ring is None:
        return one
    shared = network.least_allreduce_runs_time_s(sync_bytes * scale, shared_ring)
    return shared if shared > one else one


@lru_cache(maxsize=4096)
def _sync_rings(runs: tuple[tuple[tuple[str, str, int], int], ...]):
    """The rings ``stage_dp_sync_s`` times over these replicas, as endpoint runs: (one GPU per
    replica, the factor of the sync bytes the shared ring carries, the shared ring (None: the
    first)); None for one replica.  The same for every stage of these replicas, whatever its layers."""
    if sum(count for _, count in runs) <= 1:
        return None
    singles = _endpoint_runs(member_runs([((zone, gpu, 1), count) for (zone, gpu, _), count in runs]))
    tp = runs[0][0][2]
    if all(member[2] == tp for member, _ in runs):
        return singles, tp, None if tp == 1 else _endpoint_runs(runs)
    # every GPU a member of its own: a replica of TP t is t members in a row
    thinnest = min(member[2] for member, _ in runs)
    return singles, thinnest, _endpoint_runs(
        member_runs([((zone, gpu, 1), count * n) for (zone, gpu, n), count in runs]))


def _endpoint_runs(runs) -> tuple[tuple[Endpoint, int], ...]:
    """Runs of (zone, GPU, GPUs per side) members as the network's (Endpoint, count) runs."""
    return tuple((Endpoint(zone=zone, gpu=gpu, num_gpus=k), count) for (zone, gpu, k), count in runs)


def member_runs(runs: Sequence[tuple[tuple, int]]) -> tuple[tuple[tuple, int], ...]:
    """``runs`` ((member, count) in ring order) with equal neighbours merged."""
    out: list[list] = []
    for member, count in runs:
        if out and out[-1][0] == member:
            out[-1][1] += count
        else:
            out.append([member, count])
    return tuple((member, count) for member, count in out)


def overlapped_dp_ring(sync_s: float, sync_bytes: float, dp_degree: int, tp_degree: int | None,
                       ) -> tuple[float, float]:
    """(seconds, bytes leaving each replica's node) of a stage's DP ring that runs beside its
    last sends, for ``compose.drain_contention_s``.  Replicas of one TP degree (``tp_degree``):
    the engine launches the ring's buckets during the last backward and sends the last input
    gradient after it (``_OverlappedAllReduce``), both over the node's NIC (every replica is a
    node of its own, so a ring never stays inside one).  Mixed TP degrees (``None``): the engine
    all-reduces only once every send has completed, so nothing overlaps: (0, 0), as for one
    replica.  ``sync_s``: ``stage_dp_sync_s`` (not the embedding group's sum, which also starts
    only after every send)."""
    if tp_degree is None or dp_degree <= 1 or sync_s <= 0:
        return 0.0, 0.0
    return sync_s, compose.ring_hop_bytes(dp_degree, sync_bytes, tp_degree)


def tied_sync_bytes(profile: ModelProfile, regime: TrainingRegime) -> float:
    """Gradient bytes of a tied embedding matrix one GPU of ``profile``'s (GPU, TP) sums in the
    embedding group of a multi-stage plan: its shard of the matrix (0 for an untied model, a
    profile whose head counts a matrix of its own, or a framework without the group:
    ``memory.embedding_group_params``)."""
    return embedding_group_params(profile) * regime.grad_bytes_per_param


def tied_sync_s(network: NetworkModel, tied_bytes: float, members: Sequence[tuple[str, str, int]]) -> float:
    """The embedding group's all-reduce of a tied matrix's gradient, after the stages' DP syncs:
    one ring over every replica of the first and the last stage, (zone, GPU, TP degree) each,
    first stage's replicas then last stage's (``runtime/trainer.py``'s group; Megatron sums it
    between the two stages likewise; DeepSpeed would through a ``TiedLayerSpec``, which Sailor's
    models do not declare: ``compose.ties_embedding_across_stages``).  It ends both stages' iteration, so it
    adds to their ``dp_sync_s``.  ``tied_bytes``: ``tied_sync_bytes`` of the thinnest member;
    TP ranks as in ``stage_dp_sync_s``.  Neither stage's DP ring carries the matrix
    (``dp_sync_bytes``), as in the engine."""
    return tied_sync_runs_s(network, tied_bytes, member_runs([(tuple(m), 1) for m in members]))


def tied_sync_runs_s(network: NetworkModel, tied_bytes: float,
                     runs: tuple[tuple[tuple[str, str, int], int], ...]) -> float:
    """``tied_sync_s`` of the members listed as runs (``member_runs``)."""
    if tied_bytes <= 0:
        return 0.0
    return stage_dp_sync_runs_s(network, tied_bytes, runs)


def tied_sync_egress_terms(network: NetworkModel, tied_bytes: float,
                           members: Sequence[tuple[str, str, int]]) -> list[float]:
    """USD per iteration of each hop of the embedding group's ring that leaves a zone (the
    members of ``tied_sync_s``; first and last stages in different zones: the sum crosses), priced
    as a stage's DP ring (``compose.ring_hop_bytes``, ``compose.stage_egress_terms``)."""
    return tied_sync_egress_runs_terms(network, tied_bytes, member_runs([(tuple(m), 1) for m in members]))


def tied_sync_egress_runs_terms(network: NetworkModel, tied_bytes: float,
                                runs: tuple[tuple[tuple[str, str, int], int], ...]) -> list[float]:
    """``tied_sync_egress_terms`` of the members listed as runs (``member_runs``): a run's
    members share a zone, so the ring leaves a zone where the runs' zones change."""
    hop_usd = compose.ring_hop_usd_per_byte(network, [zone for (zone, _, _), _ in runs])
    if tied_bytes <= 0 or not hop_usd:
        return []
    thinnest = min(tp for (_, _, tp), _ in runs)
    num_members = sum(count for _, count in runs)
    return compose.stage_egress_terms(compose.ring_hop_bytes(num_members, tied_bytes, thinnest), hop_usd, 0, [])
