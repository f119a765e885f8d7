"""Which rank plays which role in a plan (no torch import: the orchestrator uses it).

Ranks are numbered stage-major, then replica, then TP rank, so the GPUs of one
replica (one node) are consecutive: a stage's replica ``r`` with TP degree ``t``
owns ``t`` consecutive ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.plan.types import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class RankRole:
    rank: int
    stage: int
    replica: int
    tp_rank: int
    tp_degree: int
    layer_start: int  # inclusive
    layer_end: int  # exclusive
    gpu: str
    zone: str

    @property
    def replica_first_rank(self) -> int:
        """Rank of TP rank 0 of this replica."""
        return self.rank - self.tp_rank


def rank_layout(plan: Plan) -> list[RankRole]:
    roles: list[RankRole] = []
    for s, stage in enumerate(plan.stages):
        for r, rep in enumerate(stage.replicas):
            for t in range(rep.tp_degree):
                roles.append(
                    RankRole(
                        rank=len(roles),
                        stage=s,
                        replica=r,
                        tp_rank=t,
                        tp_degree=rep.tp_degree,
                        layer_start=stage.layer_start,
                        layer_end=stage.layer_end,
                        gpu=rep.gpu,
                        zone=rep.zone,
                    )
                )
    return roles


def world_size(plan: Plan) -> int:
    return sum(rep.tp_degree for stage in plan.stages for rep in stage.replicas)


def replica_ranks(plan: Plan, stage: int, replica: int) -> list[int]:
    """The ranks of one replica, TP rank order."""
    first = sum(rep.tp_degree for s in plan.stages[:stage] for rep in s.replicas)
    first += sum(rep.tp_degree for rep in plan.stages[stage].replicas[:replica])
    return list(range(first, first + plan.stages[stage].replicas[replica].tp_degree))


def stage_ranks(plan: Plan, stage: int) -> list[int]:
    return [r for rep in range(plan.stages[stage].dp_degree) for r in replica_ranks(plan, stage, rep)]
