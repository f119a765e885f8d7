"""One rank of a plan: its stage model shard, 1F1B with p2p, per-stage DP sync, AdamW, checkpoints.

Process groups (created in the same order on every rank, as torch requires):
one TP group per replica with TP > 1; per stage either one DP group per TP
rank (all replicas share a TP degree: all-reduce shard gradients directly) or,
when the replicas' TP degrees differ, one group of all the stage's ranks in
which every rank contributes its replica's FULL gradient (TP-gathered) divided
by its TP degree, so the sum over ranks is the sum over replicas; each rank
then takes its own shard back.

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
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_core.catalog.models import ModelSpec, get_model
from sailor_core.plan.types import Plan
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime import links
from sailor_core.runtime.data import TokenDataset
from sailor_core.plan.layout import RankRole, rank_layout, replica_ranks, stage_ranks
from sailor_core.plan.routing import replica_of
from sailor_core.runtime.model import TIED, ShardedLayer, StageModel
from sailor_core.runtime.pipeline_order import gradients_known_arrived, local_microbatches, rank_op_order
from sailor_core.runtime.recipe import Recipe
from sailor_core.storage import Storage

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


def decay_groups(model: StageModel, weight_decay: float) -> list[dict]:
    """The model's parameters as two AdamW groups: with ``weight_decay`` and without (``decays``)."""
    with_decay, without = [], []
    for _, name, p in model.named_layer_params():
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


def _drop_completed(sends: list) -> None:
    """Forget the sends that report completion (NCCL's do as their kernels finish; gloo's only
    once waited, hence ``_retire`` where the schedule says a send has arrived).  A payload lives
    until its send completes, not to the step's end: the first stage would otherwise hold every
    micro-batch's output."""
    sends[:] = [s for s in sends if not s[0].is_completed()]


