"""Analytic (roofline-style) estimate of per-layer forward and backward time.

For one layer on one GPU, a micro-batch of ``b`` sequences of ``s`` tokens:

    compute_s = fwd_flops(b, s) / peak            (peak: the GPU's matmul peak for the regime)
    memory_s  = (2 * activation_bytes(b) + params * weight_bytes) / memory_bandwidth
    fwd_s     = compute_s * k_fwd + memory_s     + c_fwd
    bwd_s     = 2 * compute_s * k_bwd + 2 * memory_s + c_bwd

FLOPs and bytes come from first principles (``sailor_core.catalog.layers``): every tensor saved
for backward is written once and read once in the forward pass (hence 2x), the weights are
read once, and the backward pass does twice the forward's matmul work and traffic.  Matmuls
and element-wise kernels run one after another, so their times add.

Only four numbers are calibrated per (GPU type, regime), on that GPU's measured profiles:
``k = 1 / achieved matmul efficiency`` and ``c``, a fixed per-layer launch/framework overhead,
for each direction.  A GPU never profiled borrows the calibration of the most similar
profiled GPU (closest matmul peak and memory bandwidth): efficiency and overheads are taken
to carry over, while peak and bandwidth are the target's own.  When the model was measured on
the reference GPU, the target's time is the reference's *measured* time scaled by the ratio of
the two analytic times, so the model only has to get the ratio right.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog.gpus import GPUSpec, get_gpu
from sailor_core.catalog.layers import LayerShape, layer_shapes
from sailor_core.catalog.models import get_model
from sailor_core.regimes import TrainingRegime, get_regime

# GPUs with TF32 tensor cores (Ampere and later): an fp32 framework's matmuls run at half the
# bf16 tensor-core peak there, at the plain fp32 peak elsewhere.
_TF32_GPUS = frozenset({"A100-40", "A100-80", "H100-80", "H200", "GH-96", "L4", "A10G", "RTX-3090"})

# Used only when no GPU of the regime has been profiled at all.
DEFAULT_INV_EFFICIENCY = 2.0
DEFAULT_OVERHEAD_S = 50e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Calibrated constants of the analytic model for one (GPU type, regime)."""

    gpu: str
    regime: str
    fwd_inv_efficiency: float  # 1 / achieved fraction of matmul peak, forward
    fwd_overhead_s: float  # per layer, forward
    bwd_inv_efficiency: float
    bwd_overhead_s: float
    num_points: int  # distinct measured layers it was fitted on (0: defaults)

    @property
    def describe(self) -> str:
        return (
            f"{self.gpu}/{self.regime}: matmul efficiency fwd {1 / self.fwd_inv_efficiency:.0%} "
            f"bwd {1 / self.bwd_inv_efficiency:.0%}, overhead fwd {self.fwd_overhead_s * 1e6:.0f} us "
            f"bwd {self.bwd_overhead_s * 1e6:.0f} us ({self.num_points} points)"
        )


def default_calibration(gpu: str, regime: str) -> Calibration:
    return Calibration(
        gpu=gpu,
        regime=regime,
        fwd_inv_efficiency=DEFAULT_INV_EFFICIENCY,
        fwd_overhead_s=DEFAULT_OVERHEAD_S,
        bwd_inv_efficiency=DEFAULT_INV_EFFICIENCY,
        bwd_overhead_s=DEFAULT_OVERHEAD_S,
        num_points=0,
    )


def matmul_peak_flops(gpu: GPUSpec, regime: TrainingRegime) -> float:
    if regime.matmul_precision == "bf16":
        return gpu.peak_bf16_flops
    if regime.matmul_precision == "tf32" and gpu.name in _TF32_GPUS:
        return gpu.peak_bf16_flops / 2
    return gpu.peak_fp32_flops


def analytic_terms(
    shape: LayerShape,
    gpu: GPUSpec,
    regime: TrainingRegime,
    micro_batch_size: int,
    seq_len: int,
    tp_degree: int = 1,
    hidden_size: int = 0,
) -> tuple[float, float]:
    """(forward matmul seconds at peak, forward memory-traffic + TP-communication seconds)."""
    compute_s = shape.fwd_flops(micro_batch_size, seq_len) / matmul_peak_flops(gpu, regime)
    traffic = 2 * shape.activation_bytes(micro_batch_size) + shape.params * regime.weight_bytes_per_param
    memory_s = traffic / gpu.memory_bw_bytes_per_s
    if tp_degree > 1 and hidden_size:
        # Megatron TP all-reduces the layer's output inside the node: two per block (attention,
        # MLP), one for the vocab-parallel embedding and head; ring cost 2(t-1)/t x message.
        num_allreduce = 2 if shape.kind == "block" else 1
        message = micro_batch_size * seq_len * hidden_size * regime.activation_bytes_per_element
        memory_s += num_allreduce * 2 * (tp_degree - 1) / tp_degree * message / gpu.intra_node_bw_bytes_per_s
    return compute_s, memory_s


def predict_layer(
    shape: LayerShape,
    gpu: GPUSpec,
    regime: TrainingRegime,
    micro_batch_size: int,
    seq_len: int,
    cal: Calibration,
    tp_degree: int = 1,
    hidden_size: int = 0,
) -> tuple[float, float]:
    """(fwd_s, bwd_s) of one layer from the analytic model and a calibration."""
    compute_s, memory_s = analytic_terms(shape, gpu, regime, micro_batch_size, seq_len, tp_degree, hidden_size)
    fwd = compute_s * cal.fwd_inv_efficiency + memory_s + cal.fwd_overhead_s
    bwd = 2 * compute_s * cal.bwd_inv_efficiency + 2 * memory_s + cal.bwd_overhead_s
    return fwd, bwd


