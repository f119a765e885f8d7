"""The process groups of one rank of a plan (created in the same order on every rank, as torch requires).

One TP group per replica with TP > 1; per stage either one DP group per TP rank (all replicas
share a TP degree: all-reduce shard gradients directly) or, when the replicas' TP degrees
differ, one group of all the stage's ranks in which every rank contributes its replica's FULL
gradient (TP-gathered) divided by its TP degree, so the sum over ranks is the sum over
replicas; each rank then takes its own shard back.  A tied embedding split over stages gets
its embedding group (Megatron's): every replica of the first and the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from sailor_core.catalog.models import get_model
from sailor_core.plan.layout import replica_ranks, stage_ranks
from sailor_core.plan.types import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Groups:
    tp: object | None          # this replica's TP group (None for TP 1)
    dp: object | None          # this rank's DP group (None when the stage has one replica)
    dp_mixed_tp: bool          # True: the DP group spans all stage ranks (replicas differ in TP)
    fwd: object                # world group for activations (downstream)
    bwd: object                # world group for gradients (upstream)
    tied: object | None = None  # embedding group: this rank's, when it holds a tied matrix of a multi-stage plan
    tied_mixed_tp: bool = False  # True: the embedding group sums full gradients (TP degrees differ)


def make_groups(plan: Plan, rank: int) -> Groups:
    """Create every group on every rank (same order everywhere), return this rank's.

    Activations and gradients travel in two separate world groups: with NCCL each
    group's pair has its own stream, so a stage's queued forward sends never wait
    behind a backward receive (which would deadlock 1F1B); gloo does not mind.
    """
    world = list(range(sum(rep.tp_degree for st in plan.stages for rep in st.replicas)))
    fwd, bwd = dist.new_group(world), dist.new_group(world)
    my_tp = my_dp = None
    mixed_mine = False
    for s, stage in enumerate(plan.stages):
        for r, rep in enumerate(stage.replicas):
            if rep.tp_degree > 1:
                ranks = replica_ranks(plan, s, r)
                g = dist.new_group(ranks)
                if rank in ranks:
                    my_tp = g
        if stage.dp_degree == 1:
            continue
        degrees = {rep.tp_degree for rep in stage.replicas}
        if len(degrees) == 1:
            for t in range(degrees.pop()):
                ranks = [replica_ranks(plan, s, r)[t] for r in range(stage.dp_degree)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    my_dp = g
        else:
            ranks = stage_ranks(plan, s)
            g = dist.new_group(ranks)
            if rank in ranks:
                my_dp, mixed_mine = g, True
    tied, tied_mixed = _embedding_group(plan, rank)
    return Groups(tp=my_tp, dp=my_dp, dp_mixed_tp=mixed_mine, fwd=fwd, bwd=bwd, tied=tied, tied_mixed_tp=tied_mixed)


def _embedding_group(plan: Plan, rank: int) -> tuple[object | None, bool]:
    """Create the embedding group(s) of a tied model split over stages (every rank, same order);
    (this rank's group or None, whether it sums full gradients)."""
    if not get_model(plan.model).tie_embeddings or len(plan.stages) == 1:
        return None, False
    ends = (0, len(plan.stages) - 1)
    replicas = [(s, r) for s in ends for r in range(plan.stages[s].dp_degree)]
    degrees = {plan.stages[s].replicas[r].tp_degree for s, r in replicas}
    if len(degrees) > 1:
        ranks = [k for s in ends for k in stage_ranks(plan, s)]
        g = dist.new_group(ranks)
        return (g if rank in ranks else None), True
    mine = None
    for t in range(degrees.pop()):
        ranks = [replica_ranks(plan, s, r)[t] for s, r in replicas]
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    return mine, False
