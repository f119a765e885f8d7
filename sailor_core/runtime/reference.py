"""Single-process training on the same samples: the yardstick the engine must match.

Same initial values (a pure function of seed and layer index, or the same pretrained
weights), same samples (global sample index, the same held-out split), same loss
normalisation (mean over the global batch), same recipe (AdamW with the same decay
groups, learning-rate schedule and global-norm clipping); micro-batches run one after
the other in one process, and the validation loss is the mean over the same held-out
batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan
from sailor_core.runtime.data import TokenDataset
from sailor_core.runtime.hf import load_pretrained
from sailor_core.runtime.model import StageModel
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.optimizer import apply_recipe, decay_groups, make_optimizer


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceResult:
    losses: list[float]
    params: dict[int, dict[str, torch.Tensor]]  # layer index -> name -> full tensor
    val_losses: dict[int, float]  # step -> validation loss after it
    grad_norms: list[float]  # the global gradient norm of each step, before clipping


def train_reference(plan: Plan, steps: int, data_path: str, *, recipe: Recipe | None = None, seed: int = 0,
                    first_sample: int = 0) -> ReferenceResult:
    """Train ``steps`` steps from scratch, or from the Hugging Face weights at the recipe's
    ``init_from``, validating as it says.  ``recipe``: the job's (default: the defaults over
    ``steps``); its ``total_steps`` may exceed ``steps`` (the first part of a longer job)."""
    spec = get_model(plan.model)
    recipe = recipe or Recipe(total_steps=steps)
    data = TokenDataset(data_path, plan.effective_seq_len(), spec.vocab_size,
                        validation_fraction=recipe.validation_fraction, min_val_samples=plan.global_batch_size)
    model = StageModel(spec, 0, spec.num_layer_indices, seed=seed)
    if recipe.init_from:
        load_pretrained(model, recipe.init_from)
    opt = make_optimizer(decay_groups(model, recipe.weight_decay), recipe.learning_rate)
    m_count = plan.num_microbatches
    losses, norms, val_losses = [], [], {}
    for it in range(steps):
        total = 0.0
        for m in range(m_count):
            x, y = data.microbatch(first_sample, it, m, plan.global_batch_size, plan.micro_batch_size)
            loss = model(x, y)
            total += float(loss.detach())
            (loss / m_count).backward()
        norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()], foreach=False)))
        if recipe.grad_clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip_norm, foreach=False)
        apply_recipe(opt, recipe, it)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / m_count)
        every = recipe.validate_every_steps
        if every and ((it + 1) % every == 0 or it + 1 == steps):
            val_losses[it + 1] = _validate(model, data, plan, recipe.validation_batches)
    params = {layer.layer_index: {n: p.detach().clone() for n, p in layer.named_parameters(recurse=False)}
              for layer in model.layers}
    return ReferenceResult(losses=losses, params=params, val_losses=val_losses, grad_norms=norms)


def _validate(model: StageModel, data: TokenDataset, plan: Plan, max_batches: int) -> float:
    num_batches = data.num_val_batches(max_batches, plan.global_batch_size)
    total = 0.0
    with torch.no_grad():
        for v in range(num_batches):
            for m in range(plan.num_microbatches):
                x, y = data.val_microbatch(v, m, plan.global_batch_size, plan.micro_batch_size)
                total += float(model(x, y))
    return total / (num_batches * plan.num_microbatches)