@lru_cache(maxsize=4096)
def predict_model(
    model: str, gpu: str, tp_degree: int, micro_batch_size: int, seq_len: int, regime: str, cal: Calibration
) -> tuple[tuple[float, float], ...]:
    """(fwd_s, bwd_s) per layer index of a whole model (cached: the DB asks repeatedly)."""
    spec = get_gpu(gpu)
    reg = get_regime(regime)
    shapes = layer_shapes(model, tp_degree=tp_degree, seq_len=seq_len, regime=reg)
    hidden = get_model(model).hidden_size
    return tuple(predict_layer(s, spec, reg, micro_batch_size, seq_len, cal, tp_degree, hidden) for s in shapes)


def _fit_two(points: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least squares of y = k*x + c with k >= 1, c >= 0; points are (x, y, weight)."""
    import numpy as np

    arr = np.asarray(points, dtype=float)
    x, y, w = arr[:, 0], arr[:, 1], np.sqrt(arr[:, 2])
    design = np.stack([x * w, w], axis=1)
    (k, c), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if k < 1.0 or not math.isfinite(k):  # faster than peak is impossible: clamp and refit c
        k = 1.0
        c = float(np.sum(w * w * (y - x)) / np.sum(w * w))
    if c < 0.0:
        c = 0.0
        k = max(1.0, float(np.sum(w * w * x * y) / max(np.sum(w * w * x * x), 1e-30)))
    return float(k), float(c)


def calibrate(profiles: Iterable, gpu: str, regime: str) -> Calibration:
    """Fit the four constants on measured layer times of ``gpu`` under ``regime``.

    Identical transformer blocks are fitted once, weighted by how many there are, and errors are
    relative to the profile's whole-model time, so every profile counts alike.  The
    embedding's backward is skipped: Sailor's profiler reports it as ~0 (a hook artifact).
    """
    spec = get_gpu(gpu)
    reg = get_regime(regime)
    fwd_pts: list[tuple[float, float, float]] = []
    bwd_pts: list[tuple[float, float, float]] = []
    for p in profiles:
        if p.gpu != spec.name or p.regime != reg.name:
            continue
        shapes = layer_shapes(p.model, tp_degree=p.tp_degree, seq_len=p.seq_len, regime=reg)
        hidden = get_model(p.model).hidden_size
        if len(shapes) != len(p.layers):
            continue
        counts: dict[tuple[float, float], int] = {}
        rows: dict[tuple[float, float], tuple[int, LayerShape]] = {}
        for i, (layer, shape) in enumerate(zip(p.layers, shapes, strict=True)):
            if not layer.measured:
                continue
            k = (layer.fwd_s, layer.bwd_s)
            counts[k] = counts.get(k, 0) + 1
            rows.setdefault(k, (i, shape))
        total_t = p.fwd_bwd_s() or 1.0
        for key, (i, shape) in rows.items():
            compute_s, memory_s = analytic_terms(
                shape, spec, reg, p.micro_batch_size, p.seq_len, p.tp_degree, hidden
            )
            n = counts[key]
            fwd, bwd = key
            # n identical layers make n times the error; relative to the model's time
            weight = (n / total_t) ** 2
            if fwd > 0:
                fwd_pts.append((compute_s, fwd - memory_s, weight))
            if i > 0 and bwd > 0:
                bwd_pts.append((2 * compute_s, bwd - 2 * memory_s, weight))
    if len(fwd_pts) < 2 or len(bwd_pts) < 2:
        return default_calibration(spec.name, reg.name)
    kf, cf = _fit_two(fwd_pts)
    kb, cb = _fit_two(bwd_pts)
    return Calibration(
        gpu=spec.name,
        regime=reg.name,
        fwd_inv_efficiency=kf,
        fwd_overhead_s=cf,
        bwd_inv_efficiency=kb,
        bwd_overhead_s=cb,
        num_points=len(fwd_pts),
    )


def gpu_distance(a: str, b: str, regime: str) -> float:
    """How unlike two GPUs are for this model: log-distance of matmul peak and memory bandwidth."""
    reg = get_regime(regime)
    ga, gb = get_gpu(a), get_gpu(b)
    return abs(math.log(matmul_peak_flops(ga, reg) / matmul_peak_flops(gb, reg))) + abs(
        math.log(ga.memory_bw_bytes_per_s / gb.memory_bw_bytes_per_s)
    )


def optimizer_rate_s_per_param(regime: str, gpu: str, *, like_gpu: str | None = None, like_rate: float = 0.0) -> float:
    """Seconds per parameter of one optimizer step: memory-bound, so it scales with 1/bandwidth.

    With a measured rate on ``like_gpu`` the target's is that rate times the bandwidth ratio;
    without one it is the regime's bytes touched per parameter over the bandwidth.
    """
    target = get_gpu(gpu)
    if like_gpu is not None and like_rate > 0:
        return like_rate * get_gpu(like_gpu).memory_bw_bytes_per_s / target.memory_bw_bytes_per_s
    return get_regime(regime).optimizer_traffic_bytes_per_param / target.memory_bw_bytes_per_s
