"""A stage's memory levers as the simulator sees them: activation recomputation and ZeRO.

Recomputation changes what a stage's layers save and how long their backward runs, so it is a
*profile* of its own (``recomputed_profile``): every part of the model that reads a profile
(the layer tables, the memory model, ``simulate``, the planner's kinds and bounds) takes it up
unchanged.  Only the transformer blocks are recomputed (the embedding and the LM head keep
their activations, as in Megatron):

* ``selective`` (Megatron's selective recomputation): a block drops what its attention core
  alone saves (the softmax probabilities under eager attention, O(heads x seq^2); a fused
  kernel's logsumexp), and its backward re-runs the core's forward (Q K^T and P V, their share
  of the block's forward FLOPs times its measured forward time).  Q, K, V and the context stay
  saved: the linears around the core keep them.
* ``full``: a block keeps only its input per micro-batch in flight (the residual stream, the
  previous layer's output bytes); its backward first re-runs its forward, so it adds the
  block's forward time, and while it runs one block's full activations exist besides
  (``recompute_working_bytes``).

ZeRO depends on the stage's data-parallel degree D, so it is applied where D is known
(``memory.stage_memory_parts``, ``simulate``, ``planner/fastsim.py``), as the engine runs it
(``runtime/zero.py``, docs/engine.md):

* memory: ZeRO-1 and -2 keep 1/D of the optimizer states per replica (``ceil(params / D)``,
  whatever the replicas' GPU types).  ZeRO-1 keeps the all-reduce's flat buckets (a second
  copy of the gradients); ZeRO-2 keeps only its range of them (1/D) and drops the full
  gradients at the optimizer step, but still holds them through the backwards (the 1F1B
  accumulates every micro-batch into them);
* time: the optimizer step runs on 1/D of the parameters, then the updated parameters are
  all-gathered (``(D - 1) / D`` of them per replica, half an all-reduce's ring traffic).  ZeRO-1
  all-reduces the gradients as before, so its sync is 1 + w/(2g) all-reduces (``zero_sync_factor``,
  w and g the bytes per weight and per gradient); ZeRO-2 reduce-scatters them instead (half an
  all-reduce): 1/2 + w/(2g).  Both are charged after the pipeline drains, as the all-reduce is
  (the all-gather is not overlapped with the next forward).
"""

from __future__ import annotations

import dataclasses

from sailor_core.catalog.layers import attention_core, layer_shapes
from sailor_core.catalog.models import get_model
from sailor_core.plan.types import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from sailor_core.profiles.types import LayerProfile, ModelProfile
from sailor_core.regimes import TrainingRegime

# (id(base), mode) -> derived, id(derived) -> (base, mode, derived): both held for the process (a
# few hundred profiles at most), so an id is never reused and a kind's profile stays known.
_DERIVED: dict[tuple[int, str], ModelProfile] = {}
_BASE: dict[int, tuple[ModelProfile, str, ModelProfile]] = {}
_WORKING: dict[int, int] = {}  # id(derived profile) -> recompute_working_bytes


def recomputed_profile(profile: ModelProfile, mode: str) -> ModelProfile:
    """``profile`` under recomputation ``mode`` (the profile itself for ``none``); cached, so the
    layer tables and every memo keyed on a profile see one object per (profile, mode)."""
    if mode == RECOMPUTE_NONE:
        return profile
    if mode not in (RECOMPUTE_SELECTIVE, RECOMPUTE_FULL):
        raise ValueError(f"unknown recomputation {mode!r}")
    key = (id(profile), mode)
    hit = _DERIVED.get(key)
    if hit is not None and _BASE[id(hit)][0] is profile:
        return hit
    derived = _derive(profile, mode)
    _DERIVED[key] = derived
    _BASE[id(derived)] = (profile, mode, derived)
    return derived


