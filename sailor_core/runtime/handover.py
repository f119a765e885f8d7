"""State handed over in memory: a new plan's ranks take their layers' weights and AdamW states
from the ranks that hold them, over the job's network, instead of reading the checkpoint.

When a plan changes, the workers that park (``runtime/park.py``) keep their shard of the state
at the checkpoint's step (``stage_checkpoint.KeptState``).  At the next generation's resume every
rank says what it holds and what it needs (one ``all_gather_object``), every rank computes the
same schedule from that (a holder in the receiver's zone preferred: no egress), the holders send
their TP shards point-to-point over a gloo group of the whole world (the default group on CPU)
through the engine's links (``runtime/links.py``), whose meter counts what crosses zones (the
worker reports it with its first step's bytes, ``runtime/egress_meter.py``), and each receiver puts the full per-layer tensors
together and takes its shard of them exactly as from the checkpoint's files
(``stage_checkpoint.load_states``): the result is bit for bit a reload.  A full tensor is put
together from the shards of one TP set (every TP rank of a replica of the old plan; a replicated
parameter from its TP rank 0, as the checkpoint's writer took it); a tied head's copy comes from
layer 0's holders, as a load takes it from layer 0's file.

A rank with its own shard at the checkpoint's step adopts it (``stage_checkpoint.adopt``); a rank
some of whose tensors no complete set of holders has (a stage preempted without a replica, holders
under ZeRO, which keep no AdamW state, or a state at another step) reads the checkpoint, which
stays the fallback and the durable record.  The step, next sample, recipe and held-out split are
the checkpoint's meta, which every rank reads anyway to agree on the step (a few hundred bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_core.plan.layout import rank_layout
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime import links
from sailor_core.runtime.model import TIED
from sailor_core.runtime.stage_checkpoint import KeptState, adopt, can_adopt, load, load_states
from sailor_core.runtime.tp import shard_range
from sailor_core.runtime.trainer import StageTrainer

FIELDS = ("params", "exp_avg", "exp_avg_sq")  # a layer file's parts, in the order they travel

# State sources, as the worker's "started" line names them.
FROM_MEMORY, FROM_PEERS, FROM_CHECKPOINT = "memory", "peers", "checkpoint"


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One TP shard of one parameter a rank holds (with its AdamW state when ``fields`` say so)."""

    layer: int
    name: str
    tp_degree: int
    tp_rank: int
    shape: tuple[int, ...]
    dtype: str
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Need:
    """A full tensor a rank loads its shard of: a layer file's parameter (``layer`` 0 for a tied copy)."""

    layer: int
    name: str
    full_shape: tuple[int, ...]
    shard_dim: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """One tensor sent from ``src`` to ``dst``: a TP shard's field of a parameter."""

    src: int
    dst: int
    offer: Offer
    field: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """Who sends what to whom; identical on every rank.  ``sources[rank]``: for each of a served
    rank's needs, the (TP rank, holder) pairs and TP degree its full tensor is put together from."""

    sources: dict[int, tuple[tuple[Need, int, tuple[tuple[int, int, Offer], ...]], ...]]
    transfers: tuple[Transfer, ...]


def offers(kept: KeptState | None, info: ckpt.CheckpointInfo, spec) -> list[Offer]:
    """What ``kept`` can give at the checkpoint ``info``: nothing at another step or model, or under
    ZeRO; never a tied head's copy (a load takes layer 0's)."""
    if kept is None or kept.sharded or kept.step != info.step or kept.model != spec.name:
        return []
    _, _, tp_degree, tp_rank = kept.shard
    head = spec.num_layer_indices - 1
    out = []
    for layer, name, values, state in kept.tensors:
        if spec.tie_embeddings and layer == head and name == TIED:
            continue
        fields = FIELDS if all(k in state for k in FIELDS[1:]) else FIELDS[:1]
        out.append(Offer(layer=layer, name=name, tp_degree=tp_degree, tp_rank=tp_rank,
                         shape=tuple(values.shape), dtype=str(values.dtype).removeprefix("torch."), fields=fields))
    return out


def needs(trainer: StageTrainer) -> list[Need]:
    """The full tensors ``trainer``'s rank loads, in the model's order (``stage_checkpoint.load``'s)."""
    out: dict[tuple[int, str], Need] = {}
    for layer in trainer.model.layers:
        for name, _ in layer.named_parameters(recurse=False):
            source = 0 if name in layer.tied else layer.layer_index
            out.setdefault((source, name), Need(layer=source, name=name, full_shape=layer.full_shapes[name],
                                                shard_dim=layer.shard_dims[name]))
    return list(out.values())


def plan_schedule(all_offers: list[list[Offer]], all_needs: list[list[Need]],
                  zones: Sequence[str] | None = None) -> Schedule:
    """The same schedule on every rank: each rank with needs is served when every one of them has a
    complete TP set of holders (itself preferred, then a holder in its zone, ``zones[r]`` rank r's:
    no egress, and the nearer link; then the least loaded holder, then the lowest rank); otherwise
    it reads the checkpoint.  Pure: no torch.distributed."""
    held: dict[tuple[int, str], dict[int, dict[int, list[tuple[int, Offer]]]]] = {}
    for rank, items in enumerate(all_offers):
        for o in items:
            by_degree = held.setdefault((o.layer, o.name), {})
            by_degree.setdefault(o.tp_degree, {}).setdefault(o.tp_rank, []).append((rank, o))
    load_bytes = [0] * len(all_offers)
    sources, transfers = {}, []
    for rank, wanted in enumerate(all_needs):
        picks = [_pick(held.get((n.layer, n.name), {}), n, rank, load_bytes, zones) for n in wanted]
        if not wanted or any(p is None for p in picks):
            continue
        for need, (degree, parts) in zip(wanted, picks):
            for _, src, offer in parts:
                if src != rank:
                    load_bytes[src] += _numel(offer.shape) * len(offer.fields)
                    transfers.extend(Transfer(src=src, dst=rank, offer=offer, field=f) for f in offer.fields)
        sources[rank] = tuple((need, degree, parts) for need, (degree, parts) in zip(wanted, picks))
    return Schedule(sources=sources, transfers=tuple(transfers))


