"""Parameter counts: the catalog equals ``transformers``' ``num_parameters()`` for every catalog
model, and the engine and the memory model agree on what each GPU of a stage holds (vocabulary
shards, a tied head's copy on a last stage without the embedding)."""

from __future__ import annotations

import pytest

from sailor_core.catalog.hf_config import hf_config
from sailor_core.catalog.layers import total_params
from sailor_core.catalog._load import load_data_file
from sailor_core.catalog.models import get_model
from sailor_core.profiles import ProfileDB
from sailor_core.regimes import get_regime
from sailor_core.simulator.memory import stage_memory, tied_copy_params

_LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}

# The published config.json files, written out by hand (facebook/opt-*, EleutherAI/gpt-neo-2.7B,
# meta-llama/Llama-3.2-1B, meta-llama/Meta-Llama-3-8B): independent of the catalog they check.
PUBLISHED = {
    "opt-350m": {"bos_token_id": 2, "eos_token_id": 2, "model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24,
                 "num_attention_heads": 16, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 512, "do_layer_norm_before": False},
    "opt-1.3b": {"bos_token_id": 2, "eos_token_id": 2, "model_type": "opt", "hidden_size": 2048, "ffn_dim": 8192, "num_hidden_layers": 24,
                 "num_attention_heads": 32, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 2048},
    "opt-2.7b": {"bos_token_id": 2, "eos_token_id": 2, "model_type": "opt", "hidden_size": 2560, "ffn_dim": 10240, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 2560},
    "opt-30b": {"bos_token_id": 2, "eos_token_id": 2, "model_type": "opt", "hidden_size": 7168, "ffn_dim": 28672, "num_hidden_layers": 48,
                "num_attention_heads": 56, "vocab_size": 50272, "max_position_embeddings": 2048,
                "word_embed_proj_dim": 7168},
    "gpt-neo-2.7b": {"bos_token_id": 50256, "eos_token_id": 50256, "model_type": "gpt_neo", "hidden_size": 2560, "num_layers": 32, "num_heads": 20,
                     "vocab_size": 50257, "max_position_embeddings": 2048, "window_size": 256,
                     "attention_types": [[["global", "local"], 16]]},
    "llama-3.2-1b": {"bos_token_id": 128000, "eos_token_id": 128001, "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                     "rope_theta": 500000.0, "rope_scaling": _LLAMA3, "tie_word_embeddings": True},
    "llama-3-8b": {"bos_token_id": 128000, "eos_token_id": 128001, "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                   "tie_word_embeddings": False},
    "llama-3.1-8b": {"bos_token_id": 128000, "eos_token_id": 128001, "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                     "rope_scaling": {**_LLAMA3, "factor": 8.0}, "tie_word_embeddings": False},
    "llama-3.1-70b": {"bos_token_id": 128000, "eos_token_id": 128001, "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
                      "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                      "rope_scaling": {**_LLAMA3, "factor": 8.0}, "tie_word_embeddings": False},
    "llama-3.2-3b": {"bos_token_id": 128000, "eos_token_id": 128001, "model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                     "rope_scaling": _LLAMA3, "tie_word_embeddings": True},
    "qwen2.5-0.5b": {"bos_token_id": 151643, "eos_token_id": 151643, "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                     "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 24,
                     "tie_word_embeddings": True},
    "qwen2.5-1.5b": {"bos_token_id": 151643, "eos_token_id": 151643, "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                     "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 21,
                     "tie_word_embeddings": True},
    "qwen2.5-7b": {"bos_token_id": 151643, "eos_token_id": 151643, "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28,
                   "tie_word_embeddings": False},
    "qwen3-0.6b": {"bos_token_id": 151643, "eos_token_id": 151645, "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "tie_word_embeddings": True},
    "qwen3-4b": {"bos_token_id": 151643, "eos_token_id": 151645, "model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "tie_word_embeddings": True},
    "qwen3-8b": {"bos_token_id": 151643, "eos_token_id": 151645, "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "tie_word_embeddings": False},
    "mistral-7b-v0.3": {"bos_token_id": 1, "eos_token_id": 2, "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 32768, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False},
    "phi-3-mini": {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                   "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                   "rope_theta": 10000.0, "sliding_window": 2047, "pad_token_id": 32000, "bos_token_id": 1,
                   "eos_token_id": 32000, "tie_word_embeddings": False},
    "gemma-2-2b": {"bos_token_id": 2, "eos_token_id": 1, "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                   "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                   "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0},
    "gemma-2-9b": {"bos_token_id": 2, "eos_token_id": 1, "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                   "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                   "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0},
}
# the shipped catalog's models (model_names() also lists models other tests register in-process)
CATALOG = [row["name"] for row in load_data_file("models.json")["models"]]
TEST_MODELS = ("tiny", "tiny-llama", "tiny-neo", "small", "tiny-qwen2", "tiny-mistral", "tiny-qwen3", "tiny-phi3",
               "tiny-gemma2", "tiny-gemma3")
KNOWN = {"opt-350m": 331_196_416, "gpt-neo-2.7b": 2_651_307_520, "llama-3.2-1b": 1_235_814_400,
         "llama-3-8b": 8_030_261_248}  # the model cards' and the H200 measurements' figures
# the sizes the model cards name (billions): the catalog lands within 1% of each
PUBLISHED_SIZES_B = {"llama-3.1-8b": 8.03, "llama-3.1-70b": 70.6, "llama-3.2-3b": 3.21, "qwen2.5-0.5b": 0.49,
                     "qwen2.5-1.5b": 1.54, "qwen2.5-7b": 7.61, "qwen3-0.6b": 0.6, "qwen3-4b": 4.02, "qwen3-8b": 8.19,
                     "mistral-7b-v0.3": 7.25, "phi-3-mini": 3.82, "gemma-2-2b": 2.61, "gemma-2-9b": 9.24}


def _hf_num_parameters(config: dict) -> int:
    import torch  # lazy: only this test builds models
    import transformers  # lazy: loads torch

    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg).num_parameters()


@pytest.mark.parametrize("name", CATALOG)
def test_catalog_params_equal_transformers(name):
    # catalog models from their published config; test models from the config the export writes
    config = PUBLISHED.get(name) or hf_config(get_model(name))
    assert total_params(name) == _hf_num_parameters(config)
    if name in KNOWN:
        assert total_params(name) == KNOWN[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED_SIZES_B))
def test_catalog_params_land_on_the_model_cards_size(name):
    assert total_params(name) == pytest.approx(PUBLISHED_SIZES_B[name] * 1e9, rel=0.01)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_entry_is_its_published_configs_spec(name):
    """The catalog's facts are those of the published config.json (every feature field)."""
    from dataclasses import replace

    from sailor_core.catalog.hf_config import spec_from_hf_config

    spec = get_model(name)
    theirs = spec_from_hf_config({**PUBLISHED[name], "pad_token_id": PUBLISHED[name].get("pad_token_id",
                                                                                         spec.pad_token_id)},
                                 name=name, seq_len=spec.seq_len)
    if spec.family == "opt":  # OPT's pad id is its config's default
        theirs = replace(theirs, pad_token_id=spec.pad_token_id)
    assert theirs == spec


def test_every_published_model_is_checked():
    assert set(PUBLISHED) == {n for n in CATALOG if n not in TEST_MODELS}


@pytest.mark.parametrize("name,tp", [(n, t) for n in TEST_MODELS[:3] + TEST_MODELS[4:] for t in (1, 2, 4)
                                     if get_model(n).num_kv_heads % t == 0]  # TP divides the KV heads
                         + [("small", 2)])  # small: the untied head
def test_engine_stage_params_equal_the_memory_model(name, tp):
    """TP rank 0 (the largest vocabulary shard) of every stage split of the engine holds what the
    memory model counts for one GPU: the layers' parameters, plus a tied copy on a last stage
    without layer 0."""
    from sailor_core.runtime.model import StageModel  # lazy: torch

    spec = get_model(name)
    profile = ProfileDB().get(name, "cpu", tp, 1)
    regime = get_regime(profile.regime)
    last = spec.num_layer_indices
    for start, end in [(0, last), (0, 1), (1, last), (last - 1, last), (1, last - 1)]:
        engine = sum(p.numel() for p in StageModel(spec, start, end, tp, 0).parameters())
        assert stage_memory(profile, start, end, 1, regime, 1 << 40).num_params == engine, (start, end)
    assert (tied_copy_params(profile) > 0) == spec.tie_embeddings


def test_only_a_last_stage_without_the_embedding_holds_the_copy():
    db = ProfileDB()
    llama = db.get("llama-3.2-1b", "A100-40", 4, 1)  # estimated from the catalog's shapes
    regime = get_regime(llama.regime)
    copy = -(-128256 // 4) * 2048
    assert tied_copy_params(llama) == copy
    whole = stage_memory(llama, 0, 18, 1, regime, 1 << 40)
    tail = stage_memory(llama, 9, 18, 1, regime, 1 << 40)
    head = stage_memory(llama, 0, 9, 1, regime, 1 << 40)
    assert whole.num_params == llama.params(0, 18) == total_params("llama-3.2-1b", tp_degree=4)
    assert tail.num_params == llama.params(9, 18) + copy
    assert head.num_params == llama.params(0, 9)
    untied = db.get("llama-3-8b", "A100-40", 4, 1)
    assert tied_copy_params(untied) == 0
