"""A rank's training state to and from checkpoints (``runtime/checkpoint.py``'s files), and kept
in memory by a parked worker (``runtime/park.py``).

Replica 0 of each stage writes its layers' full tensors (gathered over TP) with their AdamW
state; any plan's ranks then load their shards of them.  A tied embedding's copy on the last
stage is never stored: it loads from layer 0's file.  The meta holds the step, the next
sample, the recipe and the held-out split, so a resumed or re-planned job continues them.
Under ZeRO every DP rank of a stage first all-gathers the AdamW states to the layout an
unsharded optimizer has (``ShardedAdamW.gathered_states``), so a checkpoint is the same whatever
the sharding and recomputation it was written under, and loads under any other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from sailor_core.catalog.models import model_spec_to_dict
from sailor_core.runtime import checkpoint as ckpt
from sailor_core.runtime.model import ShardedLayer, StageModel
from sailor_core.runtime.trainer import StageTrainer
from sailor_core.storage import Storage


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptState:
    """A parked worker's training state (``runtime/park.py``): its shard's tensors and their AdamW
    state at ``step``, detached from the model and process groups it trained with."""

    model: str
    shard: tuple[int, int, int, int]  # layer_start, layer_end, tp_degree, tp_rank
    step: int
    tensors: tuple[tuple[int, str, torch.Tensor, dict], ...]  # (layer index, name, values, optimizer state)
    sharded: bool = False  # kept under ZeRO: no optimizer state to adopt


def save_layers(trainer: StageTrainer, storage: Storage, on_file: Callable[[], None] | None = None) -> dict:
    """Write this rank's layer files of the trainer's step (``layer_states``), one layer at a time
    (``on_file``: told after each)."""
    files: dict = {}
    for layer_index, state in layer_states(trainer):
        files.update(ckpt.write_layer(storage, trainer.step, layer_index, state))
        if on_file is not None:
            on_file()
    return files


def layer_states(trainer: StageTrainer) -> Iterator[tuple[int, dict]]:
    """(layer index, full tensors) of the layers this rank stores: replica 0 of each stage gathers
    full tensors over TP, its TP rank 0 gets them.  A collective: every rank runs it to its end.
    The tensors are copies, not the live ones (``ShardedLayer.gather`` clones; ZeRO's gathered)."""
    states = _optimizer_states(trainer)  # a collective of the DP group under ZeRO
    if trainer.role.replica != 0:
        return
    for layer in trainer.model.layers:
        state = {"params": {}, "exp_avg": {}, "exp_avg_sq": {}}
        for name, p in layer.own_parameters():  # a tied copy is layer 0's, stored there
            st = states.get(id(p), {})
            state["params"][name] = layer.gather(name, p.data)
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    state[key][name] = layer.gather(name, st[key])
        if trainer.role.tp_rank == 0:
            yield layer.layer_index, state


def _optimizer_states(trainer: StageTrainer) -> dict[int, dict]:
    """id of parameter -> its AdamW state shaped as the parameter (ZeRO's gathered over DP)."""
    plain = trainer.optimizer.state if trainer.optimizer is not None else {}
    states = {id(p): st for p, st in plain.items()}
    if trainer.zero is not None:
        states.update(trainer.zero.gathered_states(has_state=trainer.step > 0))
    return states


def checkpoint_meta(trainer: StageTrainer) -> dict:
    """The checkpoint's meta: where training stands, and what a resumed or re-planned job keeps
    (the recipe, the held-out split, the pretrained weights it started from)."""
    split = trainer.data.split
    return {"step": trainer.step, "next_sample": trainer.next_sample, "model": trainer.spec.name,
            "plan": trainer.plan.to_dict(), "optimizer": "adamw",
            "num_layer_indices": trainer.spec.num_layer_indices, "recipe": trainer.recipe.to_dict(),
            "data": {"num_samples": split.num_samples, "num_val_samples": split.num_val_samples},
            **({"init_from": trainer.init_from} if trainer.init_from else {})}


def load(trainer: StageTrainer, storage: Storage, info: ckpt.CheckpointInfo) -> None:
    """Resume ``trainer`` from the checkpoint ``info``: its shard of every layer, AdamW state, meta."""
    _check_model(trainer, info)
    load_states(trainer, {i: ckpt.read_layer(storage, info, i) for i in weight_layers(trainer.model)}, info)


def load_states(trainer: StageTrainer, states: dict[int, dict], info: ckpt.CheckpointInfo) -> None:
    """Resume ``trainer`` from full per-layer states (``weight_layers``' indices, each as a layer file
    holds it) at the checkpoint ``info``: read from its files (``load``) or handed over by the ranks
    that hold them (``runtime/handover.py``), the same way either way."""
    _check_model(trainer, info)
    step_t = torch.tensor(float(info.step))
    # The fused kernel reads its step counts on the parameters' device; the others on the CPU.
    fused = trainer.optimizer is not None and bool(trainer.optimizer.defaults.get("fused"))
    for layer in trainer.model.layers:
        for name, p in layer.named_parameters(recurse=False):
            state = states[0 if name in layer.tied else layer.layer_index]
            copy_full_param(layer, name, p, state["params"].get(name), f"checkpoint {info.dirname}")
            if name in state["exp_avg"] and trainer.zero is not None and trainer.zero.holds(p):
                trainer.zero.load_state(p, {k: state[k][name] for k in ("exp_avg", "exp_avg_sq")}, step_t)
            elif name in state["exp_avg"]:
                trainer.optimizer.state[p] = {
                    "step": step_t.to(p.device) if fused else step_t.clone(),
                    "exp_avg": layer.shard(name, state["exp_avg"][name]).to(p.device),
                    "exp_avg_sq": layer.shard(name, state["exp_avg_sq"][name]).to(p.device),
                }
    _take_meta(trainer, info)


def kept_state(trainer: StageTrainer) -> KeptState:
    """This rank's state, to be taken over by the next generation's trainer (``adopt``); under
    ZeRO a rank's AdamW states are pieces of others' too, so it keeps none and ``can_adopt`` says no."""
    plain = trainer.optimizer.state if trainer.optimizer is not None and trainer.zero is None else {}
    return KeptState(model=trainer.spec.name, shard=_shard(trainer), step=trainer.step,
                     tensors=tuple((i, name, p.detach(), dict(plain.get(p, {})))
                                   for i, name, p in named_tensors(trainer)),
                     sharded=trainer.zero is not None)


def can_adopt(trainer: StageTrainer, kept: KeptState, info: ckpt.CheckpointInfo) -> bool:
    """Whether ``kept`` is exactly what loading ``info`` would give this rank: the same
    model and shard, at the checkpoint's step (the checkpoint was written from it), neither under ZeRO."""
    return (kept.model == trainer.spec.name and kept.shard == _shard(trainer) and kept.step == info.step
            and not kept.sharded and trainer.zero is None)


def adopt(trainer: StageTrainer, kept: KeptState, info: ckpt.CheckpointInfo) -> None:
    """Resume from ``info`` with the tensors a parked worker kept instead of reading them."""
    assert can_adopt(trainer, kept, info)
    _check_model(trainer, info)
    mine = named_tensors(trainer)
    assert [(i, n) for i, n, _ in mine] == [(i, n) for i, n, _, _ in kept.tensors]
    with torch.no_grad():
        for (_, _, p), (_, _, values, state) in zip(mine, kept.tensors):
            p.copy_(values)
            if state:
                trainer.optimizer.state[p] = state
    _take_meta(trainer, info)


def _shard(trainer: StageTrainer) -> tuple[int, int, int, int]:
    r = trainer.role
    return (r.layer_start, r.layer_end, r.tp_degree, r.tp_rank)


def named_tensors(trainer: StageTrainer) -> list[tuple[int, str, torch.nn.Parameter]]:
    """The rank's parameters, each with its layer index and name, in the model's order."""
    return [(layer.layer_index, name, p) for layer in trainer.model.layers
            for name, p in layer.named_parameters(recurse=False)]


def _check_model(trainer: StageTrainer, info: ckpt.CheckpointInfo) -> None:
    if info.meta.get("model") != trainer.spec.name:
        raise ckpt.CheckpointError(f"checkpoint {info.dirname} is of model "
                                   f"{info.meta.get('model')!r}, not {trainer.spec.name!r}")
    theirs = (info.meta.get("plan") or {}).get("model_spec")  # a model folder's: the same name, another config?
    if theirs is not None and theirs != json.loads(json.dumps(model_spec_to_dict(trainer.spec))):
        raise ckpt.CheckpointError(f"checkpoint {info.dirname} is of another config of {trainer.spec.name!r} "
                                   "(its config.json changed since)")


def _take_meta(trainer: StageTrainer, info: ckpt.CheckpointInfo) -> None:
    """Where the checkpoint stands; its recipe continued, its held-out split kept (same file)."""
    meta = info.meta
    trainer.step = trainer.first_step = info.step
    trainer.first_sample = int(meta["next_sample"])
    trainer.init_from = meta.get("init_from")
    if "recipe" in meta:
        trainer.recipe = trainer.recipe.continued(meta["recipe"])
    data = meta.get("data") or {}
    if data.get("num_samples") == trainer.data.split.num_samples and "num_val_samples" in data:
        trainer.data = trainer.data.with_held_out(int(data["num_val_samples"]))


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