def _retire(sends: list, entries: list) -> None:
    """Wait for ``entries`` (sends known to have arrived, so the wait returns at once) and forget
    them: their payloads are freed even where the backend never reports a send complete."""
    for work, _ in entries:
        work.wait()
    sends[:] = [s for s in sends if all(s is not e for e in entries)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Groups:
    tp: object | None          # this replica's TP group (None for TP 1)
    dp: object | None          # this rank's DP group (None when the stage has one replica)
    dp_mixed_tp: bool          # True: the DP group spans all stage ranks (replicas differ in TP)
    fwd: object                # world group for activations (downstream)
    bwd: object                # world group for gradients (upstream)
    tied: object | None = None  # embedding group: this rank's, when it holds a tied matrix of a multi-stage plan
    tied_mixed_tp: bool = False  # True: the embedding group sums full gradients (TP degrees differ)


def make_groups(plan: Plan, rank: int) -> Groups:
    """Create every group on every rank (same order everywhere), return this rank's.

    Activations and gradients travel in two separate world groups: with NCCL each
    group's pair has its own stream, so a stage's queued forward sends never wait
    behind a backward receive (which would deadlock 1F1B); gloo does not mind.
    """
    world = list(range(sum(rep.tp_degree for st in plan.stages for rep in st.replicas)))
    fwd, bwd = dist.new_group(world), dist.new_group(world)
    my_tp = my_dp = None
    mixed_mine = False
    for s, stage in enumerate(plan.stages):
        for r, rep in enumerate(stage.replicas):
            if rep.tp_degree > 1:
                ranks = replica_ranks(plan, s, r)
                g = dist.new_group(ranks)
                if rank in ranks:
                    my_tp = g
        if stage.dp_degree == 1:
            continue
        degrees = {rep.tp_degree for rep in stage.replicas}
        if len(degrees) == 1:
            for t in range(degrees.pop()):
                ranks = [replica_ranks(plan, s, r)[t] for r in range(stage.dp_degree)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    my_dp = g
        else:
            ranks = stage_ranks(plan, s)
            g = dist.new_group(ranks)
            if rank in ranks:
                my_dp, mixed_mine = g, True
    tied, tied_mixed = _embedding_group(plan, rank)
    return Groups(tp=my_tp, dp=my_dp, dp_mixed_tp=mixed_mine, fwd=fwd, bwd=bwd, tied=tied, tied_mixed_tp=tied_mixed)


def _embedding_group(plan: Plan, rank: int) -> tuple[object | None, bool]:
    """Create the embedding group(s) of a tied model split over stages (every rank, same order);
    (this rank's group or None, whether it sums full gradients)."""
    if not get_model(plan.model).tie_embeddings or len(plan.stages) == 1:
        return None, False
    ends = (0, len(plan.stages) - 1)
    replicas = [(s, r) for s in ends for r in range(plan.stages[s].dp_degree)]
    degrees = {plan.stages[s].replicas[r].tp_degree for s, r in replicas}
    if len(degrees) > 1:
        ranks = [k for s in ends for k in stage_ranks(plan, s)]
        g = dist.new_group(ranks)
        return (g if rank in ranks else None), True
    mine = None
    for t in range(degrees.pop()):
        ranks = [replica_ranks(plan, s, r)[t] for s, r in replicas]
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    return mine, False


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptState:
    """A parked worker's training state (``runtime/park.py``): its shard's tensors and their AdamW
    state at ``step``, detached from the model and process groups it trained with."""

    model: str
    shard: tuple[int, int, int, int]  # layer_start, layer_end, tp_degree, tp_rank
    step: int
    tensors: tuple[tuple[int, str, torch.Tensor, dict], ...]  # (layer index, name, values, optimizer state)


class StageTrainer:
    def __init__(self, *, plan: Plan, spec: ModelSpec, rank: int, data: TokenDataset, recipe: Recipe,
                 seed: int, device: torch.device, groups: Groups) -> None:
        self.plan, self.spec, self.rank, self.data, self.recipe = plan, spec, rank, data, recipe
        self.roles = rank_layout(plan)
        self.role: RankRole = self.roles[rank]
        self.device = device
        self.groups = groups
        self.model = StageModel(spec, self.role.layer_start, self.role.layer_end,
                                self.role.tp_degree, self.role.tp_rank, groups.tp, seed).to(device)
        self.optimizer = make_optimizer(decay_groups(self.model, recipe.weight_decay), recipe.peak_lr)
        self.seq_len = plan.effective_seq_len()
        self.num_microbatches = plan.num_microbatches
        dps = [s.dp_degree for s in plan.stages]
        self.schedule = rank_op_order(self.num_microbatches, dps, self.role.stage, self.role.replica)
        self.step = 0              # optimizer steps done
        self.first_sample = 0      # global sample index of iteration `first_step`
        self.first_step = 0
        self.init_from: str | None = None  # the pretrained weights the job started from (checkpoint meta)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                         else contextlib.nullcontext())
        self._tied = _tied_matrix(self.model) if groups.tied is not None else None
        self._overlap = (_OverlappedAllReduce(self._dp_params(), groups.dp)
                         if groups.dp is not None and not groups.dp_mixed_tp else None)
        self._last_backward = max(i for i, (kind, _) in enumerate(self.schedule) if kind == "B")
        self._gradients_arrived = gradients_known_arrived(self.num_microbatches, dps, self.role.stage,
                                                          self.role.replica)
        self._pace = links.ComputePace.from_env()  # benchmarks only: None in every real run
        self._num_layers = self.role.layer_end - self.role.layer_start

    # ---- pipeline neighbours -------------------------------------------------
    def _peer_ranks(self, stage: int, m: int) -> list[int]:
        dp = self.plan.stages[stage].dp_degree
        return replica_ranks(self.plan, stage, replica_of(m, dp))

    def _send(self, tensor: torch.Tensor, stage: int, m: int, tag: int, group, sends: list) -> list:
        """Send ``tensor`` (this replica's output or its input's gradient, the same on each of its
        TP ranks) to the replica of ``stage`` that gets micro-batch ``m``; the works go to ``sends``.
        Equal TP degrees: TP rank t sends the t-th slice to rank t, which gathers them over its
        TP group (Megatron's scatter-gather: the tensor crosses the network once, over every TP
        pair); otherwise whole copies, receiver r's from TP rank r mod this TP degree.  Returns
        the entries it added to ``sends``."""
        _drop_completed(sends)
        peers = self._peer_ranks(stage, m)
        t, k = self.role.tp_rank, self.role.tp_degree
        if _sliced(k, len(peers), tensor.numel()):
            targets = [(peers[t], tensor.reshape(-1).chunk(k)[t].contiguous())]
        else:
            payload = tensor.contiguous()
            targets = [(dst, payload) for dst in peers[t::k]]
        mine = [(links.isend(payload, dst=dst, tag=tag, group=group), payload) for dst, payload in targets]
        sends.extend(mine)
        return mine

    def _post_recv(self, stage: int, m: int, tag: int, group) -> tuple[object, torch.Tensor, bool]:
        """Post the receive of micro-batch ``m``'s tensor from ``stage`` (see ``_send``): its work,
        its buffer and whether that holds this rank's slice only."""
        peers = self._peer_ranks(stage, m)
        t, k = self.role.tp_rank, self.role.tp_degree
        numel = math.prod(self._act_shape())
        if _sliced(len(peers), k, numel):
            buf = torch.empty(numel // k, device=self.device)
            return links.irecv(buf, src=peers[t], tag=tag, group=group), buf, True
        buf = torch.empty(self._act_shape(), device=self.device)
        return links.irecv(buf, src=peers[t % len(peers)], tag=tag, group=group), buf, False

    def _received(self, work, buf: torch.Tensor, sliced: bool) -> torch.Tensor:
        """The whole tensor of a posted receive, once it arrived (slices gathered over TP)."""
        work.wait()
        if not sliced:
            return buf
        parts = [torch.empty_like(buf) for _ in range(self.role.tp_degree)]
        dist.all_gather(parts, buf, group=self.groups.tp)
        return torch.cat(parts).view(self._act_shape())

    @property
    def next_sample(self) -> int:
        return self.first_sample + (self.step - self.first_step) * self.plan.global_batch_size

    def _microbatch(self, m: int):
        x, y = self.data.microbatch(self.first_sample, self.step - self.first_step, m,
                                    self.plan.global_batch_size, self.plan.micro_batch_size)
        return x.to(self.device), y.to(self.device)

    def _act_shape(self):
        return (self.plan.micro_batch_size, self.seq_len, self.spec.hidden_size)

    # ---- one iteration ------------------------------------------------------
    def train_step(self, on_first_forward=None) -> float:
        """Run one iteration (1F1B, DP sync, AdamW); returns this rank's sum of micro-batch losses
        (non-zero only on TP rank 0 of last-stage replicas)."""
        role, model = self.role, self.model
        first, last = model.is_first, model.is_last
        sends, saved = [], {}
        inbox = _Inbox(self)
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
                        _retire(sends, backward_sends.pop(k))
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
                    forward_sends[m] = self._send(out.detach(), role.stage + 1, m, 2 * m, self.groups.fwd, sends)
                inbox.done("F")
            else:
                inp, out = saved.pop(m)
                grad = None if last else inbox.take("B", m)
                started_s = time.time()
                out.backward(grad)
                if self._pace is not None:
                    self._pace.hold("B", self._num_layers, started_s)
                if not last:  # m's gradient came back, so its output reached the next stage
                    _retire(sends, forward_sends.pop(m))
                if not first:
                    backward_sends[m] = self._send(inp.grad, role.stage - 1, m, 2 * m + 1, self.groups.bwd, sends)
                inbox.done("B")
        for work, _ in sends:
            work.wait()
        self._sync_grads()
        self.clip_grads()
        apply_recipe(self.optimizer, self.recipe, self.step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
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
        elif g.dp is not None:
            synced = [(layer, name, p) for layer, name, p in self.model.named_layer_params() if p is not self._tied]
            fulls = [self._gather_full(layer, name, p.grad) / self.role.tp_degree for layer, name, p in synced]
            _allreduce_flat(fulls, g.dp)
            for (layer, name, p), full in zip(synced, fulls):
                p.grad.copy_(layer.shard(name, full))
        self._sync_tied_grads()

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
        sharded = layer.shard_dims[name] is not None and self.role.tp_degree > 1
        return sharded or self.role.tp_rank == 0

    def grad_norm(self) -> torch.Tensor:
        """The global L2 norm of all gradients of the model (every rank gets the same value)."""
        mine = [p.grad for layer, name, p in self.model.named_layer_params() if self._counts_in_norm(layer, name)]
        sq = (torch.nn.utils.get_total_norm(mine, foreach=False) ** 2 if mine
              else torch.zeros((), device=self.device))
        sq = sq.to(device=self.device, dtype=torch.float32).reshape(())
        dist.all_reduce(sq)
        return sq.sqrt()

    def clip_grads(self) -> float | None:
        """Scale the gradients so their global norm is at most the recipe's (none: no clipping)."""
        if not self.recipe.grad_clip_norm:
            return None
        norm = self.grad_norm()
        torch.nn.utils.clip_grads_with_norm_(list(self.model.parameters()), self.recipe.grad_clip_norm, norm,
                                             foreach=False)
        return float(norm)

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
                        inp = self._received(*self._post_recv(role.stage - 1, m, tag, self.groups.fwd))
                    with self.autocast:
                        out = model(inp, y.to(self.device) if model.is_last else None)
                    if model.is_last:
                        if role.tp_rank == 0:
                            loss_sum += out.float()
                    else:
                        self._send(out.float(), role.stage + 1, m, tag, self.groups.fwd, sends)
        for work, _ in sends:
            work.wait()
        dist.all_reduce(loss_sum)
        return float(loss_sum) / (num_batches * self.num_microbatches)

    # ---- checkpoints --------------------------------------------------------
    def save_layers(self, storage: Storage) -> dict:
        """Replica 0 of each stage gathers full tensors over TP; its TP rank 0 writes them."""
        files: dict = {}
        if self.role.replica != 0:
            return files
        for layer in self.model.layers:
            state = {"params": {}, "exp_avg": {}, "exp_avg_sq": {}}
            for name, p in layer.own_parameters():  # a tied copy is layer 0's, stored there
                st = self.optimizer.state.get(p, {})
                state["params"][name] = self._gather_full(layer, name, p.data)
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in st:
                        state[key][name] = self._gather_full(layer, name, st[key])
            if self.role.tp_rank == 0:
                files.update(ckpt.write_layer(storage, self.step, layer.layer_index, state))
        return files

    def meta(self) -> dict:
        return {"step": self.step, "next_sample": self.next_sample, "model": self.spec.name,
                "plan": self.plan.to_dict(), "optimizer": "adamw",
                "num_layer_indices": self.spec.num_layer_indices, **self.recipe_meta(),
                **({"init_from": self.init_from} if self.init_from else {})}

    def recipe_meta(self) -> dict:
        """What a resumed or re-planned job keeps: the schedule and the held-out split."""
        split = self.data.split
        return {"recipe": self.recipe.to_dict(),
                "data": {"num_samples": split.num_samples, "num_val_samples": split.num_val_samples}}

    def load_recipe(self, meta: dict) -> None:
        """Continue the checkpoint's schedule and keep its held-out split (same file)."""
        if "recipe" in meta:
            self.recipe = Recipe.from_dict(meta["recipe"])
        data = meta.get("data") or {}
        if data.get("num_samples") == self.data.split.num_samples and "num_val_samples" in data:
            self.data = self.data.with_held_out(int(data["num_val_samples"]))

    def _shard(self) -> tuple[int, int, int, int]:
        r = self.role
        return (r.layer_start, r.layer_end, r.tp_degree, r.tp_rank)

    def _named_tensors(self) -> list[tuple[int, str, torch.nn.Parameter]]:
        return [(layer.layer_index, name, p) for layer in self.model.layers
                for name, p in layer.named_parameters(recurse=False)]

    def kept_state(self) -> KeptState:
        """This rank's state, to be taken over by the next generation's trainer (``adopt``)."""
        return KeptState(model=self.spec.name, shard=self._shard(), step=self.step,
                         tensors=tuple((i, name, p.detach(), dict(self.optimizer.state.get(p, {})))
                                       for i, name, p in self._named_tensors()))

    def can_adopt(self, kept: KeptState, info: ckpt.CheckpointInfo) -> bool:
        """Whether ``kept`` is exactly what loading ``info`` would give this rank: the same
        model and shard, at the checkpoint's step (the checkpoint was written from it)."""
        return kept.model == self.spec.name and kept.shard == self._shard() and kept.step == info.step

    def adopt(self, kept: KeptState, info: ckpt.CheckpointInfo) -> None:
        """Resume from ``info`` with the tensors a parked worker kept instead of reading them."""
        assert self.can_adopt(kept, info)
        self._check_model(info)
        mine = self._named_tensors()
        assert [(i, n) for i, n, _ in mine] == [(i, n) for i, n, _, _ in kept.tensors]
        with torch.no_grad():
            for (_, _, p), (_, _, values, state) in zip(mine, kept.tensors):
                p.copy_(values)
                if state:
                    self.optimizer.state[p] = state
        self._take_meta(info)

    def _check_model(self, info: ckpt.CheckpointInfo) -> None:
        if info.meta.get("model") != self.spec.name:
            raise ckpt.CheckpointError(f"checkpoint {info.dirname} is of model "
                                       f"{info.meta.get('model')!r}, not {self.spec.name!r}")

    def _take_meta(self, info: ckpt.CheckpointInfo) -> None:
        self.step = self.first_step = info.step
        self.first_sample = int(info.meta["next_sample"])
        self.init_from = info.meta.get("init_from")
        self.load_recipe(info.meta)

    def load(self, storage: Storage, info: ckpt.CheckpointInfo) -> None:
        self._check_model(info)
        step_t = torch.tensor(float(info.step))
        # The fused kernel reads its step counts on the parameters' device; the others on the CPU.
        fused = bool(self.optimizer.defaults.get("fused"))
        states = {i: ckpt.read_layer(storage, info, i) for i in weight_layers(self.model)}
        for layer in self.model.layers:
            for name, p in layer.named_parameters(recurse=False):
                state = states[0 if name in layer.tied else layer.layer_index]
                copy_full_param(layer, name, p, state["params"].get(name), f"checkpoint {info.dirname}")
                if name in state["exp_avg"]:
                    self.optimizer.state[p] = {
                        "step": step_t.to(p.device) if fused else step_t.clone(),
                        "exp_avg": layer.shard(name, state["exp_avg"][name]).to(p.device),
                        "exp_avg_sq": layer.shard(name, state["exp_avg_sq"][name]).to(p.device),
                    }
        self._take_meta(info)


def load_full_weights(model: StageModel, params: dict[int, dict[str, torch.Tensor]], where: str) -> None:
    """Set a stage's parameters to its shards of full per-layer tensors (``weight_layers``' indices):
    a pretrained model to start from."""
    for layer in model.layers:
        for name, p in layer.named_parameters(recurse=False):
            source = params[0 if name in layer.tied else layer.layer_index]
            copy_full_param(layer, name, p, source.get(name), where)


def weight_layers(model: StageModel) -> list[int]:
    """The layer indices whose stored tensors a stage loads: its own, and 0 for a tied copy."""
    own = [layer.layer_index for layer in model.layers]
    return own if model.tied_copy is None or 0 in own else [0, *own]


def copy_full_param(layer: ShardedLayer, name: str, p: torch.Tensor, full: torch.Tensor | None, where: str) -> None:
    """Set ``p`` to this rank's shard of ``full``; CheckpointError when it is missing or of another shape."""
    if full is None or tuple(full.shape) != layer.full_shapes[name]:
        raise ckpt.CheckpointError(f"{where}: layer {layer.layer_index} parameter {name} is missing or has "
                                   f"another shape{'' if full is None else f' {tuple(full.shape)}'} "
                                   f"than {layer.full_shapes[name]}")
    with torch.no_grad():
        p.copy_(layer.shard(name, full).to(p.device))


def _tied_matrix(model: StageModel) -> torch.Tensor | None:
    """The tied embedding matrix a first or last stage holds (None for a middle stage)."""
    if model.is_first:
        return model.layers[0].tok
    return model.tied_copy


def _sliced(tp_src: int, tp_dst: int, numel: int) -> bool:
    """Whether a boundary tensor travels in TP slices (``StageTrainer._send``)."""
    return tp_src == tp_dst > 1 and numel % tp_src == 0


class _Inbox:
    """One step's receives, each posted as soon as the rank's previous op of its kind is done (the
    first of each kind at the step's start): the transfer then overlaps the op of the other kind
    that 1F1B runs in between, where a receive posted only when its op is reached would keep the
    whole transfer on the critical path (``simulator/pipeline_time``, schedule "prefetch").
    Posting after the op's own sends keeps every group's sends and receives in the order they
    had with a blocking receive: NCCL runs a communicator's operations in order on one stream."""

    def __init__(self, trainer: StageTrainer) -> None:
        self.trainer = trainer
        model = trainer.model
        self.queues = {"F": [] if model.is_first else [m for k, m in trainer.schedule if k == "F"],
                       "B": [] if model.is_last else [m for k, m in trainer.schedule if k == "B"]}
        self.posted = {"F": 0, "B": 0}
        self.pending: dict[tuple[str, int], tuple[object, torch.Tensor, bool]] = {}
        self.done("F")
        self.done("B")

    def done(self, kind: str) -> None:
        """The rank finished an op of ``kind`` (and posted its sends): post the next receive."""
        queue, i = self.queues[kind], self.posted[kind]
        if i == len(queue):
            return
        self.posted[kind] = i + 1
        t, m = self.trainer, queue[i]
        if kind == "F":
            self.pending[(kind, m)] = t._post_recv(t.role.stage - 1, m, 2 * m, t.groups.fwd)
        else:
            self.pending[(kind, m)] = t._post_recv(t.role.stage + 1, m, 2 * m + 1, t.groups.bwd)

    def take(self, kind: str, m: int) -> torch.Tensor:
        """The input of op (``kind``, ``m``): its activation (F) or its output's gradient (B)."""
        return self.trainer._received(*self.pending.pop((kind, m)))


class _OverlappedAllReduce:
    """Sum gradients over a DP group in buckets launched during the last backward (as DDP does).

    Buckets hold parameters in reverse registration order (about the order backward
    finishes them) and are launched strictly in bucket order on every rank, so the
    collectives match across ranks whatever order the hooks fire in.
    """

    BUCKET_BYTES = 8 << 20

    def __init__(self, params: list[torch.Tensor], group) -> None:
        self.group = group
        self.buckets: list[list[torch.Tensor]] = [[]]
        size = 0
        for p in reversed(params):
            if size and size + p.numel() * p.element_size() > self.BUCKET_BYTES:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        # One flat buffer per bucket for the whole run (as DDP keeps its buckets): a fresh
        # multi-MB buffer per step costs page faults and zeroing on every iteration.
        self.flats = [torch.empty(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
                      for ps in self.buckets]
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
        flat = self.flats[b]
        torch.cat([p.grad.reshape(-1) for p in self.buckets[b]], out=flat)
        self.pending.append((links.all_reduce(flat, self.group, async_op=True), flat, b))
        self.next_bucket = b + 1

    def finish(self) -> None:
        """Launch what is left (in order), wait, write the sums back into the gradients."""
        self.armed = False
        while self.next_bucket < len(self.buckets):
            self._launch(self.next_bucket)
        for work, flat, b in self.pending:
            work.wait()
            offset = 0
            for p in self.buckets[b]:
                n = p.numel()
                p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
                offset += n
        self.pending = []


def _allreduce_flat(tensors: list[torch.Tensor], group) -> None:
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


def full_params_close(a: dict, b: dict) -> float:
    """Largest absolute difference between two {layer: {name: tensor}} maps (inf if they differ in keys)."""
    if a.keys() != b.keys():
        return math.inf
    worst = 0.0
    for i in a:
        if a[i].keys() != b[i].keys():
            return math.inf
        for n in a[i]:
            worst = max(worst, float((a[i][n].float() - b[i][n].float()).abs().max()))
    return worst