def _derive(profile: ModelProfile, mode: str) -> ModelProfile:
    spec = get_model(profile.model)
    layers = list(profile.layers)
    shares: dict[str, tuple[int, float]] = {}  # blocks of one attention kind are alike (catalog.layers)
    # A derived block is a function of the block and what it reads besides (its attention kind's
    # share; the previous layer's output under full recomputation), and a profile's blocks repeat
    # a few values (opt-350m's 24: 2): each is built once (the constructor is most of the cost).
    made: dict[tuple, LayerProfile] = {}
    for i in range(1, spec.num_layers + 1):
        layer = layers[i]
        context = layers[i - 1].output_bytes if mode == RECOMPUTE_FULL else spec.attention_kind(i)
        hit = made.get((layer, context))
        if hit is not None:
            layers[i] = hit
            continue
        if mode == RECOMPUTE_FULL:
            # the block's input: the previous layer's output (the residual stream)
            kept, extra_s = min(layer.activation_bytes, context), layer.fwd_s
        else:
            saved, share = shares.get(context) or shares.setdefault(context, attention_core_share(profile, i))
            kept, extra_s = max(0, layer.activation_bytes - saved), layer.fwd_s * share
        # a derived profile is built for every kind a lever search meets: the constructor, not
        # dataclasses.replace (which inspects the fields each call)
        layers[i] = made[(layer, context)] = LayerProfile(
            fwd_s=layer.fwd_s, bwd_s=layer.bwd_s + extra_s, params=layer.params, activation_bytes=kept,
            output_bytes=layer.output_bytes, measured=layer.measured)
    # the base profile's layers stay the ones read for a block's full activations
    return dataclasses.replace(profile, layers=tuple(layers), source=f"{profile.source}; recompute {mode}")


def attention_core_share(profile: ModelProfile, index: int) -> tuple[int, float]:
    """(bytes the attention core of block ``index`` saves for one micro-batch, its share of the
    block's forward FLOPs) on one GPU of ``profile``'s (GPU, TP)."""
    saved_per_seq, core_flops = attention_core(profile.model, tp_degree=profile.tp_degree,
                                               seq_len=profile.seq_len, regime=profile.regime, index=index)
    block = layer_shapes(profile.model, tp_degree=profile.tp_degree, seq_len=profile.seq_len,
                         regime=profile.regime)[index]
    share = core_flops / block.fwd_flops_per_token if block.fwd_flops_per_token > 0 else 0.0
    return saved_per_seq * profile.micro_batch_size, share


def recompute_working_bytes(profile: ModelProfile) -> int:
    """What full recomputation holds besides the kept inputs while a block runs backward: its
    re-run forward's activations beyond its kept input, the largest block's (blocks of one
    model are alike but for local and global attention); 0 for the other modes."""
    hit = _BASE.get(id(profile))
    if hit is None or hit[2] is not profile or hit[1] != RECOMPUTE_FULL:
        return 0
    found = _WORKING.get(id(profile))
    if found is None:
        base = hit[0]
        found = _WORKING[id(profile)] = max(
            (base.layers[i].activation_bytes - profile.layers[i].activation_bytes
             for i in range(1, get_model(profile.model).num_layers + 1)), default=0)
    return found


def zero_shards(zero_stage: int, dp_degree: int) -> int:
    """Shards of the optimizer states per replica (ZeRO-1 and -2)."""
    return max(1, dp_degree) if zero_stage >= 1 else 1


def sharded(count: int, shards: int) -> int:
    """One replica's share of ``count`` elements split ``shards`` ways (the first shards round up)."""
    return count if shards <= 1 else -(-count // shards)


# The engine's DP buckets close before they pass 8 MiB of gradients (``runtime/allreduce.py``,
# ``OverlappedAllReduce.BUCKET_BYTES``; tests/simulator/test_memory_vs_engine.py checks it).
ENGINE_BUCKET_BYTES = 8 * 1024 * 1024


def zero_gather_bytes(num_synced: int, largest_tensor: int, bytes_per_param: int, shards: int) -> int:
    """ZeRO's step working memory: after AdamW on its ranges, a replica all-gathers each bucket,
    its range copied out (1/D of the bucket) beside the gathered flat (the whole bucket), the
    largest bucket at the peak (``runtime/zero.ShardedAdamW._all_gather``).  A bucket holds at
    most ``ENGINE_BUCKET_BYTES`` unless one tensor alone is larger."""
    bucket = min(num_synced, max(ENGINE_BUCKET_BYTES // bytes_per_param, largest_tensor))
    return (bucket + sharded(bucket, shards)) * bytes_per_param


def zero_sync_factor(zero_stage: int, regime: TrainingRegime) -> float:
    """The stage's gradient sync and parameter all-gather under ZeRO, in all-reduces of its
    gradient bytes (the module doc)."""
    if zero_stage < 1:
        return 1.0
    gather = regime.weight_bytes_per_param / (2 * regime.grad_bytes_per_param)
    return (1.0 if zero_stage == 1 else 0.5) + gather


def lever_label(recompute: str, zero_stage: int) -> str:
    """How a stage's levers read in tables and explanations."""
    parts = []
    if recompute != RECOMPUTE_NONE:
        parts.append(f"recompute {recompute}")
    if zero_stage:
        parts.append(f"ZeRO-{zero_stage}")
    return ", ".join(parts) or "none"

