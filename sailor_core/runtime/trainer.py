"""One rank of a plan: its stage model shard, 1F1B with p2p, per-stage DP sync, AdamW.

Its parts: the optimizer and how the recipe drives it (``runtime/optimizer.py``), the process
groups (``runtime/process_groups.py``), point to point between stages and the step's inbox
(``runtime/p2p.py``), the overlapped DP all-reduce (``runtime/allreduce.py``), and its state to
and from checkpoints (``runtime/stage_checkpoint.py``), and ZeRO's sharded AdamW (``runtime/zero.py``);
here: the training step and validation.

A stage's memory levers come from its plan stage: ``recompute`` goes to the model
(``StageModel``), ``zero_stage`` shards AdamW's states (1) and the gradients (2) over the
stage's DP group (nothing to shard with one replica).  A tied matrix the embedding group sums
stays with a plain AdamW on every rank holding it.

Loss of an iteration = mean over its global batch: each micro-batch's mean
token loss is scaled by 1/M before backward and gradients are summed over
replicas, which gives the gradient single-process training would.

Tied embeddings across stages (Megatron's embedding group): the first stage's
``tok`` and the last stage's copy of it are left out of their stages' DP sync;
instead one all-reduce over every rank of both stages (one group per TP rank
when all their replicas share a TP degree, else one group of full gradients
divided by the TP degree, as for mixed-TP DP) sums every replica's gradient of
both uses, so both copies take the same AdamW step and stay equal.  The copy is
never checkpointed: a last stage loads it from layer 0's file.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from sailor_core.catalog.models import ModelSpec
from sailor_core.plan.layout import RankRole, rank_layout
from sailor_core.plan.types import Plan
from sailor_core.runtime import links
from sailor_core.runtime.allreduce import OverlappedAllReduce, allreduce_flat
from sailor_core.runtime.data import TokenDataset
from sailor_core.runtime.model import TIED, ShardedLayer, StageModel
from sailor_core.runtime.optimizer import apply_recipe, decay_groups, make_optimizer
from sailor_core.runtime.p2p import Inbox, StagePeers, retire
from sailor_core.runtime.pipeline_order import gradients_known_arrived, local_microbatches, rank_op_order
from sailor_core.runtime.process_groups import Groups
from sailor_core.runtime.recipe import Recipe
from sailor_core.runtime.zero import ShardedAdamW


class StageTrainer:
    def __init__(self, *, plan: Plan, spec: ModelSpec, rank: int, data: TokenDataset, recipe: Recipe,
                 seed: int, device: torch.device, groups: Groups) -> None:
        self.plan, self.spec, self.rank, self.data, self.recipe = plan, spec, rank, data, recipe
        self.roles = rank_layout(plan)
        self.role: RankRole = self.roles[rank]
        self.device = device
        self.groups = groups
        stage = plan.stages[self.role.stage]
        self.model = StageModel(spec, self.role.layer_start, self.role.layer_end, self.role.tp_degree,
                                self.role.tp_rank, groups.tp, seed, recompute=stage.recompute).to(device)
        self.zero_stage = stage.zero_stage if groups.dp is not None else 0
        self.seq_len = plan.effective_seq_len()
        self.num_microbatches = plan.num_microbatches
        dps = [s.dp_degree for s in plan.stages]
        self.schedule = rank_op_order(self.num_microbatches, dps, self.role.stage, self.role.replica)
        self.step = 0              # optimizer steps done
        # The last step's global gradient norm before clipping (a device tensor, read after the
        # step's status all-reduce so no extra host sync), or this rank's share of its square
        # when nothing clips (``grad_sq_share``: the worker sums the shares in that all-reduce).
        self.grad_norm_before_clip: torch.Tensor | None = None
        self.grad_sq_share: torch.Tensor | None = None
        self.first_sample = 0      # global sample index of iteration `first_step`
        self.first_step = 0
        self.init_from: str | None = None  # the pretrained weights the job started from (checkpoint meta)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                         else contextlib.nullcontext())
        self._tied = _tied_matrix(self.model) if groups.tied is not None else None
        self._overlap = (OverlappedAllReduce(self._dp_params(), groups.dp, reduce_scatter=self.zero_stage == 2)
                         if groups.dp is not None and not groups.dp_mixed_tp else None)
        self.zero = self._sharded_optimizer() if self.zero_stage else None
        # AdamW of what ZeRO does not shard (all of it without ZeRO; None when nothing is left)
        plain = decay_groups(self.model, recipe.weight_decay,
                             keep=(lambda p: not self.zero.holds(p)) if self.zero else None)
        self.optimizer = make_optimizer(plain, recipe.learning_rate) if plain else None
        self._last_backward = max(i for i, (kind, _) in enumerate(self.schedule) if kind == "B")
        self._gradients_arrived = gradients_known_arrived(self.num_microbatches, dps, self.role.stage,
                                                          self.role.replica)
        self._pace = links.ComputePace.from_env()  # benchmarks only: None in every real run
        self._num_layers = self.role.layer_end - self.role.layer_start
        self.peers = StagePeers(plan=plan, role=self.role, groups=groups, device=device,
                                act_shape=(plan.micro_batch_size, self.seq_len, spec.hidden_size))

    @property
    def next_sample(self) -> int:
        return self.first_sample + (self.step - self.first_step) * self.plan.global_batch_size

    def _microbatch(self, m: int):
        x, y = self.data.microbatch(self.first_sample, self.step - self.first_step, m,
                                    self.plan.global_batch_size, self.plan.micro_batch_size)
        return x.to(self.device), y.to(self.device)

    # ---- one iteration ------------------------------------------------------
    def train_step(self, on_first_forward=None) -> float:
        """Run one iteration (1F1B, DP sync, AdamW); returns this rank's sum of micro-batch losses
        (non-zero only on TP rank 0 of last-stage replicas)."""
        role, model = self.role, self.model
        first, last = model.is_first, model.is_last
        sends, saved = [], {}
        inbox = Inbox(self.peers, self.schedule, first=first, last=last)
        loss_sum = torch.zeros((), device=self.device)
        scale = 1.0 / self.num_microbatches
        forward_sends, backward_sends = {}, {}  # micro-batch -> its sends, until known arrived
        for op_index, (kind, m) in enumerate(self.schedule):
            if self._overlap is not None and op_index == self._last_backward:
                self._overlap.arm()  # gradients become final during this backward
            if kind == "F":
                if first:
                    inp, labels = self._microbatch(m)
                else:
                    inp = inbox.take("F", m)
                    for k in self._gradients_arrived.get(m, ()):  # sent upstream after k's backward there
                        retire(sends, backward_sends.pop(k))
                    inp.requires_grad_(True)
                    labels = self._microbatch(m)[1] if last else None
                started_s = time.time()
                with self.autocast:
                    out = model(inp, labels)
                if self._pace is not None:
                    self._pace.hold("F", self._num_layers, started_s)
                if on_first_forward is not None:
                    on_first_forward()
                    on_first_forward = None
                if last:
                    loss_sum += out.detach().float()
                    saved[m] = (inp, out * scale)
                else:
                    out = out.float()
                    saved[m] = (inp, out)
                    forward_sends[m] = self.peers.send(out.detach(), role.stage + 1, m, 2 * m, self.groups.fwd, sends)
                inbox.done("F")
            else:
                inp, out = saved.pop(m)
                grad = None if last else inbox.take("B", m)
                started_s = time.time()
                out.backward(grad)
                if self._pace is not None:
                    self._pace.hold("B", self._num_layers, started_s)
                if not last:  # m's gradient came back, so its output reached the next stage
                    retire(sends, forward_sends.pop(m))
                if not first:
                    backward_sends[m] = self.peers.send(inp.grad, role.stage - 1, m, 2 * m + 1, self.groups.bwd, sends)
                inbox.done("B")
        for work, _ in sends:
            work.wait()
        self._sync_grads()
        self.clip_grads()
        for opt in self._optimizers():
            apply_recipe(opt, self.recipe, self.step)
            opt.step()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.zero is not None:
            self.zero.zero_grad()
        self.step += 1
        return float(loss_sum) if role.tp_rank == 0 else 0.0

    def _sync_grads(self) -> None:
        g = self.groups
        params = [p for p in self.model.parameters()]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if g.dp is not None and not g.dp_mixed_tp:
            self._overlap.finish()
            if self.zero is not None:
                self.zero.shard_grads = self._overlap.shards if self.zero_stage == 2 else None
                self.zero.take_grads()
        elif g.dp is not None:
            synced = [(layer, name, p) for layer, name, p in self.model.named_layer_params() if p is not self._tied]
            fulls = [self._gather_full(layer, name, p.grad) / self.role.tp_degree for layer, name, p in synced]
            if self.zero_stage == 2:
                self.zero.reduce_scatter_fulls(fulls)
                for _, _, p in synced:
                    p.grad = None
                self.zero.take_grads()
            else:
                allreduce_flat(fulls, g.dp)
                for (layer, name, p), full in zip(synced, fulls):
                    p.grad.copy_(layer.shard(name, full))
                if self.zero is not None:
                    self.zero.take_grads({id(p): full for (_, _, p), full in zip(synced, fulls)})
        self._sync_tied_grads()

    # ---- ZeRO ---------------------------------------------------------------
    def _sharded_optimizer(self) -> ShardedAdamW:
        """ZeRO over the DP group: the overlapped all-reduce's buckets, or (mixed TP degrees) one
        bucket of the full tensors."""
        named = {id(p): (layer, name, p) for layer, name, p in self.model.named_layer_params()}
        if self._overlap is not None:
            buckets = [[named[id(p)] for p in ps] for ps in self._overlap.buckets]
        else:
            buckets = [[named[id(p)] for p in self._dp_params()]]
        return ShardedAdamW(buckets, group=self.groups.dp, zero_stage=self.zero_stage,
                            full_space=self._overlap is None, lr=self.recipe.learning_rate,
                            weight_decay=self.recipe.weight_decay)

    def _optimizers(self) -> list:
        return [opt for opt in (self.optimizer, self.zero) if opt is not None]

    def _updated_tensors(self) -> list[torch.Tensor]:
        """What the optimizers update (and so what clipping scales): ZeRO's pieces, the rest's parameters."""
        plain = [p for g in self.optimizer.param_groups for p in g["params"]] if self.optimizer is not None else []
        return plain + ([pc.values for pc in self.zero.pieces] if self.zero is not None else [])

    # ---- tied embeddings (the embedding group) ------------------------------
    def _dp_params(self) -> list[torch.Tensor]:
        """The parameters the stage's DP sync sums: all but a tied matrix, which the embedding group sums."""
        return [p for p in self.model.parameters() if p is not self._tied]

    def _sync_tied_grads(self) -> None:
        """Sum the tied matrix's gradient over every replica of the first and the last stage."""
        if self._tied is None:
            return
        grad = self._tied.grad
        if not self.groups.tied_mixed_tp:
            links.all_reduce(grad, self.groups.tied)
            return
        layer = self.model.layers[0] if self.model.is_first else self.model.layers[-1]
        full = layer.gather(TIED, grad) / self.role.tp_degree
        links.all_reduce(full, self.groups.tied)
        grad.copy_(layer.shard(TIED, full))

    def _gather_full(self, layer: ShardedLayer, name: str, shard: torch.Tensor) -> torch.Tensor:
        return layer.gather(name, shard)

    # ---- gradient clipping ----------------------------------------------------
    def _counts_in_norm(self, layer, name: str) -> bool:
        """Whether this rank's gradient of ``name`` is a part of the global norm no other rank counts.

        After the DP sync every replica of a stage holds the same gradients: replica 0 counts
        them.  Inside it, a TP-sharded parameter counts on every TP rank (the shards add up to
        the whole), a replicated one on TP rank 0 only.  A last stage's copy of a tied
        embedding (``layer.tied``) is layer 0's parameter, which layer 0's stage counts.
        """
        # getattr: ShardedLayer.tied arrives with tied embeddings (runtime/model.py)
        if self.role.replica != 0 or name in getattr(layer, "tied", ()):
            return False
        return self._counts_in_tp(layer, name)

    def _counts_in_tp(self, layer, name: str) -> bool:
        """A TP-sharded parameter counts on every TP rank, a replicated one on TP rank 0."""
        sharded = layer.shard_dims[name] is not None and self.role.tp_degree > 1
        return sharded or self.role.tp_rank == 0

    def _grad_sq_share(self) -> torch.Tensor:
        """This rank's part of the squared global gradient norm (``_counts_in_norm``; under ZeRO-2
        every DP rank counts its own pieces of the gradient)."""
        sharded = self.zero_stage == 2
        mine = [p.grad for layer, name, p in self.model.named_layer_params()
                if self._counts_in_norm(layer, name) and not (sharded and self.zero.holds(p))]
        sq = (torch.nn.utils.get_total_norm(mine, foreach=False) ** 2 if mine
              else torch.zeros((), device=self.device))
        if sharded:
            pieces = self.zero.grad_sq_share(self._counts_in_tp)
            sq = sq if pieces is None else sq + pieces
        return sq.to(device=self.device, dtype=torch.float32).reshape(())

    def grad_norm(self) -> torch.Tensor:
        """The global L2 norm of all gradients of the model (every rank gets the same value)."""
        sq = self._grad_sq_share()
        dist.all_reduce(sq)
        return sq.sqrt()

    def clip_grads(self) -> torch.Tensor | None:
        """Scale the gradients so their global norm is at most the recipe's (none: no clipping, and
        only this rank's share of the squared norm is kept, for the metrics).  Returns the norm
        before clipping as a device tensor: reading it is left to whoever needs the number."""
        self.grad_norm_before_clip = self.grad_sq_share = None
        if not self.recipe.grad_clip_norm:
            self.grad_sq_share = self._grad_sq_share()
            return None
        norm = self.grad_norm()
        torch.nn.utils.clip_grads_with_norm_(self._updated_tensors(), self.recipe.grad_clip_norm, norm,
                                             foreach=False)
        self.grad_norm_before_clip = norm
        return norm

    # ---- validation ---------------------------------------------------------
    def validate(self, num_batches: int) -> float:
        """Mean loss over ``num_batches`` held-out global batches, forward only (every rank calls it at
        the same step and gets the value).  Each rank runs its own micro-batches in order; sends do
        not block, so no stage waits on a later one."""
        role, model = self.role, self.model
        local = local_microbatches(self.num_microbatches, self.plan.stages[role.stage].dp_degree, role.replica)
        gbs, mbs = self.plan.global_batch_size, self.plan.micro_batch_size
        loss_sum = torch.zeros((), device=self.device)
        sends = []
        with torch.no_grad():
            for v in range(num_batches):
                for m in local:
                    tag = 2 * (v * self.num_microbatches + m)
                    x, y = (self.data.val_microbatch(v, m, gbs, mbs) if model.is_first or model.is_last
                            else (None, None))
                    if model.is_first:
                        inp = x.to(self.device)
                    else:
                        inp = self.peers.received(*self.peers.post_recv(role.stage - 1, m, tag, self.groups.fwd))
                    with self.autocast:
                        out = model(inp, y.to(self.device) if model.is_last else None)
                    if model.is_last:
                        if role.tp_rank == 0:
                            loss_sum += out.float()
                    else:
                        self.peers.send(out.float(), role.stage + 1, m, tag, self.groups.fwd, sends)
        for work, _ in sends:
            work.wait()
        dist.all_reduce(loss_sum)
        return float(loss_sum) / (num_batches * self.num_microbatches)


def _tied_matrix(model: StageModel) -> torch.Tensor | None:
    """The tied embedding matrix a first or last stage holds (None for a middle stage)."""
    if model.is_first:
        return model.layers[0].tok
    return model.tied_copy
