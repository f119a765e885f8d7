"""Analytic (roofline-style) estimate of per-layer forward and backward time.

For one layer on one GPU of a TP group of t, a micro-batch of ``b`` sequences of ``s`` tokens:

    compute_s = fwd_flops(b, s) / peak            (peak: the GPU's matmul peak for the regime)
    memory_s  = (2 * activation_bytes(b) + params_read * weight_bytes [+ eager-score passes]) / memory_bw
    comm_s    = n_allreduce * (latency + 2(t-1)/t * b*s*h*bytes / (tp_link_bw * bw_efficiency))
    fwd_s     = max(kc_fwd * compute_s + km_fwd * memory_s + comm_s, c_fwd * kernels)
    bwd_s     = max(2 * kc_bwd * compute_s + 2 * km_bwd * memory_s + comm_s, c_bwd * 2 * kernels)

FLOPs and bytes come from first principles (``sailor_core.catalog.layers``): every tensor saved
for backward is written once and read once in the forward pass (hence 2x), the weights are
read once (a tied head reads the embedding matrix it does not count: ``params_read``), and the
backward pass does twice the forward's matmul work and traffic.  With eager attention the (heads x s x s) scores make six passes through memory (Q K^T, mask, softmax in and
out, P V).  Megatron TP all-reduces a block's output twice per pass (attention, MLP) and the
embedding's and head's once.  Matmuls, element-wise kernels and all-reduces run one after
another, so their times add; the CPU issues kernels ahead of the GPU, so a layer takes at least
the time to launch its kernels (``c`` per kernel, ``kernels`` counted from the layer's operators,
twice as many backward) whatever the work (the ``max``), which is what small micro-batches show.

Calibrated per (GPU type, regime) on that GPU's measured profiles, per direction:
``kc = 1 / achieved matmul efficiency`` (>= 1), ``km`` = counted traffic's slowdown against the
memory bandwidth (element-wise kernels move more than the saved tensors; fitted only where
models of different widths were measured, since one model's compute and traffic grow together,
else 1), the launch time per kernel ``c`` (at most 50 us and never above what a measured block
allows); fitted on TP-1 profiles.  Then the TP all-reduce latency and achieved fraction of the
intra-node bandwidth, on TP > 1 profiles (defaults where there are none).  ``tp_link_bw`` is the
link the TP group really runs on: Sailor's measured intra-node curve for that GPU and group size
(RTX cards over PCIe: 1.3-6 GB/s per GPU at TP 8, 50-250 GB/s on NVLink parts), else the
catalog's NVLink or PCIe figure (``NetworkModel.tp_bandwidth_bytes_per_s``).

A GPU never profiled borrows the calibration of the most similar profiled GPU (closest matmul
peak and memory bandwidth): efficiencies and floors are taken to carry over, while peak,
bandwidths and link are the target's own (its TP link as measured: no borrowed TP latency or
efficiency).  When the model was measured on the reference GPU, the
target's time is the reference's *measured* time scaled by the ratio of the two analytic times,
so the model only has to get the ratio right.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog.gpus import GPUSpec, get_gpu
from sailor_core.catalog.layers import LayerShape, layer_shapes
from sailor_core.catalog.models import get_model
from sailor_core.network.model import default_network
from sailor_core.regimes import TrainingRegime, get_regime

# Used only when no GPU of the regime has been profiled at all.
DEFAULT_INV_EFFICIENCY = 2.0
DEFAULT_OVERHEAD_S = 5e-6
DEFAULT_TP_LATENCY_S = 30e-6
DEFAULT_TP_BW_EFFICIENCY = 0.7
_MEMORY_FACTOR_RANGE = (0.5, 20.0)
# Eager PyTorch/Megatron spend 5-50 us of CPU per operator; a larger fitted floor would only be
# absorbing a misfit elsewhere and would not carry over to another GPU.
MAX_LAUNCH_S_PER_KERNEL = 50e-6
_EAGER_SCORE_PASSES = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Calibrated constants of the analytic model for one (GPU type, regime)."""

    gpu: str
    regime: str
    fwd_inv_efficiency: float  # 1 / achieved fraction of matmul peak, forward
    fwd_overhead_s: float  # launch time per kernel, forward (a layer's floor: x its kernels)
    bwd_inv_efficiency: float
    bwd_overhead_s: float
    # achieved fraction of memory bandwidth, inverted, on the counted traffic (1: as counted)
    fwd_memory_factor: float = 1.0
    bwd_memory_factor: float = 1.0
    tp_latency_s: float = DEFAULT_TP_LATENCY_S  # per TP all-reduce
    tp_bw_efficiency: float = DEFAULT_TP_BW_EFFICIENCY  # achieved fraction of the intra-node link
    num_points: int = 0  # distinct measured layers it was fitted on (0: defaults)
    # models whose profiles were left out: measured on the GPU's plain-fp32 path, not the
    # regime's faster one (``off_datapath_models``)
    left_out_models: tuple[str, ...] = ()
    # such models kept in: without them too few model widths remain to fit the constants
    off_datapath_kept: tuple[str, ...] = ()

    @property
    def describe(self) -> str:
        return (
            f"{self.gpu}/{self.regime}: matmul efficiency fwd {1 / self.fwd_inv_efficiency:.0%} "
            f"bwd {1 / self.bwd_inv_efficiency:.0%}, memory traffic x{self.fwd_memory_factor:.2f} fwd "
            f"x{self.bwd_memory_factor:.2f} bwd, launch per kernel fwd {self.fwd_overhead_s * 1e6:.1f} us "
            f"bwd {self.bwd_overhead_s * 1e6:.1f} us, TP all-reduce {self.tp_latency_s * 1e6:.0f} us + "
            f"{self.tp_bw_efficiency:.0%} of link ({self.num_points} points)"
            + (f"; left out, measured on the plain fp32 path: {', '.join(self.left_out_models)}" if self.left_out_models else "")
            + (f"; measured on the plain fp32 path but kept (too few model widths without them): "
               f"{', '.join(self.off_datapath_kept)}" if self.off_datapath_kept else "")
        )


