"""Layers built on their own (as the profiler does), TP shard shapes, engine-specific plan checks."""

from __future__ import annotations

import pytest
import torch

from sailor_core.catalog.models import get_model
from sailor_core.errors import PlanError
from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime.model import StageModel, build_layer, check_plan_for_engine

from .conftest import make_plan


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_layers_compose_and_shards_slice_the_full_init(name):
    spec = get_model(name)
    full = build_layer(spec, 1)
    halves = [build_layer(spec, 1, tp_degree=2, tp_rank=r) for r in (0, 1)]
    for pname, dim in full.shard_dims.items():
        whole = getattr(full, pname)
        if dim is None:
            assert torch.equal(getattr(halves[1], pname), whole)
        else:
            assert torch.equal(torch.cat([getattr(h, pname) for h in halves], dim=dim), whole)
    # layer by layer == the whole model, and the model learns nothing odd: loss ~ ln(vocab)
    x, y = torch.randint(0, spec.vocab_size, (2, 2, 16))  # labels apart from inputs: a tied head favours x
    h = x
    for i in range(spec.num_layer_indices - 1):
        h = build_layer(spec, i)(h)
    loss = build_layer(spec, spec.num_layer_indices - 1)(h, y).detach()  # a tied head on its own: a copy
    assert torch.allclose(loss, StageModel(spec, 0, spec.num_layer_indices)(x, y).detach())
    assert abs(loss.item() - torch.log(torch.tensor(float(spec.vocab_size)))) < 0.5


def test_engine_rejects_tp_that_does_not_split_kv_heads_and_mixed_devices():
    with pytest.raises(PlanError, match="KV heads"):
        check_plan_for_engine(make_plan("tiny-llama", [(0, 4, [4])]))
    mixed = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])]).to_dict()
    mixed["stages"][1]["replicas"][0]["gpu"] = "A100-40"
    with pytest.raises(PlanError, match="entirely on CPUs or entirely on GPUs"):
        check_plan_for_engine(plan_from_dict(mixed))
    with pytest.raises(PlanError, match="layer index"):
        build_layer(get_model("tiny"), 4)
