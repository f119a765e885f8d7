"""What the simulator returns: the iteration time by named parts, memory, fit, cost, throughput."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sailor_core.simulator.memory import MemoryBreakdown

BREAKDOWN_KEYS = ("compute", "bubble", "p2p", "dp_sync", "update")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaResult:
    gpu: str
    tp_degree: int
    zone: str
    num_microbatches: int
    fwd_s: float  # one micro-batch
    bwd_s: float
    update_s: float
    memory: MemoryBreakdown
    profile_source: str
    measured: bool  # every layer time of this stage measured (not estimated)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "tp": self.tp_degree,
            "zone": self.zone,
            "num_microbatches": self.num_microbatches,
            "fwd_s": self.fwd_s,
            "bwd_s": self.bwd_s,
            "update_s": self.update_s,
            "peak_memory_bytes": self.memory.peak_bytes,
            "memory": self.memory.to_dict(),
            "fits": self.memory.fits,
            "profile_source": self.profile_source,
            "measured": self.measured,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StageResult:
    index: int
    layer_start: int
    layer_end: int
    replicas: tuple[ReplicaResult, ...]
    straggler: int  # replica index with the slowest forward + backward
    compute_s_per_microbatch: float  # the straggler's forward + backward
    num_microbatches: int  # the most any replica of the stage processes
    p2p_s_per_microbatch: float  # to the next stage and back (0 for the last stage)
    p2p_bytes_per_microbatch: int  # activation bytes sent to the next stage
    dp_sync_s: float
    dp_sync_bytes: float
    update_s: float  # the slowest replica's optimizer step

    @property
    def peak_memory_bytes(self) -> int:
        return max(r.memory.peak_bytes for r in self.replicas)

    @property
    def fits(self) -> bool:
        return all(r.memory.fits for r in self.replicas)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "layers": [self.layer_start, self.layer_end],
            "dp_degree": len(self.replicas),
            "straggler": self.straggler,
            "compute_s_per_microbatch": self.compute_s_per_microbatch,
            "num_microbatches": self.num_microbatches,
            "p2p_s_per_microbatch": self.p2p_s_per_microbatch,
            "p2p_bytes_per_microbatch": self.p2p_bytes_per_microbatch,
            "dp_sync_s": self.dp_sync_s,
            "dp_sync_bytes": self.dp_sync_bytes,
            "update_s": self.update_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "replicas": [r.to_dict() for r in self.replicas],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """One plan's simulated iteration.  ``breakdown`` parts sum to ``iteration_time_s``."""

    iteration_time_s: float
    breakdown: dict[str, float]
    throughput_samples_per_s: float
    tokens_per_s: float
    usd_per_iteration: float
    usd_per_hour: float  # GPU rent only
    gpu_usd_per_iteration: float
    egress_usd_per_iteration: float
    peak_memory_bytes: int  # the largest over all GPUs
    fits: bool
    why_not: str | None
    bottleneck: str
    num_gpus: int
    num_microbatches: int
    global_batch_size: int
    seq_len: int
    regime: str
    stages: tuple[StageResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_time_s": self.iteration_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "usd_per_iteration": self.usd_per_iteration,
            "usd_per_hour": self.usd_per_hour,
            "gpu_usd_per_iteration": self.gpu_usd_per_iteration,
            "egress_usd_per_iteration": self.egress_usd_per_iteration,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "why_not": self.why_not,
            "breakdown": dict(self.breakdown),
            "bottleneck": self.bottleneck,
            "num_gpus": self.num_gpus,
            "num_microbatches": self.num_microbatches,
            "global_batch_size": self.global_batch_size,
            "seq_len": self.seq_len,
            "regime": self.regime,
            "stages": [s.to_dict() for s in self.stages],
        }
