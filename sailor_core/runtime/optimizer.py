"""The engine's optimizer and how a Recipe drives it: AdamW, its weight-decay groups, the
learning rate of each step.

One configuration for the engine's ranks, the single-process reference and the profiler, so
all three update parameters with the same arithmetic.
"""

from __future__ import annotations

import torch

from sailor_core.runtime.model import StageModel
from sailor_core.runtime.recipe import Recipe

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.01  # the profiler's and benchmarks' optimizer; a job's comes from its Recipe
# Embedding tables by parameter name (``runtime/model.py``): no weight decay, as for GPT-2,
# Megatron and torchtitan (the rows of rare tokens would only shrink).
EMBEDDING_PARAMS = frozenset({"tok", "pos"})


def make_optimizer(params, lr: float, weight_decay: float = WEIGHT_DECAY) -> torch.optim.Optimizer:
    """One optimizer configuration for the engine, the profiler and the single-process reference.

    ``params``: tensors, or parameter groups (``decay_groups``; a group's own
    ``weight_decay`` wins).  On CUDA, fused AdamW: one kernel for all parameters instead of a
    handful per parameter (opt-350m on an H200: 3.6 ms per step, against 22-28 ms with
    ``foreach=False``), and what the ``torch-bf16-autocast-adamw`` regime's measurements used.
    On CPU, ``foreach=False``: the engine's ranks and the reference then update each
    parameter with the same arithmetic.
    """
    params = list(params)
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    if tensors and all(p.is_cuda for p in tensors):
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, eps=1e-8, weight_decay=weight_decay,
                                 fused=True)
    return torch.optim.AdamW(params, lr=lr, betas=BETAS, eps=1e-8, weight_decay=weight_decay,
                             foreach=False)


def decays(name: str, p: torch.Tensor) -> bool:
    """The weight-decay rule: weight matrices decay; biases, norm weights (1-D) and embedding
    tables do not."""
    return p.ndim >= 2 and name not in EMBEDDING_PARAMS


def decay_groups(model: StageModel, weight_decay: float, keep=None) -> list[dict]:
    """The model's parameters (those ``keep(p)`` accepts, default all) as two AdamW groups: with
    ``weight_decay`` and without (``decays``); no group when it would be empty."""
    with_decay, without = [], []
    for _, name, p in model.named_layer_params():
        if keep is None or keep(p):
            (with_decay if decays(name, p) else without).append(p)
    groups = [{"params": with_decay, "weight_decay": weight_decay, "decay": True},
              {"params": without, "weight_decay": 0.0, "decay": False}]
    return [g for g in groups if g["params"]]


def apply_recipe(optimizer: torch.optim.Optimizer, recipe: Recipe, step: int) -> None:
    """Set the learning rate of optimizer step ``step`` (0-based) and the recipe's weight decay."""
    lr = recipe.lr_at(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
        group["weight_decay"] = recipe.weight_decay if group.get("decay", True) else 0.0
