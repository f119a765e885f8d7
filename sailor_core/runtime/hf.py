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
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from sailor_core.catalog.hf_config import (CONFIG, check_hf_config, generation_token_ids, hf_config,
                                          read_hf_config)
from sailor_core.catalog.hf_weights import (WEIGHTS, by_hf_name, find_tensor, hf_name, hf_names,
                                           read_header, tensor_rows, weight_files)
from sailor_core.catalog.models import ModelSpec, get_model
from sailor_core.errors import InputError, SailorError
from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.model import StageModel
from sailor_core.runtime.stage_checkpoint import load_full_weights, weight_layers
from sailor_core.storage import open_storage

GENERATION_CONFIG = "generation_config.json"  # kept from the pretrained folder, else the token ids
# what AutoTokenizer.from_pretrained reads, in the spellings of fast and slow tokenizers
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def _read_tensor(storage, filename: str, data_start: int, entry: dict, name: str) -> torch.Tensor:
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise InputError(f"{filename}: tensor {name} has dtype {entry['dtype']}, not a float type")
    begin, end = entry["data_offsets"]
    data = bytearray(storage.get_range(filename, data_start + begin, data_start + end))
    return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"]).float()


def load_pretrained(model: StageModel, url: str) -> None:
    """Set a stage's parameters from the Hugging Face model folder at ``url`` (InputError when it is
    another model or lacks a tensor)."""
    check_hf_config(model.spec, read_hf_config(url), url)
    load_full_weights(model, read_hf_weights(url, model.spec, weight_layers(model)), url)


def read_hf_weights(url: str, spec: ModelSpec, layer_indices) -> dict[int, dict[str, torch.Tensor]]:
    """{layer index: {our name: full fp32 tensor}} of ``layer_indices`` from a Hugging Face folder."""
    storage = open_storage(url)
    files = weight_files(storage, url)
    headers: dict[str, tuple[int, dict]] = {}
    out: dict[int, dict[str, torch.Tensor]] = {}
    for layer in layer_indices:
        out[layer] = {}
        for theirs, ours in by_hf_name(hf_names(spec, layer)).items():
            found = find_tensor(files, theirs)
            if found is None:
                raise InputError(f"{url}: the weights have no tensor {theirs}")
            filename = files[found]
            if filename not in headers:
                headers[filename] = read_header(storage, filename)
            start, header = headers[filename]
            tensor = _read_tensor(storage, filename, start, header[found], found)
            out[layer].update(_split_fused(spec, ours, tensor, theirs, url))
    return out


def _split_fused(spec: ModelSpec, ours: list[str], tensor: torch.Tensor, theirs: str,
                 url: str) -> dict[str, torch.Tensor]:
    if len(ours) == 1:
        return {ours[0]: tensor}
    rows = [tensor_rows(spec, name) for name in ours]
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
        for theirs, ours in by_hf_name(names).items():
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
