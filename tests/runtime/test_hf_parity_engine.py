"""The parity matrix with real workers (slow: nine launches): each family's catalog test model,
started from a random ``transformers`` model with ``--init-from``, gives as its first step's loss
(before any update) ``transformers``' loss on the same samples, under PP 1 and 2, TP 1 and 2, and
stages whose replicas differ in TP degree; and, for the families whose weights or features are the
most particular (Phi-3's fused tensors, Gemma 2 and 3, Qwen2's biases), a run's export reloads in
transformers with the engine's logits.  The default run checks the same matrix in one process
(``test_hf_parity.py``) and the whole path once (``test_hf_roundtrip.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sailor_core.catalog.hf_config import hf_config
from sailor_core.catalog.models import get_model
from sailor_core.runtime.data import TokenDataset
from sailor_core.runtime.launch import launch_local

from .conftest import make_plan

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

PLANS = {
    "pp1-tp1": [(0, 4, [1])],
    "pp2-tp2": [(0, 2, [2]), (2, 4, [2])],
    "pp2-mixed-tp": [(0, 2, [1, 2]), (2, 4, [2, 1])],
}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "tiny-llama", "tiny-neo", "tiny-qwen2", "tiny-mistral", "tiny-qwen3",
                                   "tiny-phi3", "tiny-gemma2", "tiny-gemma3"])
def test_first_step_loss_equals_transformers(model, corpus, tmp_path):
    transformers.logging.set_verbosity_error()
    spec = get_model(model)
    torch.manual_seed(11)
    config = transformers.AutoConfig.for_model(**hf_config(spec))
    hf = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    for name, stages in PLANS.items():
        plan = make_plan(model, stages)
        data = TokenDataset(corpus, plan.effective_seq_len(), spec.vocab_size, validation_fraction=0.01,
                            min_val_samples=plan.global_batch_size)
        with torch.no_grad():
            want = sum(float(F.cross_entropy(hf(input_ids=x).logits.reshape(-1, spec.vocab_size), y.reshape(-1)))
                       for x, y in (data.microbatch(0, 0, m, plan.global_batch_size, plan.micro_batch_size)
                                    for m in range(plan.num_microbatches))) / plan.num_microbatches
        res = launch_local(plan, 1, data=corpus, workdir=tmp_path / name, timeout_s=240,
                           worker_args=("--init-from", str(folder), "--validate-every", "0"))
        assert res.status == "ok", (name, res.message, res.stderr_tails)
        assert res.losses[0] == pytest.approx(want, abs=1e-5), name


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-phi3", "tiny-gemma2", "tiny-gemma3", "tiny-qwen2"])
def test_trained_export_reloads_with_the_engines_logits(model, corpus, tmp_path):
    """Two steps on 2 stages x TP 2 from a transformers model, then ``export_checkpoint``: transformers
    loads the folder (Phi-3's fused tensors fused again, the pretrained config's token ids kept) and
    its logits are the engine's on the trained weights."""
    from sailor_core.runtime.engine_run import final_params
    from sailor_core.runtime.hf import export_checkpoint
    from sailor_core.runtime.model import StageModel
    from sailor_core.runtime.stage_checkpoint import load_full_weights

    transformers.logging.set_verbosity_error()
    spec = get_model(model)
    torch.manual_seed(5)
    config = transformers.AutoConfig.for_model(**hf_config(spec), bos_token_id=3, eos_token_id=4)
    hf = transformers.AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    url = str(tmp_path / "ck")
    res = launch_local(make_plan(model, PLANS["pp2-tp2"]), 2, data=corpus, ckpt_dir=url, workdir=tmp_path / "run",
                       timeout_s=240, worker_args=("--init-from", str(folder), "--validate-every", "0"))
    assert res.status == "ok", (res.message, res.stderr_tails)
    out = export_checkpoint(url, tmp_path / "export")
    exported = transformers.AutoModelForCausalLM.from_pretrained(out.out_dir).eval()
    assert type(exported) is type(hf) and exported.num_parameters() == out.num_parameters
    assert (exported.config.bos_token_id, exported.config.eos_token_id) == (3, 4)
    _, params = final_params(url)
    engine = StageModel(spec, 0, spec.num_layer_indices)
    load_full_weights(engine, params, "test")
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        theirs = exported(input_ids=tokens).logits
        assert (theirs - engine(tokens)).abs().max() <= 1e-5
        assert (theirs - hf.eval()(input_ids=tokens).logits).abs().max() > 1e-4  # it trained
