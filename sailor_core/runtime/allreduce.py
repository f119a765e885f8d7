"""Summing gradients over a data-parallel group: overlapped with the last backward in buckets
(as DDP does), or as one flat collective.  Under ZeRO-2 (``runtime/zero.py``) the buckets are
reduce-scattered instead: each rank keeps its range of every bucket's sum."""

from __future__ import annotations

import torch
import torch.distributed as dist

from sailor_core.runtime import links
from sailor_core.runtime.zero import chunk_of


class OverlappedAllReduce:
    """Sum gradients over a DP group in buckets launched during the last backward (as DDP does).

    Buckets hold parameters in reverse registration order (about the order backward
    finishes them) and are launched strictly in bucket order on every rank, so the
    collectives match across ranks whatever order the hooks fire in.
    """

    BUCKET_BYTES = 8 << 20

    def __init__(self, params: list[torch.Tensor], group, *, reduce_scatter: bool = False) -> None:
        self.group = group
        self.reduce_scatter = reduce_scatter
        self.group_size = dist.get_world_size(group)
        self.shards: list[torch.Tensor | None] = []  # reduce-scatter: this rank's range of each bucket
        self.buckets = buckets_of(params, self.BUCKET_BYTES)
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        # One flat buffer per bucket for the whole run (as DDP keeps its buckets): a fresh
        # multi-MB buffer per step costs page faults and zeroing on every iteration.
        # Reduce-scattering, a bucket's flat lives only while its collective runs (ZeRO-2 keeps
        # no full gradient after the step's sync).
        self.flats = ([] if reduce_scatter else
                      [torch.empty(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
                       for ps in self.buckets])
        self.armed = False
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)
        self._reset()

    def _reset(self) -> None:
        self.ready = [0] * len(self.buckets)
        self.next_bucket = 0
        self.pending: list[tuple[object, torch.Tensor, int]] = []

    def arm(self) -> None:
        self._reset()
        self.armed = True

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.armed:
            return
        self.ready[self.bucket_of[id(p)]] += 1
        while (self.next_bucket < len(self.buckets)
               and self.ready[self.next_bucket] == len(self.buckets[self.next_bucket])):
            self._launch(self.next_bucket)

    def _launch(self, b: int) -> None:
        if self.reduce_scatter:
            ps = self.buckets[b]
            n = sum(p.numel() for p in ps)
            c = chunk_of(n, self.group_size)
            flat = torch.cat([*(p.grad.reshape(-1) for p in ps), ps[0].new_zeros(c * self.group_size - n)])
            out = flat.new_empty(c)
            links.meter_ring(flat.numel() * flat.element_size(), self.group, passes=1)
            self.pending.append((dist.reduce_scatter_single(out, flat, group=self.group, async_op=True), out, b))
        else:
            flat = self.flats[b]
            torch.cat([p.grad.reshape(-1) for p in self.buckets[b]], out=flat)
            self.pending.append((links.all_reduce(flat, self.group, async_op=True), flat, b))
        self.next_bucket = b + 1

    def finish(self) -> None:
        """Launch what is left (in order), wait, write the sums back into the gradients."""
        self.armed = False
        while self.next_bucket < len(self.buckets):
            self._launch(self.next_bucket)
        self.shards = [None] * len(self.buckets)
        for work, flat, b in self.pending:
            work.wait()
            if self.reduce_scatter:
                self.shards[b] = flat
                for p in self.buckets[b]:
                    p.grad = None  # only the range of the sum is kept
                continue
            offset = 0
            for p in self.buckets[b]:
                n = p.numel()
                p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
                offset += n
        self.pending = []


def buckets_of(params: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """The parameters in buckets of about ``bucket_bytes``, in reverse registration order (about
    the order backward finishes them): the DP sync's and ZeRO's layout."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in reversed(params):
        if size and size + p.numel() * p.element_size() > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
    return buckets


def allreduce_flat(tensors: list[torch.Tensor], group) -> None:
    """Sum tensors over the group with one collective (a flat bucket)."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    links.all_reduce(flat, group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset: offset + n].view_as(t))
        offset += n