def default_calibration(gpu: str, regime: str) -> Calibration:
    return Calibration(
        gpu=gpu,
        regime=regime,
        fwd_inv_efficiency=DEFAULT_INV_EFFICIENCY,
        fwd_overhead_s=DEFAULT_OVERHEAD_S,
        bwd_inv_efficiency=DEFAULT_INV_EFFICIENCY,
        bwd_overhead_s=DEFAULT_OVERHEAD_S,
    )


def matmul_peak_flops(gpu: GPUSpec, regime: TrainingRegime) -> float:
    # On GPUs with TF32 tensor cores (gpus.json "tf32") an fp32 framework's matmuls run at half
    # the bf16 tensor-core peak, at the plain fp32 peak elsewhere.
    if regime.matmul_precision == "bf16":
        return gpu.peak_bf16_flops
    if regime.matmul_precision == "tf32" and gpu.tf32:
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
    num_heads: int = 0,
) -> tuple[float, float, int, float, int]:
    """Forward terms of one layer: (matmul s at peak, memory-traffic s, number of TP all-reduces,
    all-reduce wire s at the full intra-node bandwidth, kernel launches)."""
    b, s = micro_batch_size, seq_len
    compute_s = shape.fwd_flops(b, s) / matmul_peak_flops(gpu, regime)
    traffic = 2 * shape.traffic_bytes(b) + shape.params_read * regime.weight_bytes_per_param
    if regime.attention_kernel == "eager" and shape.kind == "block" and num_heads:
        # six passes over the scores; the saved-tensor count above covered two
        traffic += (_EAGER_SCORE_PASSES - 2) * b * (num_heads // tp_degree) * s * s * regime.activation_bytes_per_element
    memory_s = traffic / gpu.memory_bw_bytes_per_s
    if tp_degree == 1 or not hidden_size:
        return compute_s, memory_s, 0, 0.0, shape.num_kernels
    num_allreduce = 2 if shape.kind == "block" else 1
    message = b * s * hidden_size * regime.activation_bytes_per_element
    link_bw = default_network().tp_bandwidth_bytes_per_s(gpu.name, tp_degree, message)
    wire_s = num_allreduce * 2 * (tp_degree - 1) / tp_degree * message / link_bw
    return compute_s, memory_s, num_allreduce, wire_s, shape.num_kernels


def _combine(compute_s, memory_s, num_allreduce, wire_s, kernels, cal: Calibration) -> tuple[float, float]:
    comm_s = num_allreduce * cal.tp_latency_s + wire_s / cal.tp_bw_efficiency
    fwd = max(
        compute_s * cal.fwd_inv_efficiency + memory_s * cal.fwd_memory_factor + comm_s, cal.fwd_overhead_s * kernels
    )
    bwd = max(
        2 * compute_s * cal.bwd_inv_efficiency + 2 * memory_s * cal.bwd_memory_factor + comm_s,
        cal.bwd_overhead_s * 2 * kernels,
    )
    return fwd, bwd


def predict_layer(
    shape: LayerShape,
    gpu: GPUSpec,
    regime: TrainingRegime,
    micro_batch_size: int,
    seq_len: int,
    cal: Calibration,
    tp_degree: int = 1,
    hidden_size: int = 0,
    num_heads: int = 0,
) -> tuple[float, float]:
    """(fwd_s, bwd_s) of one layer from the analytic model and a calibration."""
    terms = analytic_terms(shape, gpu, regime, micro_batch_size, seq_len, tp_degree, hidden_size, num_heads)
    return _combine(*terms, cal)


@lru_cache(maxsize=4096)
def predict_model(
    model: str, gpu: str, tp_degree: int, micro_batch_size: int, seq_len: int, regime: str, cal: Calibration
) -> tuple[tuple[float, float], ...]:
    """(fwd_s, bwd_s) per layer index of a whole model (cached: the DB asks repeatedly)."""
    spec = get_gpu(gpu)
    reg = get_regime(regime)
    if cal.gpu != spec.name:
        # A borrowed calibration's TP constants describe the reference's link; the target's is
        # its own measured one (``tp_bandwidth_bytes_per_s``), taken as achieved.
        cal = dataclasses.replace(cal, tp_latency_s=DEFAULT_TP_LATENCY_S, tp_bw_efficiency=1.0)
    shapes = layer_shapes(model, tp_degree=tp_degree, seq_len=seq_len, regime=reg)
    m = get_model(model)
    # A model's blocks are alike but for their index, which the analytic model does not read
    # (``_terms_key``): each distinct layer is predicted once.
    seen: dict[tuple, tuple[float, float]] = {}
    out = []
    for s in shapes:
        key = _terms_key(s)
        times = seen.get(key)
        if times is None:
            times = seen[key] = predict_layer(s, spec, reg, micro_batch_size, seq_len, cal, tp_degree,
                                              m.hidden_size, m.num_heads)
        out.append(times)
    return tuple(out)


def _terms_key(shape: LayerShape) -> tuple:
    """What ``analytic_terms`` reads of a layer's shape (all of it but its index)."""
    return (shape.kind, shape.params_read, shape.fwd_flops_per_token, shape.activation_bytes_per_seq,
            shape.activation_bytes_fixed, shape.num_kernels)


def _fit_three(points: Sequence[tuple], *, fit_memory: bool) -> tuple[float, float, float]:
    """Weighted least squares of y = max(kc*x + km*m + z, c*q): (kc, km, c).

    Points are (x, m, z, q, y, weight, is_block); kc >= 1 (nothing beats peak), km in [0.5, 20],
    and 0 <= c <= min(y/q) over the blocks (no measured block is faster than its launch floor;
    blocks are timed directly in every source, embedding and head times may be split estimates).  For each candidate
    floor the two factors are a linear least-squares fit over the points above it; the floor
    with the smallest error over all points wins.  Without ``fit_memory`` (one model only:
    compute and traffic grow together and cannot be told apart) km stays 1, the counted traffic.
    """
    import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

    arr = np.asarray(points, dtype=float)
    x, m, z, q, y, w, is_block = (arr[:, i] for i in range(7))
    blocks = is_block > 0
    c_max = min(float(np.min((y / q)[blocks] if blocks.any() else y / q)), MAX_LAUNCH_S_PER_KERNEL)
    sw = np.sqrt(w)

    def factors(mask):
        xs, ms, ys, ws = x[mask], m[mask], (y - z)[mask], sw[mask]
        if fit_memory and mask.sum() >= 3:
            (kc, km), *_ = np.linalg.lstsq(np.stack([xs * ws, ms * ws], axis=1), ys * ws, rcond=None)
            km = float(np.clip(km, _MEMORY_FACTOR_RANGE[0], _MEMORY_FACTOR_RANGE[1]))
        else:
            km = 1.0
        rest = ys - km * ms
        kc = float(np.sum(ws * ws * xs * rest) / max(np.sum(ws * ws * xs * xs), 1e-300))
        return max(kc, 1.0), km

    best = (float("inf"), 1.0, 1.0, 0.0)
    for c in np.concatenate([[0.0], np.logspace(-7, np.log10(c_max), 80)]):
        mask = y > c * q * 1.0001
        if mask.sum() < 2:
            continue
        kc, km = factors(mask)
        loss = float(np.sum(w * (np.maximum(kc * x + km * m + z, c * q) - y) ** 2))
        if loss < best[0]:
            best = (loss, kc, km, float(c))
    return best[1], best[2], best[3]


def _fit_comm(
    points: list[tuple], kf: float, cf: float, kb: float, cb: float, mf: float = 1.0, mb: float = 1.0
) -> tuple[float, float]:
    """Latency and bandwidth efficiency of TP all-reduces, with the compute constants fixed.

    Points are (compute_s, memory_s, num_allreduce, wire_s, kernels, fwd_s, bwd_s or None, weight)."""
    import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

    arr = np.asarray([(*p[:6], p[6] if p[6] is not None else -1.0, p[7]) for p in points], dtype=float)
    x, m, n, wire, q, yf, yb, w = (arr[:, i] for i in range(8))
    has_b = yb >= 0
    lat = np.concatenate([[0.0], np.logspace(-6, -2, 60)])[:, None, None]
    eff = np.logspace(-2.5, 0, 60)[None, :, None]
    comm = n * lat + wire / eff  # (L, E, N)
    pf = np.maximum(kf * x + mf * m + comm, cf * q)
    pb = np.maximum(2 * kb * x + 2 * mb * m + comm, cb * 2 * q)
    loss = (w * (pf - yf) ** 2).sum(axis=2) + (w * np.where(has_b, (pb - yb) ** 2, 0.0)).sum(axis=2)
    i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return float(lat[i, 0, 0]), float(eff[0, j, 0])


def off_datapath_models(profiles: Iterable, gpu: str, regime: str) -> frozenset[str]:
    """Models whose profiles on ``gpu`` ran their matmuls on the plain fp32 path although the
    regime says TF32 (or another path faster than plain fp32).

    Whether an fp32 framework uses TF32 is a library default, not part of the regime's name
    (PyTorch turned TF32 matmuls off by default in 1.12), so two runs of one framework on one
    GPU can differ by the TF32/fp32 peak ratio (8x on an A100).  A block measured above the
    plain fp32 peak proves the faster path for its model; a model at least as wide as such a
    proven one (larger matmuls are never less efficient) that never got above the plain fp32
    peak ran on the plain path, and one calibration cannot describe both (Sailor's OPT-30 and
    LLaMA-3-8 on A100-40 run at 15-18 TFLOPS, 80-93 % of the 19.5 plain peak, its OPT-350 and
    GPT-Neo-2.7 at 30-78 TFLOPS).  Nothing is left out when no model proves the faster path.
    """
    spec = get_gpu(gpu)
    reg = get_regime(regime)
    plain_peak = spec.peak_fp32_flops
    if matmul_peak_flops(spec, reg) <= plain_peak:
        return frozenset()
    best = fastest_block_flops(profiles, spec.name, reg.name)
    proven = [get_model(m).hidden_size for m, rate in best.items() if rate > plain_peak]
    if not proven:
        return frozenset()
    narrowest = min(proven)
    return frozenset(m for m, rate in best.items() if rate <= plain_peak and get_model(m).hidden_size >= narrowest)


def fastest_block_flops(profiles: Iterable, gpu: str, regime: str) -> dict[str, float]:
    """{model: FLOP/s of its fastest measured transformer block on ``gpu`` under ``regime``}, a
    block's forward or backward (twice the forward's FLOPs), over every TP degree and micro-batch
    size: above the GPU's plain fp32 peak it proves a faster matmul path (TF32)."""
    reg = get_regime(regime)
    best: dict[str, float] = {}
    for p in profiles:
        if p.gpu != gpu or p.regime != reg.name:
            continue
        shapes = layer_shapes(p.model, tp_degree=p.tp_degree, seq_len=p.seq_len, regime=reg)
        if len(shapes) != len(p.layers):
            continue
        for layer, shape in zip(p.layers, shapes, strict=True):
            if shape.kind != "block" or not layer.measured:
                continue
            flops = shape.fwd_flops(p.micro_batch_size, p.seq_len)
            rate = max(flops / layer.fwd_s if layer.fwd_s > 0 else 0.0, 2 * flops / layer.bwd_s if layer.bwd_s > 0 else 0.0)
            best[p.model] = max(best.get(p.model, 0.0), rate)
    return best


# Matmul efficiency, memory traffic and launch time per kernel are told apart only by blocks
# of different widths (their FLOPs, bytes and kernels scale differently): with two widths left
# the fit parks the narrower model's slow backward in the launch time (A100-40 without its
# TF32-off models: 46 us per backward kernel, the tiny test model 2.8x slower than on an
# A100-80), so a datapath is left out while three widths remain, or one (``_fits_without``).
_WIDTHS_TO_FIT = 3


def _fits_without(num_widths: int) -> bool:
    """Whether the models left after the off-datapath ones, of ``num_widths`` widths, fit the
    constants alone: three widths and more tell all three apart; one fits efficiency and launch
    time with the traffic as counted (as on every GPU with one model), which the off-path models
    would only skew; two would fit the traffic too and degenerate, and keep them as anchors."""
    return num_widths == 1 or num_widths >= _WIDTHS_TO_FIT


def _widths_left(profiles: Sequence, gpu: str, regime: str, left_out: frozenset[str]) -> int:
    """Distinct hidden sizes among ``gpu``'s TP-1 profiles under ``regime`` outside ``left_out``."""
    return len({get_model(p.model).hidden_size for p in profiles
                if p.gpu == gpu and p.regime == regime and p.tp_degree == 1 and p.model not in left_out})


def calibrate(profiles: Iterable, gpu: str, regime: str) -> Calibration:
    """Fit the constants on measured layer times of ``gpu`` under ``regime``.

    Identical transformer blocks are fitted once, weighted by how many there are, and errors are
    relative to the profile's whole-model time, so every profile counts alike.  The
    embedding's backward is skipped: Sailor's profiler reports it as ~0 (a hook artifact).
    Compute constants come from TP-1 profiles (all profiles when there are too few), the
    all-reduce constants from TP > 1 profiles.  Models measured on another matmul datapath
    than the regime's are left out (``off_datapath_models``) while the widths that remain fit
    the constants (``_fits_without``); otherwise kept and named in the description.
    """
    spec = get_gpu(gpu)
    reg = get_regime(regime)
    profiles = list(profiles)
    off_path = off_datapath_models(profiles, spec.name, reg.name)
    left_out = off_path if _fits_without(_widths_left(profiles, spec.name, reg.name, off_path)) else frozenset()
    # (tp, compute, memory, n_allreduce, wire, kernels, fwd, bwd|None, weight, is_block)
    points: list[tuple] = []
    block_models: set[int] = set()  # hidden sizes seen: traffic/FLOP differs between them
    for p in profiles:
        if p.gpu != spec.name or p.regime != reg.name or p.model in left_out:
            continue
        shapes = layer_shapes(p.model, tp_degree=p.tp_degree, seq_len=p.seq_len, regime=reg)
        m = get_model(p.model)
        if len(shapes) != len(p.layers):
            continue
        counts: dict[tuple[float, float], int] = {}
        rows: dict[tuple[float, float], tuple[int, LayerShape]] = {}
        for i, (layer, shape) in enumerate(zip(p.layers, shapes, strict=True)):
            if not layer.measured or layer.fwd_s <= 0:
                continue
            key = (layer.fwd_s, layer.bwd_s)
            counts[key] = counts.get(key, 0) + 1
            rows.setdefault(key, (i, shape))
        total_t = p.fwd_bwd_s() or 1.0
        if p.tp_degree == 1:
            block_models.add(m.hidden_size)
        for key, (i, shape) in rows.items():
            terms = analytic_terms(shape, spec, reg, p.micro_batch_size, p.seq_len, p.tp_degree, m.hidden_size, m.num_heads)
            fwd, bwd = key
            # n identical layers make n times the error; relative to the model's time
            weight = (counts[key] / total_t) ** 2
            points.append((p.tp_degree, *terms, fwd, bwd if i > 0 and bwd > 0 else None, weight, shape.kind == "block"))
    single = [pt for pt in points if pt[0] == 1]
    base = single if len(single) >= 4 else points

    def comm(n, w):
        return n * DEFAULT_TP_LATENCY_S + w / DEFAULT_TP_BW_EFFICIENCY

    fwd_pts = [(c, mem, comm(n, w), q, f, wt, blk) for _, c, mem, n, w, q, f, _, wt, blk in base]
    bwd_pts = [
        (2 * c, 2 * mem, comm(n, w), 2 * q, b, wt, blk) for _, c, mem, n, w, q, _, b, wt, blk in base if b is not None
    ]
    if len(fwd_pts) < 2 or len(bwd_pts) < 2:
        return dataclasses.replace(default_calibration(spec.name, reg.name), left_out_models=tuple(sorted(left_out)),
                                   off_datapath_kept=tuple(sorted(off_path - left_out)))
    fit_memory = len(block_models) >= 2
    kf, mf, cf = _fit_three(fwd_pts, fit_memory=fit_memory)
    kb, mb, cb = _fit_three(bwd_pts, fit_memory=fit_memory)
    multi = [pt[1:-1] for pt in points if pt[0] > 1]
    lat, eff = (
        _fit_comm(multi, kf, cf, kb, cb, mf, mb) if len(multi) >= 2 else (DEFAULT_TP_LATENCY_S, DEFAULT_TP_BW_EFFICIENCY)
    )
    return Calibration(
        gpu=spec.name,
        regime=reg.name,
        fwd_inv_efficiency=kf,
        fwd_overhead_s=cf,
        bwd_inv_efficiency=kb,
        bwd_overhead_s=cb,
        fwd_memory_factor=mf,
        bwd_memory_factor=mb,
        tp_latency_s=lat,
        tp_bw_efficiency=eff,
        num_points=len(points),
        left_out_models=tuple(sorted(left_out)),
        off_datapath_kept=tuple(sorted(off_path - left_out)),
    )


@lru_cache(maxsize=1024)
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
