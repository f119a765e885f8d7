"""Per-stage building blocks of the simulator, exposed for the planner.

Each function is one named part of the iteration time for one stage (or one
stage boundary); ``simulate`` sums exactly these, so a planner that calls them
directly evaluates candidates with the same model.  All are cheap: O(1) stage
sums from prefix tables, network lookups cached per endpoint pair.
"""

from __future__ import annotations

from typing import Sequence

from sailor_core.network.model import Endpoint, NetworkModel
# The routing rule lives in plan/routing; tests/planner/test_leaf_replay.py still imports these from here.
from sailor_core.plan.routing import group_p2p_pairs, p2p_pairs  # noqa: F401
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime
from sailor_core.simulator.tables import layer_table


def stage_compute_s(profile: ModelProfile, layer_start: int, layer_end: int) -> tuple[float, float]:
    """(forward s, backward s) of one micro-batch on one replica holding layers [start, end)."""
    table = layer_table(profile)
    return table.fwd_s(layer_start, layer_end), table.bwd_s(layer_start, layer_end)


def stage_params(profile: ModelProfile, layer_start: int, layer_end: int) -> int:
    """Parameters one GPU of this replica holds (its TP shard)."""
    return layer_table(profile).params(layer_start, layer_end)


def stage_update_s(profile: ModelProfile, layer_start: int, layer_end: int) -> float:
    """Optimizer step of one GPU holding layers [start, end) of ``profile``."""
    return profile.update_s(layer_table(profile).params(layer_start, layer_end))


def boundary_bytes(profile: ModelProfile, layer_end: int) -> int:
    """Activation bytes one micro-batch sends from a stage ending at ``layer_end`` (its gradient
    comes back with the same size)."""
    return layer_table(profile).output_bytes[layer_end - 1]


def endpoint(zone: str, gpu: str, tp_degree: int) -> Endpoint:
    """A replica as a p2p endpoint: its ``tp`` GPUs send their slices at once (Sailor: GPU count
    = min(tp, GPUs per node); TP never spans nodes, so that is tp)."""
    return Endpoint(zone=zone, gpu=gpu, num_gpus=tp_degree)


def boundary_transfer_s(
    network: NetworkModel, num_bytes: float, src: Endpoint, dst: Endpoint
) -> float:
    """Activation forward plus its gradient backward for one micro-batch over one replica pair."""
    return network.p2p_time_s(num_bytes, src, dst) + network.p2p_time_s(num_bytes, dst, src)


def dp_sync_bytes(profile: ModelProfile, layer_start: int, layer_end: int, regime: TrainingRegime) -> float:
    """Gradient bytes each data-parallel ring all-reduces.

    ``profile`` is that of the replica with the smallest TP degree: its GPU holds the stage's
    gradient divided by that degree (Sailor's rule for replicas of different TP).
    """
    return layer_table(profile).params(layer_start, layer_end) * regime.grad_bytes_per_param


def stage_dp_sync_s(network: NetworkModel, sync_bytes: float, zones_gpus: Sequence[tuple[str, str]]) -> float:
    """Bucketed ring all-reduce of ``sync_bytes`` over the replicas (one GPU per side, as Sailor)."""
    if len(zones_gpus) <= 1:
        return 0.0
    # One Endpoint per distinct (zone, GPU), repeated: the network compares and hashes the ring's
    # members, which is quick for the same object (it answers exactly as for equal ones).
    distinct = {zg: Endpoint(zone=zg[0], gpu=zg[1]) for zg in dict.fromkeys(zones_gpus)}
    if len(distinct) == 1:  # what allreduce_time_s does for a ring at one endpoint, without its scan
        return network.uniform_allreduce_time_s(sync_bytes, next(iter(distinct.values())), len(zones_gpus))
    return network.allreduce_time_s(sync_bytes, [distinct[zg] for zg in zones_gpus])

