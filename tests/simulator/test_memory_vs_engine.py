"""The memory model against what the engine lays out (no engine run): simulate's micro-batches
in flight per replica are the peak count of forwards without their backward in
``runtime/pipeline_order.rank_op_order`` (pure, no torch), also where the stages' replica counts
differ (the 1F1B lookahead counts in the widest stage's micro-batches) and where a replica runs
fewer micro-batches than its lookahead; ZeRO's step buffers are the engine's buckets'."""

import pytest

from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime.pipeline_order import rank_op_order
from sailor_core.simulator import simulate

SPLITS = {2: [[0, 4], [4, 8]], 3: [[0, 3], [3, 6], [6, 8]]}


def engine_inflight(num_mb: int, dps: list[int], stage: int, replica: int) -> int:
    live = peak = 0
    for kind, _ in rank_op_order(num_mb, dps, stage, replica):
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


DPS = [(2, 1), (2, 2), (2, 4), (2, 6), (1, 3), (2, 3), (3, 1, 2), (1, 2, 2)]


# each replica runs at least one micro-batch: the widest stage's degree is the fewest a plan may have
@pytest.mark.parametrize("dps,num_mb", [(dps, n) for dps in DPS for n in sorted({max(dps), 6, 16})])
def test_simulated_inflight_is_the_engines(dps, num_mb):
    rep = {"gpu": "cpu", "tp": 1}
    plan = plan_from_dict({"model": "small", "global_batch_size": 2 * num_mb, "micro_batch_size": 2,
                           "stages": [{"layers": span, "replicas": [rep] * d}
                                      for span, d in zip(SPLITS[len(dps)], dps)]})
    sim = simulate(plan)
    for i, d in enumerate(dps):
        for r in range(d):
            assert sim.stages[i].replicas[r].memory.num_inflight == engine_inflight(num_mb, list(dps), i, r), (i, r)


def test_the_modelled_bucket_is_the_engines():
    from sailor_core.runtime.allreduce import OverlappedAllReduce  # lazy: torch, for this check only
    from sailor_core.simulator.levers import ENGINE_BUCKET_BYTES

    assert ENGINE_BUCKET_BYTES == OverlappedAllReduce.BUCKET_BYTES


def test_zero_step_working_memory_holds_the_engines_buffers():
    """At K = 1 the step is the peak: ZeRO-1's all-gather holds its largest bucket and this rank's
    range of it (the model's bucket is the engine's cap, so at least the engine's); ZeRO-2's
    reduce-scatters hold a flat copy of every bucket beside the full gradients."""
    # lazy: torch, for the engine's bucket layout only
    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.allreduce import OverlappedAllReduce, buckets_of
    from sailor_core.runtime.model import StageModel
    from sailor_core.simulator.simulate import stage_memory_under

    params = list(StageModel(get_model("small"), 0, 4).parameters())
    n = sum(p.numel() for p in params)
    largest = max(sum(p.numel() for p in b) for b in buckets_of(params, OverlappedAllReduce.BUCKET_BYTES))
    z1, z2 = (stage_memory_under(("none", z, 2), "small", "cpu", 1, 2, 1, (0, 4), regime="torch-fp32-adamw")
              for z in (1, 2))
    assert 4 * (largest + largest // 2) <= z1.optimizer_working_bytes <= 4 * (OverlappedAllReduce.BUCKET_BYTES // 4) * 3 // 2
    assert z2.optimizer_working_bytes == 4 * 2 * n  # the full gradients and their flat copies
    assert z2.state_bytes == 4 * n + 8 * -(-n // 2)  # weights and this rank's AdamW states
