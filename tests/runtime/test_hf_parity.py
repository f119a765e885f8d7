"""The engine's models are Hugging Face ``transformers``' models: same weights, same logits and loss.

For each family a small random config is built with ``transformers`` (every parameter perturbed,
so biases and norms are not at their initial values), saved with ``save_pretrained`` and read
back by ``runtime/hf.py``.  The engine then computes the logits and the loss stage by stage
under several plans: PP 1 and 2, TP 1 and 2, and stages whose replicas differ in TP degree
(each replica must give the same output).  TP ranks run as threads with the real collectives
(``tp_threads.py``).  The vocabularies (97, 101) are odd, so TP 2 splits them unevenly.  For one
PP-2 TP-2 plan the gradients are checked too: the first stage's embedding gradient plus the
last stage's tied copy's (what the trainer's embedding group sums) is Hugging Face's.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from safetensors.torch import save_file

from sailor_core.catalog.hf_config import hf_config, spec_from_hf_config
from sailor_core.catalog.models import register_model
from sailor_core.runtime.hf import WEIGHTS, hf_state_dict, read_hf_weights
from sailor_core.runtime.model import TIED, StageModel
from sailor_core.runtime.stage_checkpoint import load_full_weights, weight_layers

from tests.hf_tiny import perturbed_model, tiny_configs

from .tp_threads import run_tp, threaded_world

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

SEQ, BATCH = 12, 2
TOL = 1e-5


# stages: (layer start, layer end or None for the last index + 1, TP degree of each replica)
PLANS = {
    "pp1-tp1": [(0, None, (1,))],
    "pp1-tp2": [(0, None, (2,))],
    "pp2-tp2": [(0, 2, (2,)), (2, None, (2,))],
    "pp2-mixed-tp": [(0, 2, (1, 2)), (2, None, (2, 1))],
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """{name: (spec, full weights, HF model, tokens, labels)}, each model saved and read back."""
    transformers.logging.set_verbosity_error()
    out = {}
    for key, config in tiny_configs().items():
        model = perturbed_model(config, seed=0)
        folder = tmp_path_factory.mktemp(key)
        model.save_pretrained(folder)
        spec = spec_from_hf_config(json.loads((folder / "config.json").read_text()), name=f"hf-parity-{key}",
                                   seq_len=SEQ)
        register_model(spec)
        weights = read_hf_weights(str(folder), spec, range(spec.num_layer_indices))
        gen = torch.Generator().manual_seed(1)
        tokens, labels = torch.randint(0, spec.vocab_size, (2, BATCH, SEQ), generator=gen)
        out[key] = (spec, weights, model, tokens, labels)
    return out


def _stage(spec, weights, start, end, tp, rank, group) -> StageModel:
    model = StageModel(spec, start, end, tp, rank, group)
    load_full_weights(model, {i: weights[i] for i in weight_layers(model)}, "test")
    return model


@pytest.mark.parametrize("family", list(tiny_configs()))
def test_logits_and_loss_equal_transformers_under_every_plan(families, family):
    spec, weights, hf_model, tokens, labels = families[family]
    with torch.no_grad():
        hf_logits = hf_model(input_ids=tokens).logits
    hf_loss = F.cross_entropy(hf_logits.reshape(-1, spec.vocab_size), labels.reshape(-1))
    last = spec.num_layer_indices
    with threaded_world(), torch.no_grad():
        for plan_name, stages in PLANS.items():
            x = tokens
            for start, end, degrees in stages:
                end = end or last
                outs = []
                for tp in degrees:
                    def forward(rank, group, start=start, end=end, tp=tp, x=x):
                        model = _stage(spec, weights, start, end, tp, rank, group)
                        return (model(x), model(x, labels)) if end == last else (model(x), None)
                    outs += run_tp(tp, forward)  # every TP rank's output
                for out, loss in outs[1:]:  # the replicas (and TP ranks) of a stage agree
                    assert (out - outs[0][0]).abs().max() <= TOL, (plan_name, start)
                x = outs[0][0]
            logits, loss = outs[0]
            assert logits.shape == hf_logits.shape
            diff = float((logits - hf_logits).abs().max())
            assert diff <= TOL, (plan_name, diff)
            # Logits within TOL bound the mean cross-entropy within 2 TOL (its log-sum-exp and its
            # target logit each move by at most the largest logit difference).
            assert abs(float(loss) - float(hf_loss)) <= 2 * TOL, (plan_name, diff)


@pytest.mark.parametrize("family", ["opt-350m-like", "gpt-neo", "llama-3.2-like", "llama-3-like", "qwen2",
                                    "qwen2-tied", "mistral", "qwen3", "phi3", "gemma2", "gemma3"])
def test_gradients_equal_transformers_pp2_tp2(families, family):
    """Stage 1 of 2 (TP 2) forward and backward, then stage 0 (TP 2) backward from its output
    gradient; a tied matrix's gradient is the sum of the two stages' (the embedding group's sum)."""
    spec, weights, hf_model, tokens, labels = families[family]
    hf_model.zero_grad()
    logits = hf_model(input_ids=tokens).logits
    F.cross_entropy(logits.reshape(-1, spec.vocab_size), labels.reshape(-1)).backward()
    hf_grads = dict(hf_model.named_parameters())
    split, last = 2, spec.num_layer_indices

    def run(start, end, x, grad_out):
        def step(rank, group):
            model = _stage(spec, weights, start, end, 2, rank, group)
            inp = x if start == 0 else x.clone().requires_grad_(True)
            out = model(inp, labels) if end == last else model(inp)
            out.backward() if grad_out is None else out.backward(grad_out)
            grads = {(layer.layer_index, name): (layer, p.grad) for layer, name, p in model.named_layer_params()}
            return out.detach(), None if start == 0 else inp.grad, grads
        return run_tp(2, step)

    with threaded_world():
        hidden = run(0, split, tokens, torch.zeros(BATCH, SEQ, spec.hidden_size))[0][0]
        tail = run(split, last, hidden, None)
        head = run(0, split, tokens, tail[0][1])
    ours: dict[tuple[int, str], torch.Tensor] = {}
    for ranks in (head, tail):
        for key, (layer, _) in ranks[0][2].items():
            shards = [r[2][key][1] for r in ranks]
            dim = layer.shard_dims[key[1]]
            full = shards[0] if dim is None else torch.cat(shards, dim=dim)
            target = (0, TIED) if key[1] in layer.tied else key  # the copy's gradient adds to layer 0's
            ours[target] = ours[target] + full if target in ours else full
    assert spec.tie_embeddings == bool(hf_model.config.tie_word_embeddings)
    by_layer: dict[int, dict[str, torch.Tensor]] = {}
    for (layer_index, name), grad in ours.items():
        by_layer.setdefault(layer_index, {})[name] = grad
    named = hf_state_dict(spec, by_layer)  # Phi-3: the fused tensors' gradients, fused
    for hf_key, grad in named.items():
        assert (grad - hf_grads[hf_key].grad).abs().max() <= TOL, hf_key
    assert len(named) == len(hf_grads)


@pytest.mark.parametrize("family", ["llama-3-like", "qwen2", "qwen2-tied", "mistral", "qwen3", "phi3", "gemma2",
                                    "gemma3"])
def test_export_reloads_in_transformers_with_the_engines_logits(families, family, tmp_path):
    """Our tensors written as the family's state dict (Phi-3's fused again) and config; transformers
    loads it with the same class and features, and its logits are the engine's."""
    spec, weights, hf_model, tokens, _ = families[family]
    save_file({k: v.contiguous() for k, v in hf_state_dict(spec, weights).items()}, str(tmp_path / WEIGHTS))
    (tmp_path / "config.json").write_text(json.dumps(hf_config(spec)))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    assert type(reloaded) is type(hf_model)
    assert set(reloaded.state_dict()) == set(hf_model.state_dict())
    for key in ("num_key_value_heads", "head_dim", "tie_word_embeddings", "sliding_window", "layer_types",
                "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "rope_parameters"):
        if getattr(hf_model.config, key, None) is not None:
            assert getattr(reloaded.config, key) == getattr(hf_model.config, key), key
    assert spec_from_hf_config(reloaded.config.to_dict(), name=spec.name, seq_len=SEQ) == spec
    model = StageModel(spec, 0, spec.num_layer_indices)
    load_full_weights(model, weights, "test")
    with torch.no_grad():
        assert (reloaded(input_ids=tokens).logits - model(tokens)).abs().max() <= TOL
