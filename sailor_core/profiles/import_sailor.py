"""Importer for the profiles Sailor published (``data/sailor_data``).

Choices, following the oddities its README lists:

* ``simulations/profiles_tmp.json`` is preferred over ``planner_profiles/<model>/<gpu>/profile.json``
  where both hold a (model, GPU); a file whose layer count does not match the model is skipped
  (the GPT-Neo-2.7/GH-96 planner copy is OPT-350's profile); OPT-30/GH-96 exists only in
  ``planner_profiles``.
* Sizes come from ``planner/llm_info.json`` (recorded at mbs 1: activation bytes scale linearly
  with the micro-batch); a TP degree without sizes there (OPT-30 tp 7/8, LLaMA tp 8) takes the
  tp-1 sizes divided by the degree (outputs are whole on every TP rank, so they are not divided).
* ``update_s`` is the optimizer step of the whole profiled mini-model (embedding, two blocks,
  head), so it becomes a per-parameter rate: update_s / parameters of that mini-model per GPU.
  Where a file has 0 there (older profiling run), the rate is unknown: it is taken from the
  same GPU's other profiles, else scaled by memory bandwidth from the closest GPU, and the
  profile says ``update_measured = False``.
* A missing (mbs, tp) pair is absent (unknown: the database estimates it), never a zero.
* The embedding's backward time (~2 us, a hook artifact) is kept as measured; Sailor's totals,
  which its simulator was validated on, include it that way.
* Sailor's LLAMA-3-8 has 35 indices (final RMSNorm and head separate); they are merged into
  our index L+1, and the untied head's 50,304 x 4,096 / tp weights, which ``llm_info`` leaves
  out, are added to its parameters.  Sailor's models differ slightly from the catalog's (GPT-2
  vocabulary padded to 50,304, untied heads, Megatron biases); each profile carries its own
  per-layer parameters, so memory follows the model that was measured.
* The last index sends nothing onward: its output bytes are 0.
"""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path
from statistics import median

from sailor_core.catalog.gpus import normalize_gpu_name
from sailor_core.catalog.models import get_model, tp_split_problem
from sailor_core.errors import InputError, ProfileError
from sailor_core.profiles import estimator as est
from sailor_core.profiles.types import LayerProfile, ModelProfile

REGIME = "megatron-fp32-adamw"
SAILOR_MODELS = {"OPT-350": "opt-350m", "GPT-Neo-2.7": "gpt-neo-2.7b", "OPT-30": "opt-30b", "LLAMA-3-8": "llama-3-8b"}
_SEQ_LEN = {"LLAMA-3-8": 8192}
_DEFAULT_SEQ_LEN = 2048
_PADDED_VOCAB = 50304  # Sailor's GPT-2 vocabulary, padded; used for LLaMA's uncounted head
_BYTES_PER_FLOAT = 4  # Sailor's convention for send sizes (fp32)


def _load_json(path: Path) -> dict:
    try:
        with path.open() as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not readable JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a JSON object at the top level")
    return data


def _check_table(table: object, where: str) -> dict:
    """A timing table must be {mbs: {tp: {index: [fwd, bwd, update]}}}."""
    if not isinstance(table, dict) or not all(
        isinstance(tps, dict) and all(isinstance(layers, dict) for layers in tps.values()) for tps in table.values()
    ):
        raise ProfileError(f"{where}: expected {{mbs: {{tp: {{layer index: [fwd_s, bwd_s, update_s]}}}}}}")
    return table


def _timings_sources(root: Path) -> dict[tuple[str, str], list[tuple[str, dict]]]:
    """(sailor model, gpu) -> candidate timing tables, preferred first."""
    found: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    tmp = root / "simulations" / "profiles_tmp.json"
    if tmp.exists():
        for model, gpus in _load_json(tmp).items():
            if not isinstance(gpus, dict):
                raise ProfileError(f"{tmp}: {model!r} must map GPU types to timing tables")
            for gpu, table in gpus.items():
                _check_table(table, f"{tmp} {model}/{gpu}")
                found.setdefault((model, gpu), []).append(("sailor:simulations/profiles_tmp.json", table))
    planner = root / "planner_profiles"
    if planner.is_dir():
        for path in sorted(planner.glob("*/*/profile.json")):
            model, gpu = path.parent.parent.name, path.parent.name
            table = _check_table(_load_json(path), str(path))
            found.setdefault((model, gpu), []).append((f"sailor:planner_profiles/{model}/{gpu}", table))
    return found


def _expected_indices(sailor_model: str) -> int:
    spec = get_model(SAILOR_MODELS[sailor_model])
    # LLaMA's profile has the final norm and the head as two indices
    return spec.num_layer_indices + (1 if spec.is_llama else 0)


def _layer_count(table: dict) -> int | None:
    for tps in table.values():
        for layers in tps.values():
            return len(layers)
    return None


