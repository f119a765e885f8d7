"""ZeRO over one stage's data-parallel group: AdamW's states (stage 1) and the gradients (stage 2)
sharded over the group's ranks.

The stage's DP-synced parameters are laid out in buckets (the overlapped all-reduce's,
``runtime/allreduce.py``, or one bucket of full tensors when the replicas' TP degrees differ);
each bucket's flat of ``n`` elements, padded to ``D * ceil(n / D)``, is split into ``D`` equal
ranges and DP rank ``i`` owns range ``i`` of every bucket.  It holds AdamW's states only for
its ranges' elements (its *pieces*: one per parameter a range cuts), updates those elements,
and then every rank all-gathers every bucket's ranges back into the parameters.

* ZeRO-1: the gradients are all-reduced as without ZeRO (overlapped with the last backward);
  each rank then reads its ranges of them.  Every element sees the same arithmetic as without
  ZeRO (AdamW is elementwise; the gradient norm is the same sum), so the training is the same
  bit for bit.
* ZeRO-2: each bucket is reduce-scattered instead (also overlapped); a rank keeps only its
  ranges of the summed gradient and drops the full gradients before the optimizer step; the
  global gradient norm sums the squared norms of every rank's pieces.

A piece is a view of its parameter (the update writes the parameter in place) when the group's
ranks hold tensors of one shape; with mixed TP degrees pieces are copies of the full tensors'
elements, refreshed from the parameters before each update (the checkpoint may have set them).
Collectives: ``reduce_scatter_single`` and ``all_gather_single`` (torch 2.13's names for
``reduce_scatter_tensor`` and ``all_gather_into_tensor``) on both backends: torch 2.13's gloo
has both, so the CPU path is NCCL's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_core.runtime import links
from sailor_core.runtime.optimizer import decays, make_optimizer


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One parameter of the sharded space: its layer and name, and where it lies."""

    layer: object        # the ShardedLayer
    name: str
    param: torch.Tensor  # the rank's (TP-shard) parameter
    bucket: int
    offset: int          # first element in its bucket's flat
    numel: int           # in the space: the parameter's, or its full tensor's (mixed TP)


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """This rank's elements [lo, hi) of one entry (offsets inside the entry)."""

    entry: Entry
    lo: int
    hi: int
    values: torch.Tensor  # what AdamW updates (a view of the parameter, or a copy)


