"""ProfileDB: measured per-layer profiles, and estimates for everything never measured.

``get`` answers any (model, GPU, TP, micro-batch, sequence length), in this order:

1. the stored profile of exactly that key;
2. the same model measured on the same GPU at another (TP, mbs, seq): its measured times scaled
   by the ratio of the analytic model's times (calibrated on this GPU) at the two keys, read
   between the measured micro-batch sizes of one (TP, seq) curve so that no layer's estimate
   gets faster with a bigger micro-batch (``ProfileDB._scaled``);
3. another model measured on the same GPU: the analytic model calibrated on this GPU;
4. the same model measured on another GPU: that GPU's measured times scaled by the analytic
   ratio target/reference, using the reference GPU's calibration (the closest GPU in matmul
   peak and memory bandwidth is the reference), read between micro-batch sizes as in 2;
5. nothing about this GPU or model: the analytic model with the calibration of the closest
   profiled GPU (of another regime when none was measured under the requested one; uncalibrated
   defaults when nothing at all is profiled).

Every estimated profile says so (``LayerProfile.measured`` False) and ``source`` names what it
was derived from.  Answers are cached; the planner calls ``get`` many times per plan.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from sailor_core.catalog.gpus import get_gpu, normalize_gpu_name
from sailor_core.catalog.layers import LayerShape, layer_shapes
from sailor_core.catalog.models import get_model, normalize_model_name, tp_split_problem
from sailor_core.errors import InputError, ProfileError
from sailor_core.profiles import estimator as est
from sailor_core.profiles.calibration_cache import cached_calibrate
from sailor_core.profiles.store import read_profiles, write_profiles
from sailor_core.profiles.types import LayerProfile, ModelProfile, ProfileKey
from sailor_core.regimes import DEFAULT_REGIME, get_regime


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{what} must be a positive integer, got {value!r}")
    return value


def _ratio(value: int, target: int, reference: int) -> float:
    """``value`` scaled by target/reference (rounded by the caller, after blending)."""
    return value * target / reference if reference else float(target)


class ProfileDB:
    """Profiles in memory; see the module docstring for how missing keys are estimated."""

    def __init__(self, profiles: Iterable[ModelProfile] = ()) -> None:
        self._stored: dict[ProfileKey, ModelProfile] = {}
        self._measured: set[ProfileKey] = set()  # keys whose every layer was measured
        self._answers: dict[tuple, ModelProfile] = {}
        self._calibrations: dict[tuple[str, str], est.Calibration] = {}
        self._update_rates: dict[tuple[str, str], tuple[float, float, bool]] = {}
        # a measured curve's points carried to (gpu, TP, seq): every micro-batch size of a target reads them
        self._points: dict[tuple, tuple] = {}
        self._by_model_gpu: dict[tuple[str, str], list[ModelProfile]] = defaultdict(list)
        self._by_gpu: dict[str, list[ModelProfile]] = defaultdict(list)
        self._by_model: dict[str, list[ModelProfile]] = defaultdict(list)
        self.version = 0  # counts changes: what was worked out from the profiles may be stale
        for p in profiles:
            self._insert(p)

    # -- storing -------------------------------------------------------------------------
    def _insert(self, p: ModelProfile) -> None:
        try:
            model = normalize_model_name(p.model)
            gpu = normalize_gpu_name(p.gpu)
            get_regime(p.regime)
        except InputError as exc:
            raise ProfileError(f"profile {p.model}/{p.gpu}: {exc}") from None
        expected = get_model(model).num_layer_indices
        if len(p.layers) != expected:
            raise ProfileError(
                f"profile {model}/{gpu} tp {p.tp_degree} mbs {p.micro_batch_size}: "
                f"{len(p.layers)} layers, the model has {expected} layer indices"
            )
        if model != p.model or gpu != p.gpu:
            p = _replace_names(p, model, gpu)
        old = self._stored.get(p.key)
        if old is not None:
            for index in (self._by_model_gpu[(model, gpu)], self._by_gpu[gpu], self._by_model[model]):
                index.remove(old)
        self._stored[p.key] = p
        if p.measured:
            self._measured.add(p.key)
        else:
            self._measured.discard(p.key)
        self._by_model_gpu[(model, gpu)].append(p)
        self._by_gpu[gpu].append(p)
        self._by_model[model].append(p)

    def add(self, p: ModelProfile) -> None:
        """Store a profile (replacing one with the same key); later answers take it into account."""
        self._insert(p)
        self.version += 1
        self._answers.clear()
        self._calibrations.clear()
        self._update_rates.clear()
        self._points.clear()

    def extend(self, profiles: Iterable[ModelProfile]) -> None:
        for p in profiles:
            self._insert(p)
        self.version += 1
        self._answers.clear()
        self._calibrations.clear()
        self._update_rates.clear()
        self._points.clear()

    def profiles(self) -> list[ModelProfile]:
        """Stored profiles (measured or added), sorted by key."""
        return [self._stored[k] for k in sorted(self._stored)]

    def measured_keys(self) -> list[ProfileKey]:
        return sorted(self._measured)

    def save(self, path: str | Path) -> Path:
        return write_profiles(path, self.profiles())

    def __len__(self) -> int:
        return len(self._stored)

    # -- answering -----------------------------------------------------------------------
    def get(
        self,
        model: str,
        gpu: str,
        tp_degree: int,
        micro_batch_size: int,
        seq_len: int | None = None,
        *,
        regime: str | None = None,
    ) -> ModelProfile:
        """Measured profile if present, else estimated; ``regime`` restricts which data is used."""
        args = (model, gpu, tp_degree, micro_batch_size, seq_len, regime)
        hit = self._answers.get(args)
        if hit is not None:
            return hit
        m = normalize_model_name(model)
        g = normalize_gpu_name(gpu)
        tp = _positive_int(tp_degree, "TP degree")
        mbs = _positive_int(micro_batch_size, "micro-batch size")
        seq = get_model(m).seq_len if seq_len is None else _positive_int(seq_len, "sequence length")
        reg = None if regime is None else get_regime(regime).name
        spec = get_model(m)
        if seq > spec.max_position_embeddings:
            raise ProfileError(f"{m} takes at most {spec.max_position_embeddings} tokens per sequence, not {seq}")
        problem = tp_split_problem(spec, tp)
        if problem:
            raise ProfileError(f"{m} cannot run at TP {tp}: {problem}")
        stored = self._stored.get((m, g, tp, mbs, seq))
        if stored is not None and (reg is None or stored.regime == reg):
            answer = stored
        else:
            answer = self._estimate(m, g, tp, mbs, seq, reg)
        self._answers[args] = answer
        return answer

    def calibration(self, gpu: str, regime: str) -> est.Calibration:
        """The analytic model's constants fitted on this GPU's measured profiles (cached)."""
        key = (normalize_gpu_name(gpu), get_regime(regime).name)
        cal = self._calibrations.get(key)
        if cal is None:
            cal = cached_calibrate(self._by_gpu.get(key[0], ()), key[0], key[1])
            self._calibrations[key] = cal
        return cal

    def _estimate(self, m: str, g: str, tp: int, mbs: int, seq: int, reg: str | None) -> ModelProfile:
        def usable(ps: Iterable[ModelProfile]) -> list[ModelProfile]:
            return [p for p in ps if p.key in self._measured and (reg is None or p.regime == reg)]

        own = usable(self._by_model_gpu.get((m, g), ()))
        if own:
            # The same measured profiles answer every regime they all share and no regime at all
            # (the planner asks both): one estimate, one object, for them (kept with the answers).
            key = ("scaled from", g, tp, mbs, seq, tuple(map(id, own)))
            hit = self._answers.get(key)
            if hit is None:
                hit = self._answers[key] = self._scaled(_reference_curve(own, tp, seq), g, tp, mbs, seq,
                                                        "scaled from measured")
            return hit
        on_gpu = usable(self._by_gpu.get(g, ()))
        if on_gpu:
            regime = reg or _most_common_regime(on_gpu)
            models = sorted({p.model for p in on_gpu if p.regime == regime})
            return self._analytic(
                m, g, tp, mbs, seq, regime, self.calibration(g, regime), f"analytic, calibrated on {g} ({', '.join(models)})"
            )
        of_model = usable(self._by_model.get(m, ()))
        if of_model:
            ref_gpu = min({p.gpu for p in of_model}, key=lambda other: (est.gpu_distance(g, other, _regime_of(of_model, other)), other))
            # a measurement at the target's TP carries the reference's TP communication; use it
            # only when both GPUs have the same kind of link, else start from TP 1
            same_link = get_gpu(ref_gpu).intra_node_link == get_gpu(g).intra_node_link
            curve = _reference_curve([p for p in of_model if p.gpu == ref_gpu], tp if same_link else 1, seq)
            return self._scaled(curve, g, tp, mbs, seq, f"from {ref_gpu}, scaled from measured")
        anything = usable(p for ps in self._by_gpu.values() for p in ps)
        # a GPU and model nobody profiled: assume Sailor's own engine (the default regime)
        regime = reg or (DEFAULT_REGIME if any(p.regime == DEFAULT_REGIME for p in anything) or not anything
                         else _most_common_regime(anything))
        gpus = {p.gpu for p in anything if p.regime == regime}
        if gpus:
            ref_gpu = min(gpus, key=lambda other: (est.gpu_distance(g, other, regime), other))
            cal = self.calibration(ref_gpu, regime)
            why = f"analytic, calibration borrowed from {ref_gpu}"
        else:
            # no GPU measured under this regime: kernel efficiencies and launch costs of another
            # framework on a similar GPU are still closer than no calibration at all
            every = {(p.gpu, p.regime) for ps in self._by_gpu.values() for p in ps if p.key in self._measured}
            if every:
                ref_gpu, ref_regime = min(every, key=lambda gr: (est.gpu_distance(g, gr[0], regime), gr))
                cal = self.calibration(ref_gpu, ref_regime)
                why = f"analytic, calibration borrowed from {ref_gpu} measured under {ref_regime}"
            else:
                cal = est.default_calibration(g, regime)
                why = "analytic, uncalibrated defaults (nothing profiled)"
        return self._analytic(m, g, tp, mbs, seq, regime, cal, why)

    def _update_rate(self, g: str, regime: str) -> tuple[float, float, bool]:
        """(s/param, fixed s, measured?) of the optimizer step on ``g``: measured on this GPU, else
        the closest GPU's rate scaled by bandwidth, else bytes touched / bandwidth (cached)."""
        key = (g, regime)
        rate = self._update_rates.get(key)
        if rate is None:
            rate = self._update_rates[key] = self._find_update_rate(g, regime)
        return rate

    def _find_update_rate(self, g: str, regime: str) -> tuple[float, float, bool]:
        own = [p for p in self._by_gpu.get(g, ()) if p.regime == regime and p.update_measured]
        if own:
            best = max(own, key=lambda p: p.params())
            return best.update_s_per_param, best.update_fixed_s, True
        others = [p for ps in self._by_gpu.values() for p in ps if p.regime == regime and p.update_measured]
        if others:
            ref = min(others, key=lambda p: (est.gpu_distance(g, p.gpu, regime), -p.params()))
            rate = est.optimizer_rate_s_per_param(regime, g, like_gpu=ref.gpu, like_rate=ref.update_s_per_param)
            return rate, ref.update_fixed_s, False
        return est.optimizer_rate_s_per_param(regime, g), 0.0, False

    def _analytic(
        self, m: str, g: str, tp: int, mbs: int, seq: int, regime: str, cal: est.Calibration, why: str
    ) -> ModelProfile:
        shapes = layer_shapes(m, tp_degree=tp, seq_len=seq, regime=regime)
        times = est.predict_model(m, g, tp, mbs, seq, regime, cal)
        rate, fixed, _ = self._update_rate(g, regime)
        layers = tuple(_layer_from_shape(s, mbs, f, b) for s, (f, b) in zip(shapes, times, strict=True))
        return ModelProfile(
            model=m,
            gpu=g,
            tp_degree=tp,
            micro_batch_size=mbs,
            seq_len=seq,
            layers=layers,
            regime=regime,
            source=f"estimated: {why}",
            update_s_per_param=rate,
            update_fixed_s=fixed,
            update_measured=False,
        )

    def _scaled(self, curve: list[ModelProfile], g: str, tp: int, mbs: int, seq: int, why: str) -> ModelProfile:
        """The measured ``curve`` (one GPU, TP and sequence length, by micro-batch size; see
        ``_reference_curve``) carried to (g, tp, seq) and read at ``mbs``.

        Each measured point becomes a point of the target: its numbers scaled layer by layer by
        the analytic ratio target/reference at the point's own micro-batch size (so the model
        only has to get the ratio right).  A point below one at a smaller size is raised to it:
        more work never takes less time, whatever noise or launch-bound quirk the measurement
        caught (H200 opt-350m ran mbs 2 faster than mbs 1).  The points are then read at ``mbs``:
        between two, the value moves from one to the other as the target's analytic time moves
        between their sizes; beyond either end, in proportion to that time.  The analytic time
        never falls as the micro-batch grows, so neither does any layer's estimate.
        """
        ref = curve[0]
        cal = self.calibration(ref.gpu, ref.regime)
        shapes = layer_shapes(ref.model, tp_degree=tp, seq_len=seq, regime=ref.regime)

        # (the target's analytic values at the measured sizes, with the points: every size reads them)
        points, at_sizes = self._curve_points(curve, g, tp, seq, shapes, cal)
        sizes = [p.micro_batch_size for p in curve]
        hi = bisect.bisect_left(sizes, mbs)  # the first measured size >= mbs
        now = at_sizes[hi] if hi < len(sizes) and sizes[hi] == mbs else _analytic_at(ref, g, tp, mbs, seq, shapes, cal)
        if hi == len(sizes) or sizes[hi] == mbs or hi == 0:
            at = min(hi, len(sizes) - 1)
            used = [curve[at]]
            values = _in_proportion(points[at], now, at_sizes[at])
        else:
            at, lo = hi, hi - 1
            used = [curve[lo], curve[hi]]
            w = math.log(mbs / sizes[lo]) / math.log(sizes[hi] / sizes[lo])
            values = _between(points[lo], points[hi], now, at_sizes[lo], at_sizes[hi], w)
        if g == ref.gpu:
            rate, fixed = used[0].update_s_per_param, used[0].update_fixed_s
        else:
            rate, fixed, _ = self._update_rate(g, ref.regime)
        # Equal layers (a model's alike blocks: opt-350m's 24 hold 2 values) share one LayerProfile:
        # the frozen constructor was most of an estimate's cost.
        made: dict[tuple, LayerProfile] = {}
        layers = tuple(
            made.get(key) or made.setdefault(key, LayerProfile(fwd_s=key[0], bwd_s=key[1], params=key[2],
                                                              activation_bytes=key[3], output_bytes=key[4],
                                                              measured=False))
            for key in ((f, b, params, int(round(a)), int(round(o)))
                        for (f, b, a, o), (params, *_) in zip(values, points[at], strict=True))
        )
        return ModelProfile(
            model=ref.model,
            gpu=g,
            tp_degree=tp,
            micro_batch_size=mbs,
            seq_len=seq,
            layers=layers,
            regime=ref.regime,
            source=f"estimated: {why} {_describe(used)}",
            update_s_per_param=rate,
            update_fixed_s=fixed,
            update_measured=False,
        )

    def _curve_points(self, curve: list[ModelProfile], g: str, tp: int, seq: int,
                      target_s: tuple[LayerShape, ...], cal: est.Calibration) -> tuple[list, list]:
        """(``curve``'s points carried to (g, tp, seq), never decreasing (``_scaled_point``,
        ``_never_decreasing``); the target's ``_analytic_at`` each point's size), memoised: every
        micro-batch size of a target reads them, and ``target_s`` and ``cal`` follow from the
        key (the shapes of the curve's model at (tp, seq) in its regime; the calibration of its GPU)."""
        key = (tuple((p.key, p.regime) for p in curve), g, tp, seq)
        hit = self._points.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], curve)) or hit[1] != cal:
            points = _never_decreasing([self._scaled_point(p, g, tp, seq, target_s, cal) for p in curve])
            at_sizes = [_analytic_at(curve[0], g, tp, p.micro_batch_size, seq, target_s, cal) for p in curve]
            hit = self._points[key] = (tuple(curve), cal, points, at_sizes)
        return hit[2], hit[3]

    def _scaled_point(
        self, ref: ModelProfile, g: str, tp: int, seq: int, target_s: tuple[LayerShape, ...], cal: est.Calibration
    ) -> list[tuple]:
        """``ref``'s measured numbers per layer (params, fwd s, bwd s, activation and output bytes)
        scaled to (g, tp, seq) at ``ref``'s own micro-batch size by the analytic model's ratios."""
        b = ref.micro_batch_size
        target_t = est.predict_model(ref.model, g, tp, b, seq, ref.regime, cal)
        ref_t = est.predict_model(ref.model, ref.gpu, ref.tp_degree, b, ref.seq_len, ref.regime, cal)
        ref_s = layer_shapes(ref.model, tp_degree=ref.tp_degree, seq_len=ref.seq_len, regime=ref.regime)
        return [
            (
                int(round(_ratio(layer.params, ts.params, rs.params))),
                layer.fwd_s * tf / rf if rf > 0 else tf,
                layer.bwd_s * tb / rb if rb > 0 else tb,
                _ratio(layer.activation_bytes, ts.activation_bytes(b), rs.activation_bytes(b)),
                _ratio(layer.output_bytes, ts.output_bytes(b), rs.output_bytes(b)),
            )
            for layer, (tf, tb), (rf, rb), ts, rs in zip(ref.layers, target_t, ref_t, target_s, ref_s, strict=True)
        ]


