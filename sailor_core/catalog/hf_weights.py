"""A Hugging Face model folder's weights without torch: which tensor names each of our
parameters has in a family's files, the safetensors headers, and the check of a folder's
weights against a model before anything is rented (``check_weights``).

A safetensors file is an 8-byte little-endian header size, a JSON header
``{name: {dtype, shape, data_offsets}}``, then the raw tensors: the header says every tensor's
name and shape, so a folder is checked by reading its headers only.  The engine reads the
tensors themselves (``runtime/hf.py``, with torch) by the same names.
"""

from __future__ import annotations

import json
import math
import struct

from sailor_core.catalog.layers import total_params
from sailor_core.catalog.models import ModelSpec
from sailor_core.errors import InputError, SailorError
from sailor_core.storage import open_storage

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
_ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_MAX_HEADER_BYTES = 100 << 20  # the format's own limit

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

def read_header(storage, filename: str) -> tuple[int, dict]:
    """(offset of the data, {tensor name: {dtype, shape, data_offsets}}) of a safetensors file;
    InputError naming the file when its header does not parse."""
    try:
        (size,) = struct.unpack("<Q", storage.get_range(filename, 0, 8))
        if size > _MAX_HEADER_BYTES:
            raise ValueError(f"a header of {size} bytes")
        header = json.loads(storage.get_range(filename, 8, 8 + size))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{storage.url}/{filename}: not a safetensors file (its header does not parse: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise InputError(f"{storage.url}/{filename}: not a safetensors file (its header is not a JSON object)")
    return 8 + size, header


def weight_files(storage, url: str) -> dict[str, str]:
    """{tensor name: file} of the folder's weights (one file or a sharded index)."""
    if storage.exists(WEIGHTS_INDEX):
        try:
            return dict(json.loads(storage.get(WEIGHTS_INDEX))["weight_map"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{url}/{WEIGHTS_INDEX}: not a weights index ({type(exc).__name__}: {exc})") from None
    if not storage.exists(WEIGHTS):
        raise InputError(f"{url}: neither {WEIGHTS} nor {WEIGHTS_INDEX}")
    return {name: WEIGHTS for name in read_header(storage, WEIGHTS)[1] if name != "__metadata__"}


def find_tensor(files: dict[str, str], name: str) -> str | None:
    """The name a file uses: ours, or without the prefix of the base model (OPTModel, GPTNeoModel,
    LlamaModel files)."""
    if name in files:
        return name
    bare = name.removeprefix("model.").removeprefix("transformer.")
    return bare if bare in files else None


def by_hf_name(names: dict[str, str]) -> dict[str, list[str]]:
    """{HF name: our names, in table order} (several: a fused tensor's row blocks)."""
    out: dict[str, list[str]] = {}
    for ours, theirs in names.items():
        out.setdefault(theirs, []).append(ours)
    return out


def tensor_rows(spec: ModelSpec, name: str) -> int:
    """Rows of one block of a fused tensor: q, k, v projections or the gate and up halves."""
    return {"q_w": spec.num_heads * spec.head_dim, "k_w": spec.num_kv_heads * spec.head_dim,
            "v_w": spec.num_kv_heads * spec.head_dim}.get(name, spec.ffn_size)


# ---- the check before renting -----------------------------------------------------------------

def check_weights(url: str, spec: ModelSpec) -> None:
    """InputError naming the file and the tensor when the folder's weights would not load into
    ``spec``: a header that does not parse, a tensor whose bytes are not its shape's or lie
    outside its file, a tensor the model needs missing, an embedding of another shape, or
    tensors holding another number of parameters than the model has."""
    storage = open_storage(url)
    try:
        files = weight_files(storage, url)
        needed = {theirs for layer in range(spec.num_layers + 2) for theirs in by_hf_name(hf_names(spec, layer))}
        found = {theirs: find_tensor(files, theirs) for theirs in needed}
        missing = sorted(t for t, f in found.items() if f is None)
        if missing:
            raise InputError(f"{url}: the weights have no tensor {missing[0]}"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        shapes: dict[str, tuple[int, ...]] = {}
        for filename in sorted({files[f] for f in found.values()}):
            start, header = read_header(storage, filename)
            file_bytes = storage.size(filename)
            for name, entry in header.items():
                if name != "__metadata__":
                    shapes[name] = _checked_entry(f"{url}/{filename}", name, entry, file_bytes - start)
    except SailorError as exc:
        raise InputError(str(exc).splitlines()[0]) from None
    _check_shapes(url, spec, {theirs: shapes.get(f) for theirs, f in found.items()}, files)


def _checked_entry(where: str, name: str, entry, data_bytes: int) -> tuple[int, ...]:
    """The tensor's shape, once its dtype, shape and byte range agree with each other and the file."""
    try:
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
        item = _ITEM_BYTES[entry["dtype"]]
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{where}: tensor {name}'s header entry is malformed") from None
    if not 0 <= begin <= end <= data_bytes:
        raise InputError(f"{where}: tensor {name} lies outside the file (bytes {begin}-{end} of {data_bytes}): "
                         "the file is truncated or corrupt")
    if end - begin != math.prod(shape) * item:
        raise InputError(f"{where}: tensor {name} holds {end - begin} bytes, not the {math.prod(shape) * item} "
                         f"of its shape {list(shape)}")
    return shape


def _check_shapes(url: str, spec: ModelSpec, shapes: dict[str, tuple[int, ...] | None], files: dict[str, str]
                  ) -> None:
    embedding = hf_name(spec, 0, "tok")
    width = spec.word_embed_proj_dim or spec.hidden_size
    got = shapes.get(embedding)
    if got is not None and got != (spec.vocab_size, width):
        raise InputError(f"{url}/{files[find_tensor(files, embedding)]}: {embedding} has shape {list(got)}, "
                         f"not the model's [{spec.vocab_size}, {width}]")
    num_params = sum(math.prod(s) for s in shapes.values() if s is not None)
    expected = total_params(spec)
    if num_params != expected:
        raise InputError(f"{url}: the weights hold {num_params} parameters, not the {expected} of {spec.name} "
                         "(a tensor of another shape)")