def _pick(by_degree: dict, need: Need, rank: int, load_bytes: list[int], zones: Sequence[str] | None):
    """(TP degree, ((TP rank, holder, offer), ...)) of a complete set for ``need``, or None."""
    complete = []
    for degree in sorted(by_degree):
        wanted = [0] if need.shard_dim is None else list(range(degree))
        if not all(t in by_degree[degree] for t in wanted):
            continue
        parts = tuple((t, *_holder(by_degree[degree][t], rank, load_bytes, zones)) for t in wanted)
        if len({o.fields for _, _, o in parts}) != 1 or not _fits(need, degree, parts):
            continue
        complete.append((sum(src != rank for _, src, _ in parts), degree, parts))
    if not complete:
        return None
    _, degree, parts = min(complete, key=lambda c: (c[0], c[1]))  # fewest sends, then fewest parts
    return degree, parts


def _holder(candidates: list[tuple[int, Offer]], rank: int, load_bytes: list[int],
            zones: Sequence[str] | None) -> tuple[int, Offer]:
    for src, offer in candidates:
        if src == rank:
            return src, offer
    away = (lambda src: zones[src] != zones[rank]) if zones is not None else (lambda src: False)
    return min(candidates, key=lambda c: (away(c[0]), load_bytes[c[0]], c[0]))


def _fits(need: Need, degree: int, parts) -> bool:
    """Whether the parts are the shards of ``need``'s full tensor (the same model, split the same way)."""
    for t, _, offer in parts:
        want = list(need.full_shape)
        if need.shard_dim is not None:
            start, end = shard_range(need.full_shape[need.shard_dim], degree, t)
            want[need.shard_dim] = end - start
        if tuple(want) != offer.shape:
            return False
    return True


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def resume(trainer: StageTrainer, kept: KeptState | None, info: ckpt.CheckpointInfo, storage) -> str:
    """Resume ``trainer`` at the checkpoint ``info`` (a collective of every rank): from its own kept
    state, from its peers' or from the checkpoint's files; which one it was (``FROM_*``)."""
    own = kept is not None and can_adopt(trainer, kept, info)
    mine = offers(kept, info, trainer.spec)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mine, [] if own else needs(trainer)))
    schedule = plan_schedule([g[0] for g in gathered], [g[1] for g in gathered],
                             [r.zone for r in rank_layout(trainer.plan)])
    rank = dist.get_rank()
    received = _exchange(schedule.transfers, rank, kept) if schedule.transfers else {}
    if own:
        adopt(trainer, kept, info)
        return FROM_MEMORY
    if rank not in schedule.sources:
        load(trainer, storage, info)
        return FROM_CHECKPOINT
    held = _own_tensors(kept) if mine else {}
    load_states(trainer, _full_states(schedule.sources[rank], rank, held, received), info)
    return FROM_PEERS if any(t.dst == rank for t in schedule.transfers) else FROM_MEMORY


def _own_tensors(kept: KeptState) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """(layer, name) -> {field: tensor} of a kept state, as the layer files name them."""
    return {(layer, name): {"params": values, **{k: state[k] for k in FIELDS[1:] if k in state}}
            for layer, name, values, state in kept.tensors}


def _exchange(transfers: tuple[Transfer, ...], rank: int, kept: KeptState | None) -> dict:
    """Post this rank's sends and receives of the schedule, wait for them; what it received, by
    (layer, name, TP rank, field).  Gloo everywhere: a GPU plan's default group is NCCL.  The
    engine's transfers (``runtime/links.py``) meter what crosses zones, as the training's do."""
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    own = _own_tensors(kept) if kept is not None else {}
    works, keep_alive, received = [], [], {}
    for tag, t in enumerate(transfers):
        o = t.offer
        if t.dst == rank:
            buf = torch.empty(o.shape, dtype=getattr(torch, o.dtype))
            received[(o.layer, o.name, o.tp_rank, t.field)] = buf
            works.append(links.irecv(buf, t.src, tag, group))
        elif t.src == rank:
            data = own[(o.layer, o.name)][t.field].detach().cpu().contiguous()
            keep_alive.append(data)
            works.append(links.isend(data, t.dst, tag, group))
    for w in works:
        w.wait()
    return received


def _full_states(sources, rank: int, held: dict, received: dict) -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """The full per-layer tensors a served rank loads, as layer files hold them."""
    states: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for need, degree, parts in sources:
        fields = parts[0][2].fields
        layer = states.setdefault(need.layer, {f: {} for f in FIELDS})
        for f in fields:
            pieces = [(t, held[(need.layer, need.name)][f] if src == rank else received[(need.layer, need.name, t, f)])
                      for t, src, _ in parts]
            layer[f][need.name] = _put_together(need, degree, pieces)
    return states


def _put_together(need: Need, degree: int, pieces: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """The full tensor from its TP shards (``ShardedLayer.gather``'s result, without a collective)."""
    if need.shard_dim is None or degree == 1:
        return pieces[0][1].detach().cpu().clone()
    full = torch.empty(need.full_shape, dtype=pieces[0][1].dtype)
    for t, piece in pieces:
        start, end = shard_range(need.full_shape[need.shard_dim], degree, t)
        full.narrow(need.shard_dim, start, end - start).copy_(piece)
    return full
