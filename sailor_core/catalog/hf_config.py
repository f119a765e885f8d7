"""Hugging Face ``config.json`` <-> ``ModelSpec`` for the families (no torch, no transformers).

``spec_from_hf_config`` reads OPT (``model_type: opt``), GPT-Neo (``gpt_neo``) and the
Llama-style families (``llama``, ``qwen2``, ``qwen3``, ``mistral``, ``phi3``, ``gemma2``,
``gemma3_text``: ``catalog/hf_families.py``) configs, in transformers 4's and 5's spellings
(RoPE as ``rope_theta`` + ``rope_scaling`` or as ``rope_parameters``), and refuses what the
engine does not build (another activation, biases switched off or on where the family has
none, another RoPE type).  ``hf_config`` writes the spelling both
versions read.  ``check_hf_config`` says in one line how a checkpoint's config differs
from a catalog model (``sailor train --init-from``).
"""

from __future__ import annotations

import json
from typing import Any

from sailor_core.catalog.hf_families import HF_TYPES, MODEL_TYPES, llama_style_config, llama_style_spec, require
from sailor_core.catalog.models import ModelSpec, get_model, normalize_model_name, register_model
from sailor_core.errors import InputError, SailorError, UnknownNameError
from sailor_core.storage import open_storage

CONFIG = "config.json"
_MODEL_TYPES = {"opt": "opt", "gpt_neo": "gptneo", **MODEL_TYPES}
_ARCHITECTURES = {"opt": "OPTForCausalLM", "gptneo": "GPTNeoForCausalLM",
                  **{family: arch for family, (_, arch) in HF_TYPES.items()}}


