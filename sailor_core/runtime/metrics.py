"""What a step's metrics line holds beyond the loss: the figures counted once, on rank 0, from
what the step computes anyway.

Their costs (the benchmark: ``benchmarks/bench_metrics.py``, figures in BENCHMARKS.md):
- learning rate: the recipe's schedule at the step (arithmetic, no tensor);
- gradient norm: the one clipping computes already (``StageTrainer.clip_grads``); without
  clipping, each rank's share of its square rides in the step's status all-reduce;
- samples and tokens per second: the step's wall time, already measured;
- model FLOPs utilisation: the catalog's FLOPs per token (``catalog/layers.py``: forward, and
  twice that for backward) against the summed peak of the plan's GPUs for its regime
  (``profiles/estimator.matmul_peak_flops``); n/a (left out) where the plan runs on ``cpu``;
- memory high-water mark per rank: ``torch.cuda.max_memory_allocated`` on CUDA, the process's
  max RSS elsewhere; one number per rank in the status all-reduce (the same collective, a
  few more bytes).
"""

from __future__ import annotations

import resource
import sys

import torch

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.layers import layer_shapes
from sailor_core.plan.types import Plan
from sailor_core.profiles.estimator import matmul_peak_flops
from sailor_core.regimes import DEFAULT_REGIME, get_regime

BACKWARD_FLOPS_FACTOR = 2.0  # a backward pass costs twice its forward's matmul FLOPs


def model_flops_per_step(plan: Plan) -> float:
    """The model FLOPs of one optimizer step (forward + backward of every sample of the global
    batch, without recomputation): MFU's numerator."""
    seq_len = plan.effective_seq_len()
    per_token = sum(s.fwd_flops_per_token for s in layer_shapes(plan.model, seq_len=seq_len))
    return (1.0 + BACKWARD_FLOPS_FACTOR) * per_token * plan.global_batch_size * seq_len


def peak_flops(plan: Plan) -> float | None:
    """The summed matmul peak of the plan's GPUs under its regime (catalog), None when any
    replica runs on ``cpu`` (no peak to measure against)."""
    regime = get_regime(plan.regime or DEFAULT_REGIME)
    total = 0.0
    for stage in plan.stages:
        for r in stage.replicas:
            if r.gpu == "cpu":
                return None
            total += r.tp_degree * matmul_peak_flops(get_gpu(r.gpu), regime)
    return total


def peak_memory_bytes(device: torch.device) -> int:
    """This process's memory high-water mark: the CUDA allocator's on a GPU, the max RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux
