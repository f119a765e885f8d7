"""ProfileDB: measured per-layer profiles, and estimates for everything never measured.

``get`` answers any (model, GPU, TP, micro-batch, sequence length), in this order:

1. the stored profile of exactly that key;
2. the same model measured on the same GPU at another (TP, mbs, seq): its measured times scaled
   by the ratio of the analytic model's times (calibrated on this GPU) at the two keys;
3. another model measured on the same GPU: the analytic model calibrated on this GPU;
4. the same model measured on another GPU: that GPU's measured times scaled by the analytic
   ratio target/reference, using the reference GPU's calibration (the closest GPU in matmul
   peak and memory bandwidth is the reference);
5. nothing about this GPU or model: the analytic model with the calibration of the closest
   profiled GPU (of another regime when none was measured under the requested one; uncalibrated
   defaults when nothing at all is profiled).

Every estimated profile says so (``LayerProfile.measured`` False) and ``source`` names what it
was derived from.  Answers are cached; the planner calls ``get`` many times per plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from sailor_core.catalog.gpus import get_gpu, normalize_gpu_name
from sailor_core.catalog.layers import LayerShape, layer_shapes
from sailor_core.catalog.models import get_model, normalize_model_name
from sailor_core.errors import InputError, ProfileError
from sailor_core.profiles import estimator as est
from sailor_core.profiles.store import read_profiles, write_profiles
from sailor_core.profiles.types import LayerProfile, ModelProfile, ProfileKey
from sailor_core.regimes import DEFAULT_REGIME, get_regime


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{what} must be a positive integer, got {value!r}")
    return value


def _scaled(value: int, target: int, reference: int) -> int:
    return int(round(value * target / reference)) if reference else target


class ProfileDB:
    """Profiles in memory; see the module docstring for how missing keys are estimated."""

    def __init__(self, profiles: Iterable[ModelProfile] = ()) -> None:
        self._stored: dict[ProfileKey, ModelProfile] = {}
        self._measured: set[ProfileKey] = set()  # keys whose every layer was measured
        self._answers: dict[tuple, ModelProfile] = {}
        self._calibrations: dict[tuple[str, str], est.Calibration] = {}
        self._update_rates: dict[tuple[str, str], tuple[float, float, bool]] = {}
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

    def extend(self, profiles: Iterable[ModelProfile]) -> None:
        for p in profiles:
            self._insert(p)
        self.version += 1
        self._answers.clear()
        self._calibrations.clear()
        self._update_rates.clear()

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
        if spec.num_heads % tp:
            raise ProfileError(f"{m} cannot run at TP {tp}: its {spec.num_heads} heads do not split {tp} ways")
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
            cal = est.calibrate(self._by_gpu.get(key[0], ()), key[0], key[1])
            self._calibrations[key] = cal
        return cal

    def _estimate(self, m: str, g: str, tp: int, mbs: int, seq: int, reg: str | None) -> ModelProfile:
        def usable(ps: Iterable[ModelProfile]) -> list[ModelProfile]:
            return [p for p in ps if p.key in self._measured and (reg is None or p.regime == reg)]

        own = usable(self._by_model_gpu.get((m, g), ()))
        if own:
            ref = _nearest(own, tp, mbs, seq)
            return self._scaled(ref, g, tp, mbs, seq, f"scaled from measured {_describe(ref)}")
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
            ref = _nearest([p for p in of_model if p.gpu == ref_gpu], tp if same_link else 1, mbs, seq)
            return self._scaled(ref, g, tp, mbs, seq, f"from {ref_gpu}, scaled from measured {_describe(ref)}")
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

    def _scaled(self, ref: ModelProfile, g: str, tp: int, mbs: int, seq: int, why: str) -> ModelProfile:
        """``ref``'s measured numbers scaled to (g, tp, mbs, seq) by the analytic model's ratios."""
        cal = self.calibration(ref.gpu, ref.regime)
        target_t = est.predict_model(ref.model, g, tp, mbs, seq, ref.regime, cal)
        ref_t = est.predict_model(ref.model, ref.gpu, ref.tp_degree, ref.micro_batch_size, ref.seq_len, ref.regime, cal)
        target_s = layer_shapes(ref.model, tp_degree=tp, seq_len=seq, regime=ref.regime)
        ref_s = layer_shapes(ref.model, tp_degree=ref.tp_degree, seq_len=ref.seq_len, regime=ref.regime)
        layers = []
        for layer, (tf, tb), (rf, rb), ts, rs in zip(ref.layers, target_t, ref_t, target_s, ref_s, strict=True):
            layers.append(
                LayerProfile(
                    fwd_s=layer.fwd_s * tf / rf if rf > 0 else tf,
                    bwd_s=layer.bwd_s * tb / rb if rb > 0 else tb,
                    params=_scaled(layer.params, ts.params, rs.params),
                    activation_bytes=_scaled(
                        layer.activation_bytes, ts.activation_bytes(mbs), rs.activation_bytes(ref.micro_batch_size)
                    ),
                    output_bytes=_scaled(layer.output_bytes, ts.output_bytes(mbs), rs.output_bytes(ref.micro_batch_size)),
                    measured=False,
                )
            )
        if g == ref.gpu:
            rate, fixed, _ = ref.update_s_per_param, ref.update_fixed_s, None
        else:
            rate, fixed, _ = self._update_rate(g, ref.regime)
        return ModelProfile(
            model=ref.model,
            gpu=g,
            tp_degree=tp,
            micro_batch_size=mbs,
            seq_len=seq,
            layers=tuple(layers),
            regime=ref.regime,
            source=f"estimated: {why}",
            update_s_per_param=rate,
            update_fixed_s=fixed,
            update_measured=False,
        )


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


def _nearest(profiles: list[ModelProfile], tp: int, mbs: int, seq: int) -> ModelProfile:
    """The measured profile closest to the target: same TP first (TP changes communication),
    then the closest micro-batch and sequence length on a log scale."""

    def distance(p: ModelProfile) -> tuple:
        return (
            p.tp_degree != tp,
            abs(math.log(p.tp_degree / tp)),
            abs(math.log(p.micro_batch_size / mbs)) + abs(math.log(p.seq_len / seq)),
            -p.micro_batch_size,  # ties: the larger measurement is less launch-bound
        )

    return min(profiles, key=distance)


def _most_common_regime(profiles: list[ModelProfile]) -> str:
    return Counter(p.regime for p in profiles).most_common(1)[0][0]


def _regime_of(profiles: list[ModelProfile], gpu: str) -> str:
    return _most_common_regime([p for p in profiles if p.gpu == gpu])


def _describe(p: ModelProfile) -> str:
    return f"{p.gpu} tp {p.tp_degree} mbs {p.micro_batch_size} seq {p.seq_len} ({p.source})"


def load_profile_db(paths: Iterable[str | Path]) -> ProfileDB:
    """A database of the profiles in these parquet files (later files win on equal keys)."""
    db = ProfileDB()
    for path in paths:
        db.extend(read_profiles(path))
    return db
