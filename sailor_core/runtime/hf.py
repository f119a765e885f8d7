"""Hugging Face weights in and out: safetensors <-> our full per-layer tensors.

In: ``load_pretrained(model, url)`` checks that the folder's ``config.json`` is the stage's
model (``catalog/hf_config.py``) and sets the stage's parameters from the folder's weights
(a path, ``file://``, ``s3://`` or ``gs://`` URL; ``model.safetensors`` or a sharded
``model.safetensors.index.json``).  Tensors are read by byte ranges (a safetensors file is an
8-byte header size, a JSON header of offsets, then the raw tensors), so a pipeline stage reads
its own layers only.  Out: ``export_checkpoint`` writes a Sailor checkpoint as ``config.json`` +
``model.safetensors`` that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.  Neither
needs ``transformers``.

Names: layer index 0 is the embedding, 1..L the HF layers 0..L-1, L+1 the final norm and
LM head.  A tied model's matrix is layer 0's ``tok`` (HF: the input embedding); its
``lm_head.weight``, when a file has it, is the same tensor and is not read.  Several of our
tensors may share one HF name (Phi-3's ``qkv_proj`` and ``gate_up_proj``): they are its row
blocks in table order, split on import and concatenated on export.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from sailor_core.catalog.hf_config import (CONFIG, check_hf_config, generation_token_ids, hf_config,
                                          read_hf_config)
from sailor_core.catalog.models import ModelSpec, get_model
from sailor_core.errors import InputError, SailorError
from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.model import StageModel
from sailor_core.runtime.stage_checkpoint import load_full_weights, weight_layers
from sailor_core.storage import open_storage

WEIGHTS = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"  # kept from the pretrained folder, else the token ids
# what AutoTokenizer.from_pretrained reads, in the spellings of fast and slow tokenizers
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")
WEIGHTS_INDEX = "model.safetensors.index.json"
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}

# Per family: the HF model's prefix, and our (layer kind, name) -> HF name below it ("{i}": HF layer).
_PREFIX = {"opt": "model.decoder.", "gptneo": "transformer."}  # the Llama-style families: "model."
_NAMES: dict[str, dict[tuple[str, str], str]] = {
    "opt": {
        ("embedding", "tok"): "embed_tokens.weight", ("embedding", "pos"): "embed_positions.weight",
        ("embedding", "proj_in"): "project_in.weight",
        ("block", "norm1_w"): "layers.{i}.self_attn_layer_norm.weight",
        ("block", "norm1_b"): "layers.{i}.self_attn_layer_norm.bias",
        **{("block", f"{p}_{wb}"): f"layers.{{i}}.self_attn.{hf}_proj.{full}"
           for p, hf in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"))
           for wb, full in (("w", "weight"), ("b", "bias"))},
        ("block", "norm2_w"): "layers.{i}.final_layer_norm.weight",
        ("block", "norm2_b"): "layers.{i}.final_layer_norm.bias",
        ("block", "up_w"): "layers.{i}.fc1.weight", ("block", "up_b"): "layers.{i}.fc1.bias",
        ("block", "down_w"): "layers.{i}.fc2.weight", ("block", "down_b"): "layers.{i}.fc2.bias",
        ("head", "norm_w"): "final_layer_norm.weight", ("head", "norm_b"): "final_layer_norm.bias",
        ("head", "proj_out"): "project_out.weight",
    },
    "gptneo": {
        ("embedding", "tok"): "wte.weight", ("embedding", "pos"): "wpe.weight",
        ("block", "norm1_w"): "h.{i}.ln_1.weight", ("block", "norm1_b"): "h.{i}.ln_1.bias",
        ("block", "q_w"): "h.{i}.attn.attention.q_proj.weight", ("block", "k_w"): "h.{i}.attn.attention.k_proj.weight",
        ("block", "v_w"): "h.{i}.attn.attention.v_proj.weight",
        ("block", "o_w"): "h.{i}.attn.attention.out_proj.weight",
        ("block", "o_b"): "h.{i}.attn.attention.out_proj.bias",
        ("block", "norm2_w"): "h.{i}.ln_2.weight", ("block", "norm2_b"): "h.{i}.ln_2.bias",
        ("block", "up_w"): "h.{i}.mlp.c_fc.weight", ("block", "up_b"): "h.{i}.mlp.c_fc.bias",
        ("block", "down_w"): "h.{i}.mlp.c_proj.weight", ("block", "down_b"): "h.{i}.mlp.c_proj.bias",
        ("head", "norm_w"): "ln_f.weight", ("head", "norm_b"): "ln_f.bias",
    },
    "llama": {
        ("embedding", "tok"): "embed_tokens.weight",
        ("block", "norm1_w"): "layers.{i}.input_layernorm.weight",
        **{("block", f"{p}_w"): f"layers.{{i}}.self_attn.{p}_proj.weight" for p in "qkvo"},
        ("block", "norm2_w"): "layers.{i}.post_attention_layernorm.weight",
        **{("block", f"{p}_w"): f"layers.{{i}}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
        ("head", "norm_w"): "norm.weight",
    },
}
_LLAMA = _NAMES["llama"]
_QKV_BIAS = {("block", f"{p}_b"): f"layers.{{i}}.self_attn.{p}_proj.bias" for p in "qkv"}
_QK_NORM = {("block", f"{p}_norm_w"): f"layers.{{i}}.self_attn.{p}_norm.weight" for p in "qk"}
_GEMMA = {**_LLAMA, ("block", "attn_post_w"): "layers.{i}.post_attention_layernorm.weight",
          ("block", "norm2_w"): "layers.{i}.pre_feedforward_layernorm.weight",
          ("block", "mlp_post_w"): "layers.{i}.post_feedforward_layernorm.weight"}
_NAMES.update({
    "qwen2": {**_LLAMA, **_QKV_BIAS}, "qwen3": {**_LLAMA, **_QK_NORM}, "mistral": _LLAMA,
    "phi3": {**_LLAMA, **{("block", f"{p}_w"): "layers.{i}.self_attn.qkv_proj.weight" for p in "qkv"},
             **{("block", f"{p}_w"): "layers.{i}.mlp.gate_up_proj.weight" for p in ("gate", "up")}},
    "gemma2": _GEMMA, "gemma3": {**_GEMMA, **_QK_NORM},
})
LM_HEAD = "lm_head.weight"  # the untied head, outside the prefix


def _kind(spec: ModelSpec, layer_index: int) -> str:
    return "embedding" if layer_index == 0 else "head" if layer_index == spec.num_layers + 1 else "block"


def hf_name(spec: ModelSpec, layer_index: int, name: str) -> str:
    """The Hugging Face tensor name of our parameter ``name`` of ``layer_index``."""
    if layer_index == spec.num_layers + 1 and name == "lm_w":
        return LM_HEAD
    suffix = _NAMES[spec.family].get((_kind(spec, layer_index), name))
    if suffix is None:
        raise InputError(f"{spec.name}: parameter {name} of layer {layer_index} has no Hugging Face name")
    return _PREFIX.get(spec.family, "model.") + suffix.format(i=layer_index - 1)


def hf_names(spec: ModelSpec, layer_index: int) -> dict[str, str]:
    """{our name: HF name} of the parameters layer ``layer_index`` of ``spec`` has (a tied head: none
    for its matrix, which is layer 0's)."""
    kind = _kind(spec, layer_index)
    names = {name: hf_name(spec, layer_index, name) for k, name in _NAMES[spec.family] if k == kind
             and _has(spec, kind, name)}
    if kind == "head" and not spec.tie_embeddings:
        names["lm_w"] = LM_HEAD
    return names


def _has(spec: ModelSpec, kind: str, name: str) -> bool:
    if name == "proj_in" or name == "proj_out":
        return bool(spec.word_embed_proj_dim)
    if kind == "head" and name.startswith("norm"):
        return spec.pre_norm
    if name in ("q_b", "k_b", "v_b") and spec.is_llama:
        return spec.qkv_bias
    return True


# ---- safetensors ------------------------------------------------------------------------------

def _header(storage, filename: str) -> tuple[int, dict]:
    """(offset of the data, {tensor name: {dtype, shape, data_offsets}}) of a safetensors file."""
    (size,) = struct.unpack("<Q", storage.get_range(filename, 0, 8))
    return 8 + size, json.loads(storage.get_range(filename, 8, 8 + size))


def _read_tensor(storage, filename: str, data_start: int, entry: dict, name: str) -> torch.Tensor:
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise InputError(f"{filename}: tensor {name} has dtype {entry['dtype']}, not a float type")
    begin, end = entry["data_offsets"]
    data = bytearray(storage.get_range(filename, data_start + begin, data_start + end))
    return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"]).float()


def _weight_files(storage, url: str) -> dict[str, str]:
    """{tensor name: file} of the folder's weights (one file or a sharded index)."""
    if storage.exists(WEIGHTS_INDEX):
        return dict(json.loads(storage.get(WEIGHTS_INDEX))["weight_map"])
    if not storage.exists(WEIGHTS):
        raise InputError(f"{url}: neither {WEIGHTS} nor {WEIGHTS_INDEX}")
    return {name: WEIGHTS for name in _header(storage, WEIGHTS)[1] if name != "__metadata__"}


def _find(files: dict[str, str], spec: ModelSpec, name: str) -> str | None:
    """The name a file uses: ours, or without the prefix of the base model (OPTModel, GPTNeoModel,
    LlamaModel files)."""
    if name in files:
        return name
    bare = name.removeprefix("model.").removeprefix("transformer.")
    return bare if bare in files else None


def load_pretrained(model: StageModel, url: str) -> None:
    """Set a stage's parameters from the Hugging Face model folder at ``url`` (InputError when it is
    another model or lacks a tensor)."""
    check_hf_config(model.spec, read_hf_config(url), url)
    load_full_weights(model, read_hf_weights(url, model.spec, weight_layers(model)), url)


def read_hf_weights(url: str, spec: ModelSpec, layer_indices) -> dict[int, dict[str, torch.Tensor]]:
    """{layer index: {our name: full fp32 tensor}} of ``layer_indices`` from a Hugging Face folder."""
    storage = open_storage(url)
    files = _weight_files(storage, url)
    headers: dict[str, tuple[int, dict]] = {}
    out: dict[int, dict[str, torch.Tensor]] = {}
    for layer in layer_indices:
        out[layer] = {}
        for theirs, ours in _by_hf_name(hf_names(spec, layer)).items():
            found = _find(files, spec, theirs)
            if found is None:
                raise InputError(f"{url}: the weights have no tensor {theirs}")
            filename = files[found]
            if filename not in headers:
                headers[filename] = _header(storage, filename)
            start, header = headers[filename]
            tensor = _read_tensor(storage, filename, start, header[found], found)
            out[layer].update(_split_fused(spec, ours, tensor, theirs, url))
    return out


def _by_hf_name(names: dict[str, str]) -> dict[str, list[str]]:
    """{HF name: our names, in table order} (several: a fused tensor's row blocks)."""
    out: dict[str, list[str]] = {}
    for ours, theirs in names.items():
        out.setdefault(theirs, []).append(ours)
    return out


def _rows(spec: ModelSpec, name: str) -> int:
    """Rows of one block of a fused tensor: q, k, v projections or the gate and up halves."""
    return {"q_w": spec.num_heads * spec.head_dim, "k_w": spec.num_kv_heads * spec.head_dim,
            "v_w": spec.num_kv_heads * spec.head_dim}.get(name, spec.ffn_size)


def _split_fused(spec: ModelSpec, ours: list[str], tensor: torch.Tensor, theirs: str,
                 url: str) -> dict[str, torch.Tensor]:
    if len(ours) == 1:
        return {ours[0]: tensor}
    rows = [_rows(spec, name) for name in ours]
    if tensor.shape[0] != sum(rows):
        raise InputError(f"{url}: {theirs} has {tensor.shape[0]} rows, not the {sum(rows)} of {', '.join(ours)}")
    return dict(zip(ours, torch.split(tensor, rows, dim=0)))


# ---- export -----------------------------------------------------------------------------------

def hf_state_dict(spec: ModelSpec, params: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Our full per-layer tensors as a Hugging Face state dict (a tied matrix once, as the embedding)."""
    out = {}
    for layer, tensors in params.items():
        table = list(hf_names(spec, layer))  # a fused tensor's blocks in table order
        names = {name: hf_name(spec, layer, name) for name in sorted(tensors, key=lambda n: (n not in table,
                                                                                          table.index(n) if n in table else 0))}
        for theirs, ours in _by_hf_name(names).items():
            out[theirs] = tensors[ours[0]] if len(ours) == 1 else torch.cat([tensors[n] for n in ours], dim=0)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Exported:
    out_dir: Path
    model: str
    step: int  # of the checkpoint written out
    num_parameters: int  # as transformers' num_parameters() counts them (a tied matrix once)
    dtype: str
    config_from: str | None  # the pretrained folder whose other config keys (token ids) were kept
    tokenizer_from: str | None = None  # the folder whose tokenizer files were copied


def export_checkpoint(ckpt_url: str, out_dir: str | Path, *, dtype: str = "float32",
                      tokenizer_from: str | None = None) -> Exported:
    """Write the latest valid checkpoint under ``ckpt_url`` as ``config.json`` + ``model.safetensors``.
    A job that started from pretrained weights keeps that config's other keys (token ids, ...)
    when its folder is still readable.  The tokenizer's files come from ``tokenizer_from``, else
    from the pretrained folder or the model's own folder when they hold them."""
    torch_dtype = EXPORT_DTYPES.get(dtype)
    if torch_dtype is None:
        raise InputError(f"dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    info = ckpt.latest_valid_checkpoint(ckpt_url)
    if info is None:
        raise InputError(f"no valid checkpoint under {ckpt_url}")
    # the plan carries a model folder's spec: the export needs no catalog entry nor the folder
    spec = get_model(plan_from_dict(info.meta["plan"], validate=False).model)
    storage = open_storage(ckpt_url)
    params = {i: ckpt.read_layer(storage, info, i)["params"] for i in range(spec.num_layer_indices)}
    tensors = {k: v.to(torch_dtype).contiguous() for k, v in hf_state_dict(spec, params).items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    config_from = info.meta.get("init_from")
    base = _readable_config(config_from)
    config = hf_config(spec, dtype=dtype, base=base)
    (out / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = _readable_json(config_from, GENERATION_CONFIG) or _generation_config(spec)
    if generation:
        (out / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    tokenizer = _copy_tokenizer([tokenizer_from] if tokenizer_from else [config_from, spec.name], out)
    return Exported(out_dir=out, model=spec.name, step=info.step,
                    num_parameters=sum(t.numel() for t in tensors.values()), dtype=dtype,
                    config_from=config_from if base is not None else None, tokenizer_from=tokenizer)


def _copy_tokenizer(candidates: list[str | None], out: Path) -> str | None:
    """Copy the tokenizer files of the first candidate folder that has a ``tokenizer_config.json``
    or ``tokenizer.json``; which folder (None: none had them).  A model's name is a folder only
    when it is a path or URL (a catalog name is not)."""
    for url in candidates:
        if not url or "/" not in url:
            continue
        try:
            storage = open_storage(url)
            found = {name: storage.get(name) for name in TOKENIZER_FILES if storage.exists(name)}
        except (OSError, SailorError):
            continue
        if {"tokenizer_config.json", "tokenizer.json"} & set(found):
            for name, data in found.items():
                (out / name).write_bytes(data)
            return url
    return None


def _generation_config(spec: ModelSpec) -> dict | None:
    """What ``save_pretrained`` writes for a model without a generation config of its own: its token ids."""
    ids = generation_token_ids(spec)
    return {**ids, "_from_model_config": True} if ids else None


def _readable_json(url: str | None, name: str) -> dict | None:
    """The JSON object ``name`` of the folder at ``url``; None when there is none."""
    if not url:
        return None
    try:
        doc = json.loads(open_storage(url).get(name))
    except (OSError, ValueError, SailorError):
        return None
    return doc if isinstance(doc, dict) else None


def _readable_config(url: str | None) -> dict | None:
    if not url:
        return None
    try:
        return read_hf_config(url)
    except InputError:
        return None