def _analytic_at(ref: ModelProfile, g: str, tp: int, b: int, seq: int, shapes: tuple[LayerShape, ...],
                 cal: est.Calibration) -> list[tuple[float, ...]]:
    """Per layer, what the micro-batch size ``b`` drives on the target (g, tp, seq) of a curve
    whose first profile is ``ref`` (``shapes``: its model's layers there): fwd s, bwd s, bytes."""
    times = est.predict_model(ref.model, g, tp, b, seq, ref.regime, cal)
    return [(f, bw, s.activation_bytes(b), s.output_bytes(b)) for (f, bw), s in zip(times, shapes, strict=True)]


def _layer_from_shape(shape: LayerShape, mbs: int, fwd_s: float, bwd_s: float) -> LayerProfile:
    return LayerProfile(
        fwd_s=fwd_s,
        bwd_s=bwd_s,
        params=shape.params,
        activation_bytes=shape.activation_bytes(mbs),
        output_bytes=shape.output_bytes(mbs),
        measured=False,
    )


def _replace_names(p: ModelProfile, model: str, gpu: str) -> ModelProfile:
    return dataclasses.replace(p, model=model, gpu=gpu)


def _reference_curve(profiles: list[ModelProfile], tp: int, seq: int) -> list[ModelProfile]:
    """The measured curve to scale from: the profiles of one (TP, sequence length), by micro-batch
    size.  Same TP first (TP changes communication), then the closest TP and sequence length on a
    log scale, then the curve with more points.  The target's micro-batch size plays no part, so
    every micro-batch size of a target scales from the same curve: picking the nearest measured
    profile switched curves (or points) as the size grew, and the estimate jumped down wherever
    the measured/analytic ratio of the next point was lower (RTX-3090 tp 4 runs opt-350m mbs 16 at
    0.59 of its analytic time and mbs 8 at 0.83: L4 and A10G at tp 4 got faster from mbs 11 to 12).
    """
    curves: dict[tuple[int, int], list[ModelProfile]] = defaultdict(list)
    for p in profiles:
        curves[(p.tp_degree, p.seq_len)].append(p)

    def distance(key: tuple[int, int]) -> tuple:
        t, s = key
        return (t != tp, abs(math.log(t / tp)), abs(math.log(s / seq)), -len(curves[key]), t, s)

    return sorted(curves[min(curves, key=distance)], key=lambda p: p.micro_batch_size)


