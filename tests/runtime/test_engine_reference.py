"""Engine runs of heterogeneous plans match single-process training on the same samples (fp32 CPU)."""

from __future__ import annotations

import pytest

from sailor_core.runtime.engine_run import final_params
from sailor_core.runtime.stage_checkpoint import full_params_close
from sailor_core.runtime.launch import launch_local
from sailor_core.runtime.data import TokenDataset
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.reference import train_reference

from .conftest import make_plan

STEPS = 3


# The 2-stage x 2-replica plan is checked through the CLI (test_cli_engine.py).  One launch
# covers both an uneven 3-stage split and a stage with a TP-2 and a TP-1 replica (process
# start-up dominates these runs); the slow variants check them one by one and with DP 3.
@pytest.mark.parametrize("model,stages", [
    ("tiny-llama", [(0, 1, [1]), (1, 3, [2, 1]), (3, 4, [1])]),
    pytest.param("tiny", [(0, 2, [2, 1]), (2, 4, [1])], marks=pytest.mark.slow),
    pytest.param("tiny", [(0, 1, [1]), (1, 3, [1, 2, 1]), (3, 4, [2])], marks=pytest.mark.slow),
], ids=["uneven-3-stage-mixed-tp-llama", "mixed-tp", "uneven-3-stage-dp3"])
def test_plan_matches_single_process(model, stages, corpus, tmp_path):
    # Clipped every step (the global norm counts TP shards, TP-replicated parameters and the
    # replicas of a stage once each), validated after steps 2 and 3.
    plan = make_plan(model, stages, gbs=12 if len(stages) == 3 else 8)
    res = launch_local(plan, STEPS, data=corpus, ckpt_dir=str(tmp_path / "ck"), workdir=tmp_path,
                       timeout_s=240, worker_args=("--grad-clip-norm", "0.3", "--validate-every", "2"))
    assert res.status == "ok", (res.message, res.stderr_tails)
    ref = train_reference(plan, STEPS, str(corpus),
                          recipe=Recipe(total_steps=STEPS, grad_clip_norm=0.3, validate_every_steps=2))
    assert min(ref.grad_norms) > 0.3
    assert res.steps == [1, 2, 3]
    assert res.losses == pytest.approx(ref.losses, abs=1e-5)
    assert ref.losses[-1] < ref.losses[0]  # it trains
    assert sorted(res.val_losses) == [2, 3]
    assert [res.val_losses[s] for s in (2, 3)] == pytest.approx([ref.val_losses[s] for s in (2, 3)], abs=1e-5)
    info, params = final_params(str(tmp_path / "ck"))
    assert info.step == STEPS and info.meta["next_sample"] == STEPS * plan.global_batch_size
    assert full_params_close(params, ref.params) < 2e-5


@pytest.mark.slow  # 8 processes (~17 s on 2 cores); test_plan_matches_single_process covers the path by default
def test_clipping_validation_and_schedule_match_single_process(corpus, tmp_path):
    """2 stages x 2 replicas x TP 2: the global gradient norm (TP shards summed, replicas and
    TP-replicated parameters counted once) clips as one process does, every step; the warm-up
    and decay follow the schedule; the validation loss is the reference's."""
    plan = make_plan("tiny", [(0, 2, [2, 2]), (2, 4, [2, 2])])
    recipe = Recipe(total_steps=STEPS, learning_rate=2e-3, warmup_steps=1, min_lr_ratio=0.2, weight_decay=0.1,
                    grad_clip_norm=0.3, validate_every_steps=2)
    flags = ["--lr", "2e-3", "--warmup-steps", "1", "--min-lr-ratio", "0.2", "--weight-decay", "0.1",
             "--grad-clip-norm", "0.3", "--validate-every", "2"]
    res = launch_local(plan, STEPS, data=corpus, ckpt_dir=str(tmp_path / "ck"), workdir=tmp_path, timeout_s=240,
                       worker_args=tuple(flags))
    assert res.status == "ok", (res.message, res.stderr_tails)
    ref = train_reference(plan, STEPS, str(corpus), recipe=recipe)
    assert min(ref.grad_norms) > 0.3  # every step clips
    assert res.losses == pytest.approx(ref.losses, abs=1e-5)
    assert sorted(res.val_losses) == sorted(ref.val_losses) == [2, 3]
    assert [res.val_losses[s] for s in (2, 3)] == pytest.approx([ref.val_losses[s] for s in (2, 3)], abs=1e-5)
    info, params = final_params(str(tmp_path / "ck"))
    assert full_params_close(params, ref.params) < 2e-5
    assert info.meta["recipe"] == recipe.to_dict()
    assert info.meta["data"]["num_val_samples"] == ref_held_out(corpus, plan)


def ref_held_out(corpus, plan) -> int:
    """The samples the job's default split holds out of the corpus (1 %, at least a global batch)."""
    return TokenDataset(corpus, plan.effective_seq_len(), validation_fraction=0.01,
                        min_val_samples=plan.global_batch_size).split.num_val_samples
