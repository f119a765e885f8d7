"""Pretrained weights in, trained weights out: import a Hugging Face model, train under one plan,
preempt, resume under another plan, export, load with ``transformers``.

tiny-neo (GPT-Neo: tied embeddings, a local-attention block whose window is shorter than the
sequence) starts from a random ``transformers`` model.  Plan A: stage 0 at TP 2 (vocabulary-parallel
embedding), the last stage with 2 TP-1 replicas, each holding the tied copy (so the embedding group
sums full gradients across TP degrees).  Plan B: one stage at TP 2 (vocabulary-parallel head and
loss sharing the embedding's matrix).  The exported folder loads with
``AutoModelForCausalLM.from_pretrained``; its logits equal the engine's on the same tokens, and the
run equals uninterrupted single-process training from the same weights.
"""

from __future__ import annotations

import json

import pytest
import torch

from flows.cli.app import main as sailor
from sailor_core.catalog.models import get_model
from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpec, JobSpecError
from sailor_core.runtime.engine_run import final_params
from sailor_core.runtime.hf import load_pretrained
from sailor_core.runtime.launch import launch_local
from sailor_core.runtime.model import StageModel
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.reference import train_reference
from sailor_core.runtime.stage_checkpoint import full_params_close, load_full_weights

from .conftest import make_plan, sigterm_rank_after_step

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

STEPS = 4
FLAGS = ("--validate-every", "0")


def _neo_config(**changes):
    spec = get_model("tiny-neo")  # its published-style config, written out here
    kw = dict(vocab_size=spec.vocab_size, hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=64,
              attention_types=[[["global", "local"], 1]], window_size=16, bos_token_id=7, eos_token_id=7)
    return transformers.GPTNeoConfig(**{**kw, **changes})


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    transformers.logging.set_verbosity_error()
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(_neo_config()).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    folder = tmp_path_factory.mktemp("pretrained")
    model.save_pretrained(folder)
    return folder


def _sailor(argv: list[str], capsys) -> tuple[int, str, str]:
    """``sailor ARGV`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        sailor(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def _logits(spec, params, tokens):
    model = StageModel(spec, 0, spec.num_layer_indices)
    load_full_weights(model, params, "test")
    with torch.no_grad():
        return model(tokens)


def test_import_train_preempt_resume_export_load(pretrained, corpus, tmp_path, capsys):
    url, init = str(tmp_path / "ck"), ("--init-from", str(pretrained))
    plan_a = make_plan("tiny-neo", [(0, 2, [2]), (2, 4, [1, 1])])
    a = launch_local(plan_a, STEPS, data=corpus, ckpt_dir=url, workdir=tmp_path / "a", timeout_s=240,
                     on_started=sigterm_rank_after_step(2, 2), worker_args=(*init, *FLAGS))
    assert a.status == "preempted", (a.message, a.stderr_tails)
    stop = a.steps[-1]
    assert 2 <= stop < STEPS
    assert "started from the pretrained weights" in a.stderr_tails[0]
    plan_b = make_plan("tiny-neo", [(0, 4, [2])])
    b = launch_local(plan_b, STEPS, data=corpus, ckpt_dir=url, resume=True, workdir=tmp_path / "b", timeout_s=240,
                     worker_args=(*init, *FLAGS))  # the flow always passes --init-from; a resume ignores it
    assert b.status == "ok", (b.message, b.stderr_tails)
    assert "pretrained" not in b.stderr_tails[0]

    ref = train_reference(plan_a, STEPS, str(corpus),
                          recipe=Recipe(total_steps=STEPS, init_from=str(pretrained), validate_every_steps=0))
    assert a.losses + b.losses == pytest.approx(ref.losses, abs=1e-5)
    info, params = final_params(url)
    assert info.meta["init_from"] == str(pretrained)
    assert full_params_close(params, ref.params) < 2e-5

    out = tmp_path / "hf"
    code, stdout, stderr = _sailor(["export", "--checkpoint", url, "--out", str(out), "--json"], capsys)
    assert code == 0, stderr
    row = json.loads(stdout)
    assert (row["model"], row["step"], row["config_from"]) == ("tiny-neo", STEPS, str(pretrained))
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert exported.num_parameters() == row["num_parameters"]
    assert exported.config.bos_token_id == 7  # the pretrained config's other keys are kept
    assert exported.config.tie_word_embeddings and exported.config.attention_layers == ["global", "local"]

    spec = get_model("tiny-neo")
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = exported(input_ids=tokens).logits
    assert (theirs - _logits(spec, params, tokens)).abs().max() <= 1e-5
    assert (theirs - _logits(spec, ref.params, tokens)).abs().max() <= 1e-4  # the uninterrupted run's
    pre = transformers.AutoModelForCausalLM.from_pretrained(pretrained).eval()
    with torch.no_grad():
        assert (pre(input_ids=tokens).logits - theirs).abs().max() > 1e-3  # it trained


def test_a_folder_of_another_model_is_refused_in_one_line(tmp_path):
    transformers.logging.set_verbosity_error()
    transformers.AutoModelForCausalLM.from_config(_neo_config(window_size=8)).save_pretrained(tmp_path)
    model = StageModel(get_model("tiny-neo"), 0, 2)
    with pytest.raises(InputError, match=r"is not a tiny-neo: attention_window 8 \(model: 16\)"):
        load_pretrained(model, str(tmp_path))
    with pytest.raises(InputError, match="no readable config.json"):
        load_pretrained(model, str(tmp_path / "nowhere"))
    with pytest.raises(JobSpecError, match="absolute path or a URL"):
        JobSpec(budget_usd=1.0, init_from="models/neo")
    assert JobSpec(budget_usd=1.0, init_from="s3://bucket/neo").init_from == "s3://bucket/neo"


def test_export_errors_are_one_line(tmp_path, capsys):
    code, _, err = _sailor(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert code != 0 and err.strip().splitlines() == [f"error: no valid checkpoint under {tmp_path}"]
    code, _, err = _sailor(["export", "--out", str(tmp_path / "o")], capsys)
    assert code != 0 and err.strip().splitlines() == ["error: give a job id or --checkpoint URL (one of them)"]
