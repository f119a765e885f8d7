"""The Llama-style families' configs: what each switches on, how transformers 4's and 5's spellings
read, and what is refused in one line (no torch: the config mapping alone)."""

from __future__ import annotations

import pytest

from sailor_core.catalog.hf_config import hf_config, spec_from_hf_config
from sailor_core.catalog.models import get_model
from sailor_core.errors import InputError

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 128}


def _spec(model_type: str, **changes):
    return spec_from_hf_config({**BASE, "model_type": model_type, **changes}, name="x", seq_len=64)


def test_each_family_switches_on_its_features():
    assert _spec("qwen2").qkv_bias and not _spec("qwen3").qkv_bias
    qwen3 = _spec("qwen3", head_dim=32)
    assert qwen3.qk_norm and qwen3.head_dim == 32 and qwen3.head_size == 32
    assert _spec("qwen3", head_dim=16).head_size is None  # hidden / heads: no override kept
    gemma = _spec("gemma2", head_dim=24, hidden_activation="gelu_pytorch_tanh")
    assert (gemma.mlp_activation, gemma.norm_unit_offset, gemma.post_norms, gemma.scale_embeddings) == (
        "gelu_tanh", True, True, True)
    assert (gemma.attn_logit_softcap, gemma.final_logit_softcap, gemma.query_pre_attn_scalar) == (50.0, 30.0, 256)
    assert gemma.tie_embeddings  # Gemma's default
    assert gemma.attention_layers == ("local", "global", "local", "global") and gemma.attention_window == 4096
    gemma3 = _spec("gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4, sliding_window=8,
                   hidden_activation="gelu_pytorch_tanh")
    assert gemma3.family == "gemma3" and gemma3.qk_norm and gemma3.attn_logit_softcap is None
    assert (gemma3.rope_theta, gemma3.rope_local_theta) == (1e6, 1e4)
    assert gemma3.attention_layers == ("local",) * 4 and gemma3.attention_window == 8  # every 6th is global


def test_windows_follow_each_familys_config():
    assert _spec("mistral", sliding_window=16).attention_layers == ("local",) * 4
    assert _spec("mistral", sliding_window=None).attention_layers == ()
    assert _spec("mistral").attention_window == 4096  # MistralConfig's default when the key is missing
    assert _spec("phi3", sliding_window=2047).attention_window == 2047
    assert _spec("qwen2", sliding_window=16).attention_layers == ()  # use_sliding_window is false
    qwen = _spec("qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=2)
    assert qwen.attention_layers == ("global", "global", "local", "local") and qwen.attention_window == 16


def test_transformers_5_rope_parameters_read_as_4s_spelling():
    v5 = _spec("gemma3_text", hidden_activation="gelu_pytorch_tanh", rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    v4 = _spec("gemma3_text", hidden_activation="gelu_pytorch_tanh", rope_theta=1e6, rope_local_base_freq=1e4)
    assert v4 == v5


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-4b", "mistral-7b-v0.3", "phi-3-mini", "gemma-2-2b",
                                  "tiny-gemma3", "llama-3.1-8b"])
def test_the_written_config_reads_back_as_the_same_spec(name):
    spec = get_model(name)
    assert spec_from_hf_config(hf_config(spec), name=name, seq_len=spec.seq_len) == spec


@pytest.mark.parametrize("model_type,changes,message", [
    ("qwen3", {"attention_bias": True}, "attention_bias = True is not supported"),
    ("mistral", {"hidden_act": "gelu"}, "hidden_act = 'gelu' is not supported"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
     "RoPE type 'longrope' is not supported"),
    ("phi3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor other than 1"),
    ("gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "RoPE type 'linear'"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma2", {"layer_types": ["full_attention"]}, "layer_types must name"),
    ("mixtral", {}, "model_type 'mixtral' is not one of"),
])
def test_what_the_engine_does_not_build_is_refused_in_one_line(model_type, changes, message):
    with pytest.raises(InputError, match=message) as err:
        _spec(model_type, **changes)
    assert "\n" not in str(err.value)