def _sizes(llm_info: dict, sailor_model: str, tp: int, num_indices: int, where: str) -> list[tuple[int, int, int]]:
    """Per Sailor index: (params, activation bytes at mbs 1, output bytes at mbs 1), per GPU."""
    info = llm_info.get(sailor_model)
    if not isinstance(info, dict):
        raise ProfileError(f"{where}: llm_info.json has no {{tp: {{index: sizes}}}} table for {sailor_model}")
    divide = 1
    table = info.get(str(tp))
    if not isinstance(table, dict):
        table, divide = info.get("1"), tp
        if not isinstance(table, dict):
            raise ProfileError(f"{where}: llm_info.json has no tp 1 sizes for {sailor_model}")
    try:
        sizes = [
            (
                -(-int(table[str(i)]["params_floats"]) // divide),
                -(-int(table[str(i)]["act_mem_bytes"]) // divide),
                int(table[str(i)]["act_output_floats"]) * _BYTES_PER_FLOAT,
            )
            for i in range(num_indices)
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: llm_info.json sizes for {sailor_model} tp {tp} are incomplete ({exc})") from None
    return sizes


def _convert(
    sailor_model: str, gpu: str, mbs: int, tp: int, layers: dict, llm_info: dict, source: str
) -> ModelProfile:
    model = SAILOR_MODELS[sailor_model]
    spec = get_model(model)
    where = f"{source} {sailor_model}/{gpu} mbs {mbs} tp {tp}"
    n = len(layers)
    try:
        rows = [tuple(float(x) for x in layers[str(i)]) for i in range(n)]
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: layer entries must be [fwd_s, bwd_s, update_s] for indices 0..{n - 1} ({exc})") from None
    if any(len(r) != 3 or min(r) < 0 for r in rows):
        raise ProfileError(f"{where}: layer entries must be three non-negative numbers [fwd_s, bwd_s, update_s]")
    sizes = _sizes(llm_info, sailor_model, tp, n, where)
    out: list[LayerProfile] = []
    for i, ((fwd, bwd, _), (params, act, output)) in enumerate(zip(rows, sizes, strict=True)):
        out.append(
            LayerProfile(fwd_s=fwd, bwd_s=bwd, params=params, activation_bytes=act * mbs, output_bytes=output * mbs, measured=True)
        )
    if spec.is_llama:  # merge final norm and head into one index, count the head's weights
        norm, head = out[-2], out[-1]
        out[-2:] = [
            LayerProfile(
                fwd_s=norm.fwd_s + head.fwd_s,
                bwd_s=norm.bwd_s + head.bwd_s,
                params=norm.params + head.params + -(-_PADDED_VOCAB * spec.hidden_size // tp),
                activation_bytes=norm.activation_bytes + head.activation_bytes,
                output_bytes=0,
                measured=True,
            )
        ]
    last = out[-1]
    out[-1] = LayerProfile(
        fwd_s=last.fwd_s, bwd_s=last.bwd_s, params=last.params, activation_bytes=last.activation_bytes, output_bytes=0, measured=True
    )
    if len(out) != spec.num_layer_indices:
        raise ProfileError(f"{where}: {n} layer indices, expected {_expected_indices(sailor_model)}")
    update = rows[0][2]
    mini_params = out[0].params + out[1].params + out[2].params + out[-1].params  # what was profiled
    return ModelProfile(
        model=model,
        gpu=gpu,
        tp_degree=tp,
        micro_batch_size=mbs,
        seq_len=_SEQ_LEN.get(sailor_model, _DEFAULT_SEQ_LEN),
        layers=tuple(out),
        regime=REGIME,
        source=source,
        update_s_per_param=update / mini_params if update > 0 else 0.0,
        update_fixed_s=0.0,
        update_measured=update > 0,
    )


def _fill_update_rates(profiles: list[ModelProfile]) -> list[ModelProfile]:
    rates: dict[str, list[float]] = {}
    for p in profiles:
        if p.update_measured:
            rates.setdefault(p.gpu, []).append(p.update_s_per_param)
    gpu_rate = {gpu: median(r) for gpu, r in rates.items()}
    filled = []
    for p in profiles:
        if not p.update_measured:
            if p.gpu in gpu_rate:
                rate = gpu_rate[p.gpu]
            elif gpu_rate:
                like = min(gpu_rate, key=lambda g: (est.gpu_distance(p.gpu, g, REGIME), g))
                rate = est.optimizer_rate_s_per_param(REGIME, p.gpu, like_gpu=like, like_rate=gpu_rate[like])
            else:
                rate = est.optimizer_rate_s_per_param(REGIME, p.gpu)
            p = dataclasses.replace(p, update_s_per_param=rate, update_fixed_s=0.0, update_measured=False)
        filled.append(p)
    return filled


def import_sailor(root: str | Path) -> list[ModelProfile]:
    """All usable profiles of a sailor_data folder (or of the repo's ``sailor/Planner`` layout)."""
    root = Path(root)
    if not root.is_dir():
        raise ProfileError(f"{root} is not a directory (expected Sailor's data folder)")
    llm_info_path = root / "planner" / "llm_info.json"
    if not llm_info_path.exists():
        raise ProfileError(f"{root}: planner/llm_info.json (per-layer sizes) is missing")
    llm_info = _load_json(llm_info_path)
    sources = _timings_sources(root)
    if not sources:
        raise ProfileError(f"{root}: no simulations/profiles_tmp.json nor planner_profiles/*/*/profile.json")
    profiles: list[ModelProfile] = []
    for (sailor_model, sailor_gpu), candidates in sorted(sources.items()):
        if sailor_model not in SAILOR_MODELS:
            continue
        try:
            gpu = normalize_gpu_name(sailor_gpu)
        except InputError:
            continue
        expected = _expected_indices(sailor_model)
        usable = [(src, t) for src, t in candidates if _layer_count(t) == expected]
        if not usable:
            raise ProfileError(f"{root}: every {sailor_model}/{sailor_gpu} profile has the wrong number of layer indices")
        source, table = usable[0]
        for mbs_key, tps in table.items():
            for tp_key, layers in tps.items():
                try:
                    mbs, tp = int(mbs_key), int(tp_key)
                except ValueError:
                    raise ProfileError(f"{source}: mbs/tp keys must be integers, got {mbs_key!r}/{tp_key!r}") from None
                if tp_split_problem(get_model(SAILOR_MODELS[sailor_model]), tp):
                    continue  # e.g. OPT-30 at tp 7 on V100: heads do not split evenly; unusable
                profiles.append(_convert(sailor_model, gpu, mbs, tp, layers, llm_info, source))
    return _fill_update_rates(profiles)
