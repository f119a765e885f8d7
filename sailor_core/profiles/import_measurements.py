"""Importer for whole-model training measurements (``data/measurements``, JSON lines).

Each model was timed at its full depth L and truncated to 2 blocks, so per block

    block = (T_L - T_2) / (L - 2)            rest (embedding + final norm + head + loss) = T_2 - 2 * block

for the forward (``fwd_nograd_ms``) and forward+backward (``fwd_bwd_ms``) medians; backward is
their difference.  The rest is split between index 0 and index L+1 in the ratio of the
analytic model's times for the two (the embedding is a gather, nearly all of it is the head).

Activation bytes per block come from differencing ``peak_alloc_bytes - static_bytes`` of the
two depths the same way; the rest of the 2-block peak, minus the embedding's analytic
activations and minus the loss's transient gradient buffers (which the simulator's memory model
adds once, from first principles: ``sailor_core.simulator.memory.loss_working_bytes``), is
charged to the head as what it keeps for backward (logits, log-probabilities).  Parameters and output sizes come from
``sailor_core.catalog.layers`` and are checked against the record's ``params``.

The optimizer step is linear in parameters: ``optim_step_ms`` of all records is fitted as
fixed + rate * params (least squares, fixed >= 0).
"""

from __future__ import annotations

import json
from pathlib import Path

from sailor_core.catalog.gpus import get_gpu, normalize_gpu_name
from sailor_core.catalog.layers import layer_shapes, total_params
from sailor_core.catalog.models import get_model, normalize_model_name
from sailor_core.errors import InputError, ProfileError
from sailor_core.profiles import estimator as est
from sailor_core.profiles.types import LayerProfile, ModelProfile
from sailor_core.regimes import get_regime
from sailor_core.simulator.memory import loss_working_bytes

REGIME = "torch-bf16-autocast-adamw"
_INT_FIELDS = ("layers", "params", "seq", "mbs", "static_bytes", "peak_alloc_bytes")
_FIELDS = ("model", "layers", "params", "seq", "mbs", "fwd_nograd_ms", "fwd_bwd_ms", "optim_step_ms", "static_bytes", "peak_alloc_bytes")


def _read_records(path: Path) -> tuple[Path, dict, list[dict]]:
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise ProfileError(f"{path}: no *.jsonl measurement file in this folder")
        path = files[0]
    env: dict = {}
    records: list[dict] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ProfileError(f"{path}:{number}: expected a JSON object")
        if "env" in row:
            env = row["env"]
            continue
        missing = [f for f in _FIELDS if f not in row]
        if missing:
            raise ProfileError(f"{path}:{number}: missing {', '.join(missing)}")
        bad = [f for f in _INT_FIELDS if isinstance(row[f], bool) or not isinstance(row[f], int) or row[f] < 0]
        if bad:
            raise ProfileError(f"{path}:{number}: {', '.join(bad)} must be non-negative integers")
        records.append(row)
    if not records:
        raise ProfileError(f"{path}: no measurement records")
    return path, env, records


def _median_ms(value: object, where: str) -> float:
    try:
        ms = float(value[0] if isinstance(value, list) else value)
    except (TypeError, ValueError, IndexError):
        raise ProfileError(f"{where}: timings must be [median, min, max] in ms") from None
    if not ms > 0:
        raise ProfileError(f"{where}: timings must be positive")
    return ms / 1e3


def _gpu_of(env: dict, gpu: str | None, path: Path) -> str:
    name = gpu or str(env.get("device", ""))
    for candidate in (name, name.removeprefix("NVIDIA ").strip()):
        try:
            return normalize_gpu_name(candidate)
        except InputError:
            continue
    raise ProfileError(f"{path}: unknown device {name!r}; pass the GPU type explicitly")


def _fit_update(records: list[dict], where: str) -> tuple[float, float]:
    import numpy as np  # lazy: numpy (~0.15 s) only when arrays are computed; importing this module stays light

    params = np.array([float(r["params"]) for r in records])
    times = np.array([_median_ms(r["optim_step_ms"], where) for r in records])
    if len(set(params.tolist())) < 2:
        return float(np.median(times / params)), 0.0
    rate, fixed = np.polyfit(params, times, 1)
    if fixed < 0 or rate <= 0:
        return float(np.sum(times * params) / np.sum(params * params)), 0.0
    return float(rate), float(fixed)