def chunk_of(numel: int, group_size: int) -> int:
    """Elements per rank of a bucket of ``numel`` (the bucket padded to ``group_size`` of them)."""
    return -(-numel // group_size)


class ShardedAdamW:
    """AdamW over this rank's ranges of the stage's buckets (see the module docstring)."""

    def __init__(self, buckets: list[list[tuple[object, str, torch.Tensor]]], *, group, zero_stage: int,
                 full_space: bool, lr: float, weight_decay: float) -> None:
        assert zero_stage in (1, 2)
        self.group, self.zero_stage, self.full_space = group, zero_stage, full_space
        self.group_size, self.index = dist.get_world_size(group), dist.get_rank(group)
        self.entries: list[Entry] = []
        self.bucket_numels: list[int] = []
        for b, members in enumerate(buckets):
            offset = 0
            for layer, name, p in members:
                n = _numel(layer, name) if full_space else p.numel()
                self.entries.append(Entry(layer=layer, name=name, param=p, bucket=b, offset=offset, numel=n))
                offset += n
            self.bucket_numels.append(offset)
        self._held = {id(e.param) for e in self.entries}
        self.pieces = self._cut()
        groups = [{"params": [pc.values for pc in self.pieces if d == decays(pc.entry.name, pc.entry.param)],
                   "weight_decay": weight_decay if d else 0.0, "decay": d} for d in (True, False)]
        groups = [g for g in groups if g["params"]]
        self.inner = make_optimizer(groups, lr) if groups else None
        self.param_groups = self.inner.param_groups if self.inner is not None else []
        self.shard_grads: list[torch.Tensor] | None = None  # ZeRO-2: this rank's range of each bucket

    def my_range(self, b: int) -> tuple[int, int]:
        c = chunk_of(self.bucket_numels[b], self.group_size)
        return min(self.index * c, self.bucket_numels[b]), min((self.index + 1) * c, self.bucket_numels[b])

    def _cut(self) -> list[Piece]:
        pieces = []
        for e in self.entries:
            lo, hi = self.my_range(e.bucket)
            a, z = max(lo, e.offset) - e.offset, min(hi, e.offset + e.numel) - e.offset
            if a >= z:
                continue
            if self.full_space:
                values = torch.zeros(z - a, dtype=e.param.dtype, device=e.param.device)
            else:
                values = e.param.detach().view(-1)[a:z]
            pieces.append(Piece(entry=e, lo=a, hi=z, values=values))
        return pieces

    # ---- gradients --------------------------------------------------------------
    def take_grads(self, fulls: dict[int, torch.Tensor] | None = None) -> None:
        """Point each piece's gradient at its elements of the summed gradient: ZeRO-2's shards
        (``shard_grads``), else the parameters' all-reduced gradients, or (mixed TP) ``fulls``
        (id of parameter -> its summed full gradient)."""
        for pc in self.pieces:
            e = pc.entry
            if self.shard_grads is not None:
                lo = self.my_range(e.bucket)[0]
                pc.values.grad = self.shard_grads[e.bucket][e.offset + pc.lo - lo: e.offset + pc.hi - lo]
            elif fulls is not None:
                pc.values.grad = fulls[id(e.param)].reshape(-1)[pc.lo:pc.hi].clone()
            else:
                pc.values.grad = e.param.grad.view(-1)[pc.lo:pc.hi]

    def reduce_scatter_fulls(self, fulls: list[torch.Tensor]) -> None:
        """ZeRO-2 with mixed TP: sum the full gradients (one bucket) and keep this rank's range."""
        flat = _padded(torch.cat([f.reshape(-1) for f in fulls]), self.group_size)
        out = flat.new_empty(flat.numel() // self.group_size)
        links.meter_ring(flat.numel() * flat.element_size(), self.group, passes=1)
        dist.reduce_scatter_single(out, flat, group=self.group)
        self.shard_grads = [out]

    def grad_sq_share(self, counts) -> torch.Tensor | None:
        """ZeRO-2: the squared norm of this rank's pieces of the gradient that ``counts(layer,
        name)`` says are part of the global norm (every element once over the group)."""
        grads = [pc.values.grad for pc in self.pieces
                 if self.full_space or counts(pc.entry.layer, pc.entry.name)]
        return torch.nn.utils.get_total_norm(grads, foreach=False) ** 2 if grads else None

    # ---- the update -------------------------------------------------------------
    def step(self) -> None:
        """AdamW on this rank's pieces, then every bucket all-gathered into the parameters."""
        if self.full_space:
            self._refresh_copies()
        if self.inner is not None:
            self.inner.step()
        for b in range(len(self.bucket_numels)):
            self._all_gather(b)

    def zero_grad(self) -> None:
        for pc in self.pieces:
            pc.values.grad = None
        for e in self.entries:
            e.param.grad = None
        self.shard_grads = None

    def _refresh_copies(self) -> None:
        # every entry, on every rank: the TP ranks of a replica hold different pieces, but their
        # gathers must match
        fulls = {id(e.param): e.layer.gather(e.name, e.param.detach()).reshape(-1) for e in self.entries}
        for pc in self.pieces:
            pc.values.copy_(fulls[id(pc.entry.param)][pc.lo:pc.hi])

    def _all_gather(self, b: int) -> None:
        members = [e for e in self.entries if e.bucket == b]
        c = chunk_of(self.bucket_numels[b], self.group_size)
        mine = members[0].param.new_zeros(c)
        lo, _ = self.my_range(b)
        for pc in self.pieces:
            if pc.entry.bucket == b:
                start = pc.entry.offset + pc.lo - lo
                mine[start: start + pc.hi - pc.lo] = pc.values
        flat = mine.new_empty(c * self.group_size)
        links.meter_ring(flat.numel() * flat.element_size(), self.group, passes=1)
        dist.all_gather_single(flat, mine, group=self.group)
        with torch.no_grad():
            for e in members:
                values = flat[e.offset: e.offset + e.numel]
                if self.full_space:
                    e.param.copy_(e.layer.shard(e.name, values.view(e.layer.full_shapes[e.name])))
                else:
                    e.param.view(-1).copy_(values)

    # ---- checkpoints --------------------------------------------------------------
    def gathered_states(self, has_state: bool) -> dict[int, dict[str, torch.Tensor]]:
        """Every rank's AdamW states put together (a collective of the group): id of parameter ->
        {"exp_avg", "exp_avg_sq"} shaped as the parameter (the rank's TP shard), as an unsharded
        optimizer holds them; {} before the first step (``has_state`` False on every rank)."""
        if not has_state:
            return {}
        out: dict[int, dict[str, torch.Tensor]] = {}
        for key in ("exp_avg", "exp_avg_sq"):
            for b in range(len(self.bucket_numels)):
                flat = self._gather_state(b, key)
                for e in self.entries:
                    if e.bucket != b:
                        continue
                    values = flat[e.offset: e.offset + e.numel]
                    if self.full_space:
                        values = e.layer.shard(e.name, values.view(e.layer.full_shapes[e.name]))
                    out.setdefault(id(e.param), {})[key] = values.reshape(e.param.shape).clone()
        return out

    def _gather_state(self, b: int, key: str) -> torch.Tensor:
        c = chunk_of(self.bucket_numels[b], self.group_size)
        lo, _ = self.my_range(b)
        mine = torch.zeros(c, device=self.entries[0].param.device)
        for pc in self.pieces:
            if pc.entry.bucket == b:
                start = pc.entry.offset + pc.lo - lo
                mine[start: start + pc.hi - pc.lo] = self.inner.state[pc.values][key]
        flat = mine.new_empty(c * self.group_size)
        links.meter_ring(flat.numel() * flat.element_size(), self.group, passes=1)
        dist.all_gather_single(flat, mine, group=self.group)
        return flat

    def holds(self, p: torch.Tensor) -> bool:
        return id(p) in self._held

    def load_state(self, p: torch.Tensor, full: dict[str, torch.Tensor], step: torch.Tensor) -> None:
        """Set the AdamW states of this rank's pieces of ``p`` from the full tensors ``full``
        ({"exp_avg", "exp_avg_sq"}, as a checkpoint stores them)."""
        for pc in self.pieces:
            e = pc.entry
            if e.param is not p:
                continue
            state = {"step": step.to(p.device) if self.inner.defaults.get("fused") else step.clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                values = full[key] if self.full_space else e.layer.shard(e.name, full[key])
                state[key] = values.reshape(-1)[pc.lo:pc.hi].clone().to(p.device)
            self.inner.state[pc.values] = state

    def state_bytes(self) -> int:
        """Bytes of the AdamW states this rank holds (the memory benchmark's figure)."""
        if self.inner is None:
            return 0
        return sum(t.numel() * t.element_size() for st in self.inner.state.values()
                   for t in st.values() if torch.is_tensor(t) and t.ndim > 0)


def _numel(layer, name: str) -> int:
    n = 1
    for d in layer.full_shapes[name]:
        n *= d
    return n


def _padded(flat: torch.Tensor, group_size: int) -> torch.Tensor:
    pad = chunk_of(flat.numel(), group_size) * group_size - flat.numel()
    return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat
