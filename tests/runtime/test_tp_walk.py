"""The planner never picks a TP degree the engine refuses.

Every catalog model x every GPU x every TP degree the planner may pick passes the engine's own
check (``runtime.model.check_tp_degree``) and plan validation, and every degree it leaves out is
one the engine refuses: both apply ``catalog.models.tp_split_problem``.  Then one forward and
backward step of the engine at each of those degrees, on a stand-in of each model with its heads,
KV heads and attention kinds at a small width (TP ranks as threads), gives the TP-1 loss.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sailor_core.catalog.gpus import get_gpu, gpu_names
from sailor_core.catalog.models import get_model, is_shipped_model, model_names, register_model
from sailor_core.errors import PlanError
from sailor_core.plan.types import validate_plan
from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.runtime.model import StageModel, check_tp_degree

from .conftest import make_plan
from .tp_threads import run_tp, threaded_world

SHIPPED = [m for m in model_names() if is_shipped_model(m)]


def _planner_degrees(model: str) -> set[int]:
    return {tp for gpu in gpu_names() for tp in valid_tp_degrees(model, gpu, 16)}


@pytest.mark.parametrize("model", SHIPPED)
def test_the_planner_and_the_engine_agree_on_every_tp_degree(model):
    spec = get_model(model)
    for gpu in gpu_names():
        node = get_gpu(gpu).max_gpus_per_node
        picked = valid_tp_degrees(model, gpu, 16)
        for tp in (d for d in (1, 2, 4, 8, 16) if d <= node):
            if tp in picked:
                check_tp_degree(spec, tp)
            else:
                with pytest.raises(PlanError):
                    check_tp_degree(spec, tp)


def test_tiny_llama_is_never_planned_at_tp_4():
    # 4 heads but 2 KV heads: the plan the workers refused after renting
    assert max(_planner_degrees("tiny-llama")) == 2
    with pytest.raises(PlanError, match="does not divide tiny-llama's 2 KV heads"):
        validate_plan(make_plan("tiny-llama", [(0, 4, [4])]))


def _stand_in(model: str):
    spec = get_model(model)
    kinds = spec.attention_layers[:2]
    small = dataclasses.replace(
        # every planner degree (at most 16) divides an FFN of 96 as it divides the model's own
        spec, name=f"tp-walk-{model}", num_layers=2, hidden_size=spec.num_heads * 8, ffn_size=16 * 6,
        vocab_size=101, seq_len=8, max_position_embeddings=16, word_embed_proj_dim=None, attention_layers=kinds,
        attention_window=min(spec.attention_window, 4) if "local" in kinds else 0,
        pad_token_id=None)
    register_model(small)  # the vocabulary (101 rows) splits unevenly at every degree
    return small


@pytest.mark.parametrize("model", SHIPPED)
def test_one_engine_step_at_every_planned_tp_degree_of_a_stand_in(model):
    degrees = sorted(_planner_degrees(model))
    spec = _stand_in(model)
    gen = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, spec.vocab_size, (2, 2, spec.seq_len), generator=gen)

    def step(rank, group, tp):
        stage = StageModel(spec, 0, spec.num_layer_indices, tp, rank, group)
        loss = stage(tokens, labels)
        loss.backward()
        return float(loss.detach())

    with threaded_world():
        losses = {tp: run_tp(tp, lambda rank, group, tp=tp: step(rank, group, tp)) for tp in degrees}
    reference = losses[1][0]
    for tp, per_rank in losses.items():
        assert all(abs(x - reference) <= 1e-5 for x in per_rank), (model, tp, per_rank)