def import_measurements(path: str | Path, *, gpu: str | None = None) -> list[ModelProfile]:
    """One measured profile per (model, mbs) that has both depths in the file."""
    path = Path(path)
    path, env, records = _read_records(path)
    g = _gpu_of(env, gpu, path)
    regime = get_regime(REGIME)
    rate, fixed = _fit_update(records, str(path))
    profiles = []
    for (model, mbs, seq), depths in sorted(_by_model_and_depth(records, path).items()):
        spec = get_model(model)
        full, short = depths.get(spec.num_layers), depths.get(2)
        if full is None or short is None or spec.num_layers <= 2:
            continue  # needs both depths to separate blocks from the rest
        where = f"{path} {model} mbs {mbs}"
        layers = _layers_by_differencing(model, mbs, seq, full, short, g, regime, where)
        profiles.append(ModelProfile(
            model=model, gpu=g, tp_degree=1, micro_batch_size=mbs, seq_len=seq, layers=layers,
            regime=regime.name, source=f"measurements:{path.name}",
            update_s_per_param=rate, update_fixed_s=fixed, update_measured=True,
        ))
    if not profiles:
        raise ProfileError(f"{path}: no model measured at both its full depth and 2 blocks")
    return profiles


def _by_model_and_depth(records: list[dict], path: Path) -> dict[tuple[str, int, int], dict[int, dict]]:
    """{(catalog model, mbs, seq): {depth in blocks: record}}."""
    by_key: dict[tuple[str, int, int], dict[int, dict]] = {}
    for r in records:
        try:
            model = normalize_model_name(r["model"])
        except InputError as exc:
            raise ProfileError(f"{path}: {exc}") from None
        by_key.setdefault((model, int(r["mbs"]), int(r["seq"])), {})[int(r["layers"])] = r
    return by_key


def _layers_by_differencing(model: str, mbs: int, seq: int, full: dict, short: dict, gpu: str,
                            regime, where: str) -> tuple[LayerProfile, ...]:
    """Per-layer times and activations from a full-depth and a 2-block run: a block is their
    difference over the blocks between, the rest (embedding, head) what the 2-block run has
    beyond its two blocks, split between embedding and head as the analytic model splits it."""
    spec = get_model(model)
    if int(full["params"]) != total_params(model):
        raise ProfileError(
            f"{where}: {full['params']} parameters measured, the catalog's {model} has {total_params(model)}"
        )
    span = spec.num_layers - 2
    fwd_l, fwd_2 = _median_ms(full["fwd_nograd_ms"], where), _median_ms(short["fwd_nograd_ms"], where)
    fb_l, fb_2 = _median_ms(full["fwd_bwd_ms"], where), _median_ms(short["fwd_bwd_ms"], where)
    block_fwd = (fwd_l - fwd_2) / span
    block_fb = (fb_l - fb_2) / span
    rest_fwd = fwd_2 - 2 * block_fwd
    rest_fb = fb_2 - 2 * block_fb
    if min(block_fwd, block_fb - block_fwd, rest_fwd, rest_fb - rest_fwd) <= 0:
        raise ProfileError(f"{where}: differencing the two depths gives a non-positive time; records inconsistent")
    act_l = int(full["peak_alloc_bytes"]) - int(full["static_bytes"])
    act_2 = int(short["peak_alloc_bytes"]) - int(short["static_bytes"])
    block_act = (act_l - act_2) / span
    rest_act = act_2 - 2 * block_act - loss_working_bytes(model, 1, mbs, seq, regime)
    if block_act <= 0 or rest_act <= 0:
        raise ProfileError(f"{where}: differencing peak memory of the two depths gives non-positive activations")
    shapes = layer_shapes(model, tp_degree=1, seq_len=seq, regime=regime)
    emb, head = shapes[0], shapes[-1]
    cal = est.default_calibration(gpu, regime.name)
    ef, eb = est.predict_layer(emb, get_gpu(gpu), regime, mbs, seq, cal)
    hf, hb = est.predict_layer(head, get_gpu(gpu), regime, mbs, seq, cal)
    rest_bwd = rest_fb - rest_fwd
    emb_act = min(emb.activation_bytes(mbs), int(rest_act / 2))
    embedding = LayerProfile(fwd_s=rest_fwd * ef / (ef + hf), bwd_s=rest_bwd * eb / (eb + hb), params=emb.params,
                             activation_bytes=emb_act, output_bytes=emb.output_bytes(mbs), measured=True)
    blocks = [LayerProfile(fwd_s=block_fwd, bwd_s=block_fb - block_fwd, params=s.params,
                           activation_bytes=int(round(block_act)), output_bytes=s.output_bytes(mbs), measured=True)
              for s in shapes[1:-1]]
    last = LayerProfile(fwd_s=rest_fwd * hf / (ef + hf), bwd_s=rest_bwd * hb / (eb + hb), params=head.params,
                        activation_bytes=int(round(rest_act)) - emb_act, output_bytes=0, measured=True)
    return (embedding, *blocks, last)
