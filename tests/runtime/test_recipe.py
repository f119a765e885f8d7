"""The training recipe: the schedule's values, the weight-decay rule, the optimizer's groups."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sailor_core.catalog.models import get_model
from sailor_core.errors import InputError
from sailor_core.job.spec import JobSpec, worker_fields
from sailor_core.runtime.model import StageModel
from sailor_core.runtime.recipe import Recipe, make_recipe
from sailor_core.runtime.optimizer import apply_recipe, decay_groups, decays, make_optimizer


def test_warm_up_then_cosine_to_the_floor():
    r = Recipe(total_steps=10, learning_rate=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    # linear warm-up: (s + 1) / (warmup + 1) of the peak, so the first step already moves
    assert [r.lr_at(s) for s in range(4)] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4])
    assert r.lr_at(4) == pytest.approx(1e-3)  # the peak right after the warm-up
    # cosine over steps 4..9: half-way (step 6.5) would be the middle; step 6 is 2/5 of the way
    assert r.lr_at(6) == pytest.approx(1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * 2 / 5)))
    assert r.lr_at(9) == pytest.approx(1e-4)  # the floor at the job's last step
    assert r.lr_at(50) == pytest.approx(1e-4)  # and after it (a run extended past its schedule)
    lrs = [r.lr_at(s) for s in range(4, 10)]
    assert lrs == sorted(lrs, reverse=True)


def test_the_defaults_are_the_jobs():
    spec = JobSpec(budget_usd=1)
    r = Recipe(total_steps=spec.steps)
    assert {f.name: getattr(r, f.name) for f in worker_fields() if f.name != "warmup_steps"} == {
        f.name: getattr(spec, f.name) for f in worker_fields() if f.name != "warmup_steps"}
    assert r.warmup_steps == 2  # 5 % of 30 steps, rounded up
    assert Recipe(total_steps=1000).warmup_steps == 50 and Recipe(total_steps=1).warmup_steps == 1
    assert Recipe(total_steps=1).lr_at(0) == pytest.approx(spec.learning_rate / 2)
    assert Recipe(total_steps=5, warmup_steps=0).lr_at(0) == pytest.approx(spec.learning_rate)


def test_a_checkpoints_recipe_is_continued_and_bad_values_are_refused():
    r = Recipe(total_steps=40, learning_rate=3e-4, warmup_steps=7, min_lr_ratio=0.0, weight_decay=0.05,
               grad_clip_norm=0.0)
    asked = Recipe(total_steps=80, validate_every_steps=3)
    assert asked.continued({**r.to_dict(), "from_a_later_version": 1}) == r
    # a checkpoint without a value (written before its option existed) keeps the asked one
    kept = {k: v for k, v in r.to_dict().items() if k != "validate_every_steps"}
    assert asked.continued(kept) == dataclasses.replace(r, validate_every_steps=3)
    for bad in ({"total_steps": 0}, {"learning_rate": 0.0}, {"warmup_steps": -1}, {"min_lr_ratio": 1.5},
                {"grad_clip_norm": -1.0}, {"init_from": "relative/folder"}):
        with pytest.raises(InputError):
            Recipe(**{"total_steps": 5, **bad})
    with pytest.raises(InputError, match="^--lr must be positive"):  # named as the workers' flag
        make_recipe(5, {"learning_rate": -1.0})


def test_weight_decay_only_on_weight_matrices():
    model = StageModel(get_model("tiny"), 0, 4)
    named = {f"{layer.layer_index}.{name}": p for layer, name, p in model.named_layer_params()}
    decayed = {n for n, p in named.items() if decays(n.split(".", 1)[1], p)}
    assert {"0.tok", "0.pos"}.isdisjoint(decayed)  # embeddings
    assert not {n for n in decayed if n.endswith(("_b", "norm1_w", "norm2_w", "norm_w"))}  # biases, norms
    assert {"1.q_w", "1.o_w", "1.up_w", "2.down_w"} <= decayed
    assert "3.lm_w" in decayed or "3.lm_w" not in named  # an untied head's matrix decays; a tied one is tok
    assert decayed == {n for n, p in named.items() if p.ndim == 2 and not n.startswith("0.")}

    groups = decay_groups(model, 0.1)
    opt = make_optimizer(groups, 1e-3)
    assert [(g["weight_decay"], len(g["params"])) for g in opt.param_groups] == [
        (0.1, len(decayed)), (0.0, len(named) - len(decayed))]
    apply_recipe(opt, Recipe(total_steps=10, warmup_steps=4, weight_decay=0.2), step=1)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.4e-3, 0.4e-3])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]


def test_an_undecayed_parameter_is_not_shrunk():
    """With zero gradients AdamW's decay alone moves a parameter: weights shrink, embeddings do not."""
    model = StageModel(get_model("tiny"), 0, 2)  # the embedding and the first block
    tok, q_w = model.layers[0].tok, model.layers[1].q_w
    tok_before, q_before = tok.detach().clone(), q_w.detach().clone()
    opt = make_optimizer(decay_groups(model, 0.5), 1e-2)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(tok, tok_before)
    assert torch.allclose(q_w, q_before * (1 - 1e-2 * 0.5))


def test_tracker_flags_reach_the_workers_and_follow_each_attempt():
    import argparse

    from sailor_core.job.worker_args import add_worker_arguments, worker_argv, worker_values

    spec = JobSpec(budget_usd=1, wandb_project="team-runs", mlflow_tracking_uri="file:///tmp/mlruns")
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    parsed = parser.parse_args(worker_argv(spec))
    recipe = make_recipe(spec.steps, worker_values(parsed))
    assert (recipe.wandb_project, recipe.mlflow_tracking_uri) == ("team-runs", "file:///tmp/mlruns")
    # a checkpoint's recipe keeps the training's values, not where an earlier attempt logged
    earlier = Recipe(total_steps=30, wandb_project="old", learning_rate=2e-3)
    continued = recipe.continued(earlier.to_dict())
    assert continued.wandb_project == "team-runs" and continued.learning_rate == 2e-3


@pytest.mark.parametrize("field, value, problem", [
    ("wandb_project", "team/runs", "not a W&B project name"),
    ("mlflow_tracking_uri", "ftp://host", "must be an http"),
    ("mlflow_tracking_uri", "https://me:secret@mlflow.example.com", "must not carry credentials"),
])
def test_bad_tracker_flags_are_refused_in_one_line(field, value, problem):
    from sailor_core.job.spec import JobSpecError

    with pytest.raises(JobSpecError, match=problem):
        JobSpec(budget_usd=1, **{field: value})
