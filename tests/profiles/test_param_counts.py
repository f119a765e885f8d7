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
    "opt-350m": {"model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24,
                 "num_attention_heads": 16, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 512, "do_layer_norm_before": False},
    "opt-1.3b": {"model_type": "opt", "hidden_size": 2048, "ffn_dim": 8192, "num_hidden_layers": 24,
                 "num_attention_heads": 32, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 2048},
    "opt-2.7b": {"model_type": "opt", "hidden_size": 2560, "ffn_dim": 10240, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 2560},
    "opt-30b": {"model_type": "opt", "hidden_size": 7168, "ffn_dim": 28672, "num_hidden_layers": 48,
                "num_attention_heads": 56, "vocab_size": 50272, "max_position_embeddings": 2048,
                "word_embed_proj_dim": 7168},
    "gpt-neo-2.7b": {"model_type": "gpt_neo", "hidden_size": 2560, "num_layers": 32, "num_heads": 20,
                     "vocab_size": 50257, "max_position_embeddings": 2048, "window_size": 256,
                     "attention_types": [[["global", "local"], 16]]},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                     "rope_theta": 500000.0, "rope_scaling": _LLAMA3, "tie_word_embeddings": True},
    "llama-3-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                   "tie_word_embeddings": False},
}
# the shipped catalog's models (model_names() also lists models other tests register in-process)
CATALOG = [row["name"] for row in load_data_file("models.json")["models"]]
TEST_MODELS = ("tiny", "tiny-llama", "tiny-neo", "small")
KNOWN = {"opt-350m": 331_196_416, "gpt-neo-2.7b": 2_651_307_520, "llama-3.2-1b": 1_235_814_400,
         "llama-3-8b": 8_030_261_248}  # the model cards' and the H200 measurements' figures


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


def test_every_published_model_is_checked():
    assert set(PUBLISHED) == {n for n in CATALOG if n not in TEST_MODELS}


@pytest.mark.parametrize("name,tp", [(n, t) for n in TEST_MODELS[:3] for t in (1, 2, 4)
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
