"""Single-process training on the same samples: the yardstick the engine must match.

Same initial values (a pure function of seed and layer index), same samples
(global sample index), same loss normalisation (mean over the global batch),
same AdamW; micro-batches run one after the other in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan
from sailor_core.runtime.data import TokenDataset
from sailor_core.runtime.trainer import make_optimizer
from sailor_core.runtime.model import StageModel


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceResult:
    losses: list[float]
    params: dict[int, dict[str, torch.Tensor]]  # layer index -> name -> full tensor


def train_reference(plan: Plan, steps: int, data_path: str, *, lr: float = 1e-3, seed: int = 0,
                    first_sample: int = 0) -> ReferenceResult:
    spec = get_model(plan.model)
    seq = plan.effective_seq_len()
    data = TokenDataset(data_path, seq, spec.vocab_size)
    model = StageModel(spec, 0, spec.num_layer_indices, seed=seed)
    opt = make_optimizer(model.parameters(), lr)
    m_count = plan.num_microbatches
    losses = []
    for it in range(steps):
        total = 0.0
        for m in range(m_count):
            x, y = data.microbatch(first_sample, it, m, plan.global_batch_size, plan.micro_batch_size)
            loss = model(x, y)
            total += float(loss.detach())
            (loss / m_count).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / m_count)
    params = {layer.layer_index: {n: p.detach().clone() for n, p in layer.named_parameters(recurse=False)}
              for layer in model.layers}
    return ReferenceResult(losses=losses, params=params)