def spec_from_hf_config(cfg: dict[str, Any], *, name: str = "hf-model", seq_len: int | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face ``config.json`` (OPT, GPT-Neo or a Llama-style family); InputError for
    another architecture or a feature the engine does not build."""
    refuse_unsupported(cfg)
    family = _MODEL_TYPES.get(str(cfg.get("model_type")))
    if family is None:
        raise InputError(f"config.json: model_type {cfg.get('model_type')!r} is not one of "
                         f"{', '.join(_MODEL_TYPES)}")
    build = {"opt": _opt_spec, "gptneo": _gptneo_spec}.get(family)
    try:
        fields = build(cfg) if build else llama_style_spec(cfg, family)
        max_pos = int(cfg.get("max_position_embeddings", 2048))
        vocab = int(cfg["vocab_size"])
    except InputError:
        raise
    except KeyError as exc:
        raise InputError(f"config.json: no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"config.json: a value of the wrong kind ({exc})") from None
    return ModelSpec(name=name, family=family, seq_len=seq_len or min(max_pos, 2048), max_position_embeddings=max_pos,
                     vocab_size=vocab, **fields, **token_ids(cfg))


_require = require


def _opt_spec(cfg: dict) -> dict:
    _require(cfg, "activation_function", "relu", "relu")
    _require(cfg, "enable_bias", True, True)
    _require(cfg, "layer_norm_elementwise_affine", True, True)
    _require(cfg, "_remove_final_layer_norm", False, False)
    h = int(cfg["hidden_size"])
    proj = int(cfg.get("word_embed_proj_dim") or h)
    heads = int(cfg["num_attention_heads"])
    return {"num_layers": int(cfg["num_hidden_layers"]), "hidden_size": h, "ffn_size": int(cfg["ffn_dim"]),
            "num_heads": heads, "num_kv_heads": heads, "word_embed_proj_dim": proj if proj != h else None,
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", True)),
            "pre_norm": bool(cfg.get("do_layer_norm_before", True)), "pad_token_id": cfg.get("pad_token_id", 1)}


def _gptneo_spec(cfg: dict) -> dict:
    _require(cfg, "activation_function", "gelu_new", "gelu_new")
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_heads"])
    layers = (cfg.get("attention_layers")
              or [k for pattern, n in cfg["attention_types"] for _ in range(n) for k in pattern])
    return {"num_layers": int(cfg["num_layers"]), "hidden_size": h,
            "ffn_size": int(cfg.get("intermediate_size") or 4 * h),
            "num_heads": heads, "num_kv_heads": heads, "tie_embeddings": bool(cfg.get("tie_word_embeddings", True)),
            "norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)), "attention_layers": tuple(layers),
            "attention_window": int(cfg.get("window_size", 256)) if "local" in layers else 0}


def hf_config(spec: ModelSpec, *, dtype: str = "float32", base: dict | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``spec`` (RoPE in the spelling transformers 4 and 5 both read);
    ``base``: a config whose other keys (token ids, ...) to keep."""
    common = {"vocab_size": spec.vocab_size, "max_position_embeddings": spec.max_position_embeddings,
              "hidden_size": spec.hidden_size, "tie_word_embeddings": spec.tie_embeddings, "dtype": dtype,
              "architectures": [_ARCHITECTURES[spec.family]], "pad_token_id": spec.pad_token_id}
    if spec.family == "opt":
        arch = {"model_type": "opt", "num_hidden_layers": spec.num_layers, "ffn_dim": spec.ffn_size,
                "num_attention_heads": spec.num_heads, "word_embed_proj_dim": spec.embedding_dim,
                "do_layer_norm_before": spec.pre_norm, "activation_function": "relu", "enable_bias": True,
                "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False,
                "dropout": 0.0, "attention_dropout": 0.0}
    elif spec.family == "gptneo":
        kinds = spec.attention_layers or ("global",) * spec.num_layers
        arch = {"model_type": "gpt_neo", "num_layers": spec.num_layers, "num_heads": spec.num_heads,
                "intermediate_size": spec.ffn_size, "activation_function": "gelu_new",
                "layer_norm_epsilon": spec.norm_eps, "attention_types": [[[k], 1] for k in kinds],
                "attention_layers": list(kinds), "window_size": spec.attention_window or 256,
                "embed_dropout": 0.0, "attention_dropout": 0.0, "resid_dropout": 0.0}
    else:
        arch = llama_style_config(spec)
    kept = {k: v for k, v in (base or {}).items() if k not in ("rope_parameters", "torch_dtype")}
    # bos and eos: the pretrained folder's (its tokenizer's) over the spec's (a catalog entry's);
    # the pad id is the embedding's padding row, so the spec's
    ids = {k: v for k, v in generation_token_ids(spec).items() if k != "pad_token_id"}
    return {**ids, **kept, **common, **arch}


_ARCH_FIELDS = ("family", "num_layers", "hidden_size", "ffn_size", "num_heads", "num_kv_heads", "vocab_size",
                "word_embed_proj_dim", "tie_embeddings", "pre_norm", "norm_eps", "attention_layers",
                "attention_window", "head_dim", "qkv_bias", "qk_norm", "mlp_activation", "norm_unit_offset",
                "post_norms", "scale_embeddings", "query_pre_attn_scalar", "attn_logit_softcap",
                "final_logit_softcap", "rope_local_theta")
_LLAMA_FIELDS = ("rope_theta", "rope_scaling")


def check_hf_config(spec: ModelSpec, cfg: dict[str, Any], where: str) -> None:
    """InputError naming the differences when ``cfg`` is not the architecture of ``spec``."""
    theirs = spec_from_hf_config(cfg)
    fields = _ARCH_FIELDS + (_LLAMA_FIELDS if spec.is_llama else ()) + (
        () if spec.is_llama else ("max_position_embeddings",))
    diff = [f"{f} {getattr(theirs, f)!r} (model: {getattr(spec, f)!r})" for f in fields
            if getattr(theirs, f) != getattr(spec, f)]
    if diff:
        raise InputError(f"{where} is not a {spec.name}: {'; '.join(diff)}")


def read_hf_config(url: str) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face model folder at ``url`` (a path or a storage URL)."""
    try:
        cfg = json.loads(open_storage(url).get(CONFIG))
    except (OSError, ValueError, SailorError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{url}: no readable {CONFIG} ({reason})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{url}: {CONFIG} is not a JSON object")
    return cfg




# ---- a model given as a folder or URL; what no family builds ------------------------------------

# the keys that make a config a mixture of experts, in the spellings of Mixtral, Qwen2/3-MoE,
# DeepSeek, DBRX/OLMoE and friends
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


def refuse_unsupported(cfg: dict[str, Any]) -> None:
    """InputError naming what no family of the engine builds: a mixture of experts, a RoPE type
    other than ``SUPPORTED_ROPE_TYPES`` (checked before the family, so a Mixtral or a YaRN
    config is refused for that and not merely as an unknown ``model_type``)."""
    for key in _EXPERT_KEYS:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise InputError(f"config.json: a mixture-of-experts model ({key} = {value}) is not supported: "
                             "the engine builds dense models only")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    # transformers 5 may key the parameters by layer type (full_attention, sliding_attention)
    params = ([v for v in rope.values() if isinstance(v, dict)] or [rope]) if isinstance(rope, dict) else []
    for p in params:
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise InputError(f"config.json: RoPE type {kind!r} is not supported "
                             f"({' or '.join(SUPPORTED_ROPE_TYPES)})")


def is_model_url(ref: str) -> bool:
    """Whether ``--model``'s value names a Hugging Face model folder (a path or a storage URL)
    rather than a catalog entry (whose names hold no slash)."""
    return "/" in ref or ref.startswith(".")


def resolve_model(ref: str) -> str:
    """The catalog name ``ref`` stands for, registering the model on the way when ``ref`` is a
    Hugging Face model folder (a path, ``file://``, ``s3://`` or ``gs://`` URL): its spec is its
    ``config.json``'s, named ``ref`` itself, so that the name says where it came from and a
    plan or job that names it is that model.  UnknownNameError for a name no catalog has,
    InputError for a folder without a config the engine builds."""
    try:
        return normalize_model_name(ref)
    except UnknownNameError:
        if not is_model_url(ref):
            raise
    name = ref.rstrip("/") or ref
    try:
        return normalize_model_name(name)  # this process read it already
    except UnknownNameError:
        pass
    try:
        spec = spec_from_hf_config(read_hf_config(name), name=name)
    except InputError as exc:
        raise InputError(f"{name}: {str(exc).removeprefix(name + ': ')}") from None
    register_model(spec)
    return get_model(name).name


def token_ids(cfg: dict[str, Any]) -> dict[str, Any]:
    """The bos and eos ids of a ``config.json`` (a family's own code reads its pad id: OPT's
    defaults to 1)."""
    out = {}
    for key in ("bos_token_id", "eos_token_id"):
        value = cfg.get(key)
        if isinstance(value, list):
            value = tuple(int(v) for v in value)
        out[key] = None if value is None else value if isinstance(value, tuple) else int(value)
    return out


def generation_token_ids(spec: ModelSpec) -> dict[str, Any]:
    """``spec``'s token ids as ``config.json`` and ``generation_config.json`` write them (an eos of
    several ids as a list); the unknown ones left out."""
    ids = {"bos_token_id": spec.bos_token_id, "pad_token_id": spec.pad_token_id,
           "eos_token_id": list(spec.eos_token_id) if isinstance(spec.eos_token_id, tuple) else spec.eos_token_id}
    return {k: v for k, v in ids.items() if v is not None}