def _never_decreasing(points: list[list[tuple]]) -> list[list[tuple]]:
    """Points of a curve (by micro-batch size; per layer: params, then fwd s, bwd s and bytes),
    each number but params raised to its largest value at a smaller size: more work never
    takes less."""
    out: list[list[tuple]] = []
    for point in points:
        if out:
            point = [(p, *map(max, now, before)) for (p, *now), (_, *before) in zip(point, out[-1], strict=True)]
        out.append(point)
    return out


def _in_proportion(point: list[tuple], now: list[tuple], there: list[tuple]) -> list[tuple[float, ...]]:
    """A point's numbers (params left out) carried to another micro-batch size in proportion to
    the analytic values ``now`` / ``there``."""
    return [
        tuple(v * n / t if t > 0 else n for v, n, t in zip(values, n_layer, t_layer, strict=True))
        for (_, *values), n_layer, t_layer in zip(point, now, there, strict=True)
    ]


def _between(
    lo: list[tuple], hi: list[tuple], now: list[tuple], at_lo: list[tuple], at_hi: list[tuple], w: float
) -> list[tuple[float, ...]]:
    """Between two points (params left out): each number moves from ``lo``'s value to ``hi``'s by
    the fraction of the way its analytic value has moved (``w``, the fraction in log size,
    where the analytic value stays flat)."""
    out = []
    for (_, *v_lo), (_, *v_hi), n_layer, l_layer, h_layer in zip(lo, hi, now, at_lo, at_hi, strict=True):
        row = []
        for a, b, n, at_a, at_b in zip(v_lo, v_hi, n_layer, l_layer, h_layer, strict=True):
            f = min(max((n - at_a) / (at_b - at_a), 0.0), 1.0) if at_b > at_a else w
            row.append(a + (b - a) * f)
        out.append(tuple(row))
    return out


def _most_common_regime(profiles: list[ModelProfile]) -> str:
    return Counter(p.regime for p in profiles).most_common(1)[0][0]


def _regime_of(profiles: list[ModelProfile], gpu: str) -> str:
    return _most_common_regime([p for p in profiles if p.gpu == gpu])


def _describe(refs: list[ModelProfile]) -> str:
    p = refs[0]
    sizes = " and ".join(str(r.micro_batch_size) for r in refs)
    return f"{p.gpu} tp {p.tp_degree} mbs {sizes} seq {p.seq_len} ({p.source})"


def load_profile_db(paths: Iterable[str | Path]) -> ProfileDB:
    """A database of the profiles in these parquet files (later files win on equal keys)."""
    db = ProfileDB()
    for path in paths:
        db.extend(read_profiles(path))
    return db
