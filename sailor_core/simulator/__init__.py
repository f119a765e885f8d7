"""Simulator: iteration time (by named parts), peak memory, cost and throughput of a plan.

``simulate(plan)`` composes the per-stage building blocks in ``stage`` (compute,
p2p, DP sync, update), ``memory`` (peak bytes per GPU) and ``pipeline_time`` (1F1B)
through ``compose`` (iteration time by named parts, egress, cost), following the
routing rule of ``sailor_core.plan.routing``; the planner's fast path calls the same
functions.  No torch, no cloud SDK.
"""

from sailor_core.plan.routing import link_microbatches, microbatches_per_replica
from sailor_core.simulator.memory import MemoryBreakdown, inflight_microbatches, stage_memory
from sailor_core.simulator.result import BREAKDOWN_KEYS, ReplicaResult, SimResult, StageResult
from sailor_core.simulator.pipeline_time import PipelineTime, StageTiming, one_f_one_b_time, stage_timing
from sailor_core.simulator.simulate import simulate, stage_memory_for, stage_peak_memory_bytes
from sailor_core.simulator.stage import (
    boundary_bytes,
    boundary_transfer_s,
    dp_sync_bytes,
    stage_compute_s,
    stage_dp_sync_s,
    stage_params,
    stage_update_s,
)

__all__ = [
    "BREAKDOWN_KEYS",
    "MemoryBreakdown",
    "PipelineTime",
    "ReplicaResult",
    "SimResult",
    "StageTiming",
    "StageResult",
    "boundary_bytes",
    "boundary_transfer_s",
    "dp_sync_bytes",
    "inflight_microbatches",
    "link_microbatches",
    "microbatches_per_replica",
    "one_f_one_b_time",
    "simulate",
    "stage_compute_s",
    "stage_dp_sync_s",
    "stage_memory",
    "stage_memory_for",
    "stage_params",
    "stage_peak_memory_bytes",
    "stage_timing",
    "stage_update_s",
]
