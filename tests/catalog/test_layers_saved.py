"""The activation bytes of ``catalog/layers.py`` under the bf16 autocast regime are what autograd
saves in ``transformers``' models (issue 35): every tensor a forward under ``torch.autocast`` packs
for its backward, its unique storages' bytes, parameters left out.  A block is the difference of
two depths (as ``data/measurements`` were taken), the rest is the embedding + head + loss.

The bf16 logits are not among them (the loss's fp32 cast keeps nothing): the regime counts them in
the loss working memory, once per stage, not once per micro-batch in flight.  An RMSNorm keeps its
input and the normalised tensor (two fp32 tensors of the hidden width), a LayerNorm its input.
"""

from __future__ import annotations

import json

import pytest
import torch

from sailor_core.catalog.hf_config import spec_from_hf_config
from sailor_core.catalog.layers import layer_shapes
from sailor_core.catalog.models import register_model
from sailor_core.regimes import get_regime
from sailor_core.simulator.memory import loss_working_bytes

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

SEQ = 64
REGIME = "torch-bf16-autocast-adamw"


def _configs(layers: int) -> dict:
    t = transformers
    return {
        # OPT-350m's shape: post-LN, no final norm, 512-wide projection in and out (here 64 of 128)
        "opt-350m-like": t.OPTConfig(vocab_size=1001, hidden_size=128, word_embed_proj_dim=64, ffn_dim=512,
                                     num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=SEQ,
                                     do_layer_norm_before=False, dropout=0.0),
        "opt": t.OPTConfig(vocab_size=1001, hidden_size=128, ffn_dim=512, num_hidden_layers=layers,
                           num_attention_heads=4, max_position_embeddings=SEQ, dropout=0.0),
        "llama": t.LlamaConfig(vocab_size=1001, hidden_size=128, intermediate_size=384, num_hidden_layers=layers,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                               tie_word_embeddings=True),
    }


def _saved_bytes(config) -> int:
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, config.vocab_size, (1, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens, labels=tokens).loss
    assert loss.requires_grad
    return sum(seen.values())


@pytest.mark.parametrize("family", ["opt-350m-like", "opt", "llama"])
def test_saved_activations_match_transformers(family):
    two, four = _saved_bytes(_configs(2)[family]), _saved_bytes(_configs(4)[family])
    block, rest = (four - two) / 2, two - (four - two)
    spec = spec_from_hf_config(json.loads(_configs(2)[family].to_json_string()), name=f"saved-{family}",
                               seq_len=SEQ)
    register_model(spec)
    shapes = layer_shapes(spec.name, seq_len=SEQ, regime=REGIME)
    model_block = shapes[1].activation_bytes(1)
    model_rest = shapes[0].activation_bytes(1) + shapes[-1].activation_bytes(1)
    # per-token LayerNorm statistics and the attention's logsumexp are left out of the formulas
    assert model_block == pytest.approx(block, rel=0.02)
    assert model_rest == pytest.approx(rest, rel=0.02)


def test_bf16_logits_are_loss_working_memory_not_saved():
    head = layer_shapes("opt-350m", seq_len=SEQ, regime=REGIME)[-1]
    logits = SEQ * 50272
    working = loss_working_bytes("opt-350m", 1, 1, SEQ, get_regime(REGIME))
    assert working == logits * (2 + 8)  # bf16 logits + the fp32 gradients of log-probs and logits
    # the head keeps the fp32 log-probabilities, not the bf16 logits; the forward still moves them
    assert head.activation_bytes_per_seq < logits * 6
    assert head.traffic_bytes(1) - head.activation_bytes(1) >= logits * 2
