"""The Llama-style families' ``config.json`` <-> ModelSpec feature fields (no torch, no transformers).

Llama, Qwen2/2.5, Qwen3, Mistral, Phi-3, Gemma 2 and Gemma 3 share one engine code path
(``runtime/model.py``); this module says, per family, which of ``ModelSpec``'s features its
config switches on, in transformers 4's and 5's spellings, and writes them back as both read
them.  ``catalog/hf_config.py`` dispatches here by ``model_type``.
"""

from __future__ import annotations

from typing import Any

from sailor_core.catalog.models import ModelSpec, RopeScaling
from sailor_core.errors import InputError

# model_type -> family, family -> (model_type, architecture)
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral", "phi3": "phi3",
               "gemma2": "gemma2", "gemma3_text": "gemma3"}
HF_TYPES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
            "qwen3": ("qwen3", "Qwen3ForCausalLM"), "mistral": ("mistral", "MistralForCausalLM"),
            "phi3": ("phi3", "Phi3ForCausalLM"), "gemma2": ("gemma2", "Gemma2ForCausalLM"),
            "gemma3": ("gemma3_text", "Gemma3ForCausalLM")}
_GEMMA = ("gemma2", "gemma3")
_WHOLE_MODEL_WINDOW = ("mistral", "phi3")  # one sliding_window for every layer, or none
_QWEN = ("qwen2", "qwen3")
_LOCAL = {"sliding_attention": "local", "full_attention": "global"}


def require(cfg: dict, key: str, want: Any, default: Any) -> None:
    if cfg.get(key, default) != want:
        raise InputError(f"config.json: {key} = {cfg.get(key, default)!r} is not supported (only {want!r})")


def llama_style_spec(cfg: dict, family: str) -> dict:
    """ModelSpec fields (less name, family, vocabulary, positions) of a Llama-style config."""
    gemma = family in _GEMMA
    if gemma:
        require(cfg, "hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        if cfg.get("use_bidirectional_attention"):
            raise InputError("config.json: use_bidirectional_attention is not supported (a causal decoder only)")
    else:
        require(cfg, "hidden_act", "silu", "silu")
    if family != "qwen2":  # Qwen2 has q/k/v biases whatever the key says; the others none (nor an out bias)
        require(cfg, "attention_bias", False, False)
    require(cfg, "mlp_bias", False, False)
    h, heads, n = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or h // heads)
    theta, scaling, local_theta = _rope(cfg, family)
    kinds, window = _attention_layers(cfg, family, n)
    fields = {"num_layers": n, "hidden_size": h, "ffn_size": int(cfg["intermediate_size"]),
              "num_heads": heads, "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
              "head_size": head_dim if head_dim != h // heads else None,
              "tie_embeddings": bool(cfg.get("tie_word_embeddings", gemma)),
              "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)), "rope_theta": theta, "rope_scaling": scaling,
              "pad_token_id": cfg.get("pad_token_id"), "attention_layers": kinds, "attention_window": window,
              "qkv_bias": family == "qwen2", "qk_norm": family in ("qwen3", "gemma3")}
    if gemma:
        fields.update(mlp_activation="gelu_tanh", norm_unit_offset=True, post_norms=True, scale_embeddings=True,
                      query_pre_attn_scalar=int(cfg.get("query_pre_attn_scalar", 256)),
                      attn_logit_softcap=_float_or_none(cfg.get("attn_logit_softcapping", 50.0 if family == "gemma2"
                                                                else None)),
                      final_logit_softcap=_float_or_none(cfg.get("final_logit_softcapping",
                                                                 30.0 if family == "gemma2" else None)),
                      rope_local_theta=local_theta)
    return fields


def _float_or_none(x) -> float | None:
    return None if x is None else float(x)


def _rope(cfg: dict, family: str) -> tuple[float, RopeScaling | None, float | None]:
    """(theta, Llama 3 scaling, local layers' theta) from transformers 5's ``rope_parameters`` (Gemma 3:
    one per layer type) or transformers 4's ``rope_theta`` + ``rope_scaling``."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    local_theta = None
    if family == "gemma3":
        local = rope.pop("sliding_attention", None) or {}
        rope = rope.pop("full_attention", None) or rope
        local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)))
        if local.get("rope_type", "default") != "default":
            raise InputError(f"config.json: RoPE type {local['rope_type']!r} of the local layers is not supported")
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10_000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise InputError(f"config.json: RoPE type {kind!r} is not supported (default or llama3)")
    if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
        raise InputError("config.json: a partial_rotary_factor other than 1 is not supported")
    scaling = (RopeScaling(factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                           high_freq_factor=float(rope["high_freq_factor"]),
                           original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
               if kind == "llama3" else None)
    return theta, scaling, local_theta


def _attention_layers(cfg: dict, family: str, n: int) -> tuple[tuple[str, ...], int]:
    """(global/local per block, or () when all global; the window), as each family's config decides."""
    window = cfg.get("sliding_window", None if family == "phi3" else 4096)  # the config classes' defaults
    if family == "llama":
        return (), 0
    if family in _WHOLE_MODEL_WINDOW:
        return ((("local",) * n, int(window)) if window else ((), 0))
    if family in _QWEN and not cfg.get("use_sliding_window", False):
        return (), 0
    types = cfg.get("layer_types")
    if types is None and family in _QWEN:
        first = int(cfg.get("max_window_layers", n))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    elif types is None:
        pattern = 2 if family == "gemma2" else int(cfg.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if len(types) != n or set(types) - set(_LOCAL):
        raise InputError(f"config.json: layer_types must name sliding_attention or full_attention for each of "
                         f"the {n} layers")
    kinds = tuple(_LOCAL[t] for t in types)
    if "local" not in kinds or not window:
        return (), 0
    return kinds, int(window)


def llama_style_config(spec: ModelSpec) -> dict[str, Any]:
    """The architecture keys of a Llama-style spec's ``config.json`` (RoPE in transformers 4's spelling,
    which 5 reads too)."""
    model_type, _ = HF_TYPES[spec.family]
    scaling = spec.rope_scaling
    arch = {"model_type": model_type, "num_hidden_layers": spec.num_layers, "intermediate_size": spec.ffn_size,
            "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "rms_norm_eps": spec.norm_eps, "rope_theta": spec.rope_theta,
            "attention_bias": spec.qkv_bias, "mlp_bias": False, "attention_dropout": 0.0,
            "rope_scaling": None if scaling is None else {
                "rope_type": "llama3", "factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_position_embeddings}}
    kinds = spec.attention_layers or ("global",) * spec.num_layers
    types = [next(t for t, k in _LOCAL.items() if k == kind) for kind in kinds]
    window = spec.attention_window or None
    if spec.family in _WHOLE_MODEL_WINDOW:
        if len(set(kinds)) > 1:
            raise InputError(f"{spec.name}: {spec.family} has one sliding window for every layer or none")
        arch["sliding_window"] = window
    elif spec.family in _QWEN:
        first = next((i for i, k in enumerate(kinds) if k == "local"), spec.num_layers)
        arch.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=first,
                    layer_types=types)
    elif spec.family in _GEMMA:
        arch.update(sliding_window=window or 4096, layer_types=types)
    if spec.family in _GEMMA:
        arch.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=spec.query_pre_attn_scalar,
                    attn_logit_softcapping=spec.attn_logit_softcap, final_logit_softcapping=spec.final_logit_softcap)
        if spec.family == "gemma3":
            arch["rope_local_base_freq"] = spec.rope_local_theta
    else:
        arch["hidden_act"] = "silu"
    return arch
