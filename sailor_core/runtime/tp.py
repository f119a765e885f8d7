"""Megatron-style tensor-parallel operators.

``copy_to_tp`` (Megatron's *f*) sits before a column-parallel layer: identity
forward, all-reduce of the input gradient backward.  ``reduce_from_tp`` (*g*)
follows a row-parallel layer: all-reduce of the partial outputs forward,
identity backward.  With no group (TP degree 1) both are the identity.

The vocabulary is split in contiguous row ranges (``shard_range``: sizes differ by at
most one, the first ranks take the extra rows, as ``torch.tensor_split``), so a
vocabulary that no TP degree divides (GPT-Neo's 50,257) needs no padding.
``vocab_parallel_embedding`` looks up the rows a rank holds and all-reduces;
``vocab_parallel_cross_entropy`` is Megatron's: the loss from each rank's slice of the
logits with three all-reduces of one number per token (max, target logit, sum of
exponentials), never the full logits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _ReduceFromTP.apply(x, group)


def shard_range(size: int, num_shards: int, index: int) -> tuple[int, int]:
    """[start, end) of shard ``index`` when ``size`` rows are split in ``num_shards`` (as tensor_split)."""
    base, extra = divmod(size, num_shards)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def gather_shards(shard: torch.Tensor, dim: int, full_size: int, num_shards: int, group) -> torch.Tensor:
    """The full tensor from every TP rank's ``shard_range`` slice along ``dim`` (no autograd)."""
    if group is None or num_shards == 1:
        return shard
    most = shard_range(full_size, num_shards, 0)[1]
    shard = shard.detach()
    if shard.shape[dim] < most:  # all_gather wants equal sizes: pad the short shards
        pad = list(shard.shape)
        pad[dim] = most - shard.shape[dim]
        shard = torch.cat([shard, shard.new_zeros(pad)], dim=dim)
    parts = [torch.empty_like(shard) for _ in range(num_shards)]
    dist.all_gather(parts, shard.contiguous(), group=group)
    sizes = [b - a for a, b in (shard_range(full_size, num_shards, r) for r in range(num_shards))]
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim=dim)


def vocab_parallel_embedding(tokens: torch.Tensor, weight: torch.Tensor, vocab_start: int, group,
                             padding_idx: int | None = None) -> torch.Tensor:
    """Rows of a vocabulary-sharded embedding: each rank fills the tokens it holds, zeros elsewhere,
    and the all-reduce assembles them (backward: each rank's rows get their tokens' gradients, but
    the ``padding_idx`` row none, as ``nn.Embedding``'s)."""
    rows = weight.shape[0]
    local_pad = padding_idx - vocab_start if padding_idx is not None and 0 <= padding_idx - vocab_start < rows else None
    if group is None:
        return F.embedding(tokens, weight, padding_idx=local_pad)
    local = tokens - vocab_start
    inside = (local >= 0) & (local < rows)
    x = F.embedding(torch.where(inside, local, 0), weight, padding_idx=local_pad)
    return reduce_from_tp(x * inside.unsqueeze(-1).to(weight.dtype), group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits split over the vocabulary (Megatron's)."""

    @staticmethod
    def forward(ctx, logits, labels, vocab_start, group):
        # logits: [tokens, local vocab] fp32; labels: [tokens] global ids
        logits_max = logits.detach().max(dim=-1).values
        if group is not None:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - logits_max.unsqueeze(-1)
        local = labels - vocab_start
        inside = (local >= 0) & (local < logits.shape[-1])
        local = torch.where(inside, local, 0)
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside.to(shifted.dtype)
        probs = shifted.exp_()
        sum_exp = probs.sum(dim=-1)
        if group is not None:
            dist.all_reduce(target, group=group)
            dist.all_reduce(sum_exp, group=group)
        loss = sum_exp.log() - target
        probs.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(probs, local, inside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        probs, local, inside = ctx.saved_tensors
        grad = probs  # softmax - one-hot, in place: backward runs once
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local] -= inside.to(grad.dtype)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int,
                                 group) -> torch.Tensor:
    """Mean token cross-entropy of ``logits`` [..., local vocab] (this rank's vocabulary slice,
    starting at ``vocab_start``) against global ``labels``; the same value on every TP rank."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    return _VocabParallelCrossEntropy.apply(flat, labels.reshape(-1), vocab_start, group).mean()
