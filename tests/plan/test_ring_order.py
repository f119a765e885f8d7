"""A stage's replicas, in plan order, are its data-parallel ring (plan.types.Stage): the engine's
groups keep that order, and the embedding group is the first stage's replicas then the last's."""

from sailor_core.plan.layout import replica_ranks
from sailor_core.plan.types import plan_from_dict


def _plan(zones_per_stage, tp=2):
    stages, start = [], 0
    for zones in zones_per_stage:
        stages.append({"layers": [start, start + 1],
                       "replicas": [{"gpu": "A100-40", "zone": z, "tp": tp} for z in zones]})
        start += 1
    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 1, "stages": stages},
                          validate=False)


def test_the_engine_s_rings_keep_the_replica_order():
    # torch.distributed.new_group orders a group's members by global rank, so a ring follows
    # the plan's replica order exactly when the ranks rise along it (plan.layout numbers them
    # stage by stage, replica by replica).
    plan = _plan([["us-central1-b", "us-central1-a", "us-central1-b"], ["us-central1-a", "us-central1-a"],
                  ["us-central1-b", "us-central1-a"]])
    for s, stage in enumerate(plan.stages):
        for t in range(2):
            ring = [replica_ranks(plan, s, r)[t] for r in range(stage.dp_degree)]
            assert ring == sorted(ring)
    embedding = [replica_ranks(plan, s, r)[0] for s in (0, len(plan.stages) - 1)
                 for r in range(plan.stages[s].dp_degree)]
    assert embedding == sorted(embedding)
