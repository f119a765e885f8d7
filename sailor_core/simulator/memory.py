"""Peak memory of one GPU holding a pipeline stage, from first principles.

    peak = max(while activations are held, the optimizer step) + DP buckets + constant overhead
    while activations are held (a replica with more micro-batches than K in flight):
           params x state_bytes_per_param            (weights + grads + optimizer, per regime)
         + K x (activation_bytes(stage, micro-batch) (saved for backward; K micro-batches in flight)
                + output bytes)                      (a sending stage keeps its output for backward)
         + loss working memory                       (only the GPU holding the LM head; per regime)
         + backward working memory                   (a later backward's first gradients, below)
         + p2p buffers                               (receives posted ahead)
    the optimizer step: params x state_bytes_per_param + the step's temporaries (per regime)

* Gradients exist from a replica's first backward of the iteration to the optimizer step.  A
  replica with no more micro-batches than K runs all its forwards first: its peak is in its
  first backward, layer by layer (``_activation_peak``), with no gradient beside the forwards.

* ``activation_bytes`` is the profile's per-layer figure for one micro-batch.  It
  includes what each micro-batch's forward keeps until its backward, e.g. the
  bf16 weight copies autocast makes (``sailor_core/catalog/layers.py``).  A stage
  that is not the last also keeps its output tensor (none of its layers saves it;
  the pipeline calls its backward with the received gradient).
* K: under 1F1B, stage i of P starts at most P - i forwards before its first
  backward, and never more than the micro-batches it processes, so
  K = min(P - i, micro-batches routed to that replica); with unequal replica counts
  the engine's lookahead is counted in the widest stage's micro-batches.
* Communication: the receive of the next input and of the output's gradient are
  posted ahead (one boundary tensor each); the engine keeps a flat copy of a
  replicated stage's gradients for its data-parallel all-reduce (4 B/param in fp32), all
  but a tied matrix, which the embedding group sums (``dp_synced_params``).
  The engine's peak tensor memory with K = 1..8 in flight on CPU matches this within
  a few percent (``benchmarks/bench_memory_inflight.py``).  A CUDA caching allocator
  rounds each tensor to 512 B (``max_memory_allocated``), which is left out: a few
  hundred tensors per micro-batch make it kilobytes.
* Loss working memory: ``regime.loss_working_bytes_per_logit x micro_batch x seq x
  ceil(V / tp)``: torch's cross-entropy (the H200 records) allocates the fp32 gradient of the
  log-probabilities and of the logits during its backward (8 B), beside the bf16 logits the
  model's output references while that micro-batch's loss runs (2 B: no backward saves them, so
  they are not held once per micro-batch in flight, ``catalog/layers.py``); the CPU engine's
  vocabulary-parallel one turns its saved softmax into the gradient in place (0: its forward's
  logits + probabilities are the head's activation figure).  One micro-batch at a time.
* Backward working memory (``backward_working_bytes``): a stage without the LM head starts a
  later backward (gradients exist) with its last block's down projection, which makes the
  gradient of its input (tokens x FFN shard) and a new gradient of its weight before adding it
  to the kept one; the embedding's backward makes its rows' dense gradient the same way.  The
  peak is taken over the backward's layers (activations freed as it goes down).  A first
  backward makes each weight's gradient the kept one itself: only the input's is extra.
* Optimizer step: single-tensor AdamW (the CPU engine) holds two temporaries of the tensor it
  updates (``regime.optimizer_temp_tensors``), the largest one's at its peak
  (``largest_tensor_params``); fused AdamW none.
* Tied embeddings: a model whose LM head is its token embedding counts that
  matrix once, in layer 0 (the head layer's parameters leave it out, as
  ``transformers``' ``num_parameters()`` does).  A stage that holds the head
  but not layer 0 holds a copy (Megatron's embedding group, the engine's too):
  ``ceil(V / tp) x embedding width`` more parameters, with their gradients and
  optimizer state (``tied_copy_params``).  A profile whose head layer already
  counts a vocabulary matrix (Sailor's OPT profiles, measured with Megatron's
  untied head) gets no copy.  Under DeepSpeed's pipeline engine nothing is tied across
  the stages (``compose.ties_embedding_across_stages``, the one predicate the embedding
  group's time reads too): the last stage holds what its profile's head counts and syncs
  it over its replicas as any other weight.  Sailor's OPT and Llama pipes give the head
  a matrix of its own (their profiles count it; an estimated head counts it under that
  regime, ``catalog/layers.py``); its GPT-Neo pipe has no head (``headless``: the profile's
  last index is a LayerNorm, and the loss reads the norm's hidden-wide output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog.models import get_model
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime
from sailor_core.simulator.compose import BLOCKING_P2P_REGIMES, ties_embedding_across_stages
from sailor_core.simulator.levers import recompute_working_bytes, sharded, zero_gather_bytes, zero_shards
from sailor_core.simulator.tables import LayerTable, layer_table

@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Peak memory of one GPU, by part (bytes)."""

    state_bytes: int  # weights + gradients + optimizer state
    activation_bytes: int  # all micro-batches in flight
    loss_working_bytes: int
    overhead_bytes: int
    num_params: int
    num_inflight: int
    capacity_bytes: int
    comm_bytes: int = 0  # receive buffers posted ahead, the data-parallel gradient buckets
    optimizer_working_bytes: int = 0  # the step's temporaries (when the step is the peak; ZeRO: its sync's buffers)
    backward_working_bytes: int = 0  # a backward's new gradients at the peak (none at the LM head: the loss's)

    @property
    def peak_bytes(self) -> int:
        return (self.state_bytes + self.activation_bytes + self.loss_working_bytes + self.comm_bytes
                + self.optimizer_working_bytes + self.backward_working_bytes + self.overhead_bytes)

    @property
    def allocated_bytes(self) -> int:
        """What the framework's allocator holds at the peak (all but the constant overhead)."""
        return self.peak_bytes - self.overhead_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, int | bool]:
        return {
            "peak_memory_bytes": self.peak_bytes,
            # what torch.cuda.max_memory_allocated sees: the peak less the regime's constant
            # overhead (the CUDA context), so a comparison with the allocator reads it directly
            "allocated_bytes": self.allocated_bytes,
            "state_bytes": self.state_bytes,
            "activation_bytes": self.activation_bytes,
            "loss_working_bytes": self.loss_working_bytes,
            "comm_bytes": self.comm_bytes,
            "optimizer_working_bytes": self.optimizer_working_bytes,
            "backward_working_bytes": self.backward_working_bytes,
            "overhead_bytes": self.overhead_bytes,
            "num_params": self.num_params,
            "num_inflight": self.num_inflight,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
        }


def inflight_microbatches(stage_index: int, num_stages: int, num_microbatches: int,
                          lookahead_scale: float = 1.0) -> int:
    """Micro-batches whose activations a 1F1B stage holds at once: its warm-up forwards and the
    one it runs before its first backward, min(P - i, its micro-batches).  The engine counts its
    lookahead in the widest stage's micro-batches (``runtime/pipeline_order``): a stage of D_i
    replicas where another has D_max runs ``lookahead_scale = D_max / D_i`` times more."""
    return max(1, min(int((num_stages - stage_index - 1) * lookahead_scale) + 1, num_microbatches))


def loss_working_bytes(model: str, tp_degree: int, micro_batch_size: int, seq_len: int,
                       regime: TrainingRegime) -> int:
    """What the loss of one micro-batch holds during its backward beyond the head's activations."""
    return regime.loss_working_bytes_per_logit * head_logits(model, tp_degree, micro_batch_size, seq_len)


def head_logits(model: str, tp_degree: int, micro_batch_size: int, seq_len: int) -> int:
    """Logits one GPU's LM head computes for one micro-batch: its ``ceil(V / tp)`` vocabulary rows."""
    return micro_batch_size * seq_len * -(-get_model(model).vocab_size // tp_degree)


def profile_head_logits(profile: ModelProfile) -> int:
    """Logits one GPU of ``profile``'s (GPU, TP, micro-batch, sequence) gives its loss for one
    micro-batch: its head's ``head_logits``, or, for a pipeline without a head
    (``headless``), the final norm's hidden-wide output, which the loss reads in their place."""
    if headless(profile):
        return profile.micro_batch_size * profile.seq_len * get_model(profile.model).hidden_size
    return head_logits(profile.model, profile.tp_degree, profile.micro_batch_size, profile.seq_len)


def headless(profile: ModelProfile) -> bool:
    """Whether ``profile``'s last index holds no vocabulary matrix at all (Sailor's GPT-Neo pipe
    ends with a LayerNorm; its loss reads the norm's output).  Under a framework that ties nothing
    across stages (``compose.ties_embedding_across_stages``) the last stage holds what its
    profile's head counts, and a head with a matrix holds as many vocabulary rows as the
    embedding, split alike over TP (the embedding adds position embeddings at most): a head of
    less than half the embedding's parameters has none (GPT-Neo's: 5,120 against 134 M at TP 1)."""
    if ties_embedding_across_stages(profile.regime):
        return False
    return 2 * profile.layers[-1].params < profile.layers[0].params


@lru_cache(maxsize=1024)
def largest_tensor_params(model: str, tp_degree: int, holds_vocab: bool) -> int:
    """Elements of the largest parameter tensor one GPU holds (the optimizer step's temporaries
    are its size): a vocabulary matrix (embedding, LM head or a tied copy) when the stage holds
    one, else a block's FFN or attention projection (``runtime/model.py``'s shards)."""
    spec = get_model(model)
    h = spec.hidden_size
    block = max(-(-spec.ffn_size // tp_degree), spec.num_heads * spec.head_dim // tp_degree) * h
    vocab = -(-spec.vocab_size // tp_degree) * spec.embedding_dim if holds_vocab else 0
    return max(block, vocab)


@lru_cache(maxsize=4096)
def backward_working_bytes(model: str, tp_degree: int, micro_batch_size: int, seq_len: int, layer: int,
                           activation_bytes_per_element: int, grad_bytes_per_param: int,
                           accumulating: bool) -> int:
    """What the backward of layer ``layer`` (0 the embedding, 1..L the blocks) allocates as it
    starts, beyond the gradients and activations counted: a block's last matmul (the FFN's down
    projection) makes the gradient of its input (tokens x its FFN shard) and of its weight; the
    embedding the dense gradient of its vocabulary rows.  A weight's new gradient is extra only
    while ``accumulating`` into one that exists (a first backward makes it the gradient itself).
    The LM head's is the loss's working memory, counted apart."""
    spec = get_model(model)
    if layer > spec.num_layers:
        return 0
    if layer == 0:
        rows = -(-spec.vocab_size // tp_degree)
        return rows * spec.embedding_dim * grad_bytes_per_param if accumulating else 0
    ffn = -(-spec.ffn_size // tp_degree)
    weight = spec.hidden_size * ffn * grad_bytes_per_param if accumulating else 0
    return micro_batch_size * seq_len * ffn * activation_bytes_per_element + weight


def tied_copy_params(profile: ModelProfile) -> int:
    """Parameters a GPU of ``profile``'s (GPU, TP) holding the LM head but not layer 0 holds beyond
    the layers' own: its copy of a tied embedding matrix, under a framework that ties the head to
    the embedding across stages (``compose.ties_embedding_across_stages``); 0 for an untied model
    and under a framework whose last stage holds only the head its profile counts (DeepSpeed's)."""
    return _tied_copy_params(profile.model, profile.tp_degree, profile.layers[-1].params,
                             ties_embedding_across_stages(profile.regime))


@lru_cache(maxsize=1024)
def _tied_copy_params(model: str, tp_degree: int, head_params: int, ties: bool) -> int:
    spec = get_model(model)
    if not (ties and spec.tie_embeddings):
        return 0
    matrix = -(-spec.vocab_size // tp_degree) * spec.embedding_dim
    return 0 if head_params >= matrix else matrix  # a head measured untied counts its own matrix


def stage_memory_parts(
    table: LayerTable, layer_start: int, layer_end: int, num_inflight: int, regime: TrainingRegime,
    head_logits: int, num_microbatches: int = 0, dp_degree: int = 1, zero_stage: int = 0,
) -> tuple[int, int, int, int, int, int, int, int]:
    """(params, state, activation, loss working, backward working, overhead, p2p buffers, optimizer
    working) bytes of
    one GPU holding layers [start, end) with K in flight, at its peak: the larger of the peak
    while activations are held (``_activation_peak``) and the optimizer step's (weights,
    gradients, optimizer state and the step's temporaries for the largest tensor; no activation
    or p2p buffer is alive then).  ``head_logits``: ``profile_head_logits`` of the profile
    (counted only when the stage holds the head); ``num_microbatches``: those of the replica (0:
    more than K).  The memory model's arithmetic, in one place: the breakdown (``stage_memory``)
    and the planner's bare peak (``stage_peak_bytes``) both use it.  ``zero_stage`` shards the
    optimizer states over the stage's ``dp_degree`` replicas, and under ZeRO-2 the gradients are
    gone at the step (the replica's range of their sum is its DP bucket: ``dp_bucket_bytes``)
    (``levers``); a recomputing profile (``levers.recomputed_profile``) brings its own
    activations."""
    num_params = stage_params_held(table, layer_start, layer_end)
    holds_head = layer_end == len(table.output_bytes)
    opt_shards = zero_shards(zero_stage, dp_degree) if zero_stage else 1
    state = full_state = _state_bytes(num_params, regime, opt_shards)
    if zero_stage >= 2 and opt_shards > 1:
        state -= num_params * regime.grad_bytes_per_param
    kept_state, act, loss, work, comm = _activation_peak(table, layer_start, layer_end, num_inflight, regime,
                                                         head_logits if holds_head else 0, num_microbatches,
                                                         num_params, full_state)
    overhead = regime.constant_overhead_bytes
    temps = 0
    if regime.optimizer_temp_tensors:
        largest = largest_tensor_params(table.profile.model, table.profile.tp_degree,
                                        layer_start == 0 or holds_head)
        temps = regime.optimizer_temp_tensors * largest * regime.weight_bytes_per_param
    if opt_shards > 1 and regime.name not in BLOCKING_P2P_REGIMES:  # the engine's ZeRO (not DeepSpeed's)
        largest = largest_tensor_params(table.profile.model, table.profile.tp_degree, layer_start == 0 or holds_head)
        synced = dp_synced_params(table, layer_start, layer_end)
        temps = max(temps, zero_gather_bytes(synced, largest, regime.weight_bytes_per_param, opt_shards))
        if zero_stage >= 2:
            # the last backward's reduce-scatters: each bucket's gradients copied into a flat that
            # lives until the sync is waited, beside the full gradients (``runtime/allreduce.py``)
            temps = max(temps, (num_params + synced) * regime.grad_bytes_per_param)
    if state + temps > kept_state + act + loss + work + comm:  # the optimizer step is the peak
        return num_params, state, 0, 0, 0, overhead, 0, temps
    return num_params, kept_state, act, loss, work, overhead, comm, 0


def _state_bytes(num_params: int, regime: TrainingRegime, opt_shards: int) -> int:
    """Weights, gradients and optimizer states of ``num_params``, the optimizer states split over
    ``opt_shards`` replicas (ZeRO)."""
    if opt_shards == 1:
        return num_params * regime.state_bytes_per_param
    return (num_params * (regime.weight_bytes_per_param + regime.grad_bytes_per_param)
            + sharded(num_params, opt_shards) * regime.optimizer_bytes_per_param)


def _activation_peak(
    table: LayerTable, layer_start: int, layer_end: int, num_inflight: int, regime: TrainingRegime,
    head_logits: int, num_microbatches: int, num_params: int, state: int,
) -> tuple[int, int, int, int, int]:
    """(state, activation, loss working, backward working, p2p buffers) bytes while a stage holds
    activations.

    Gradients exist from the iteration's first backward to the optimizer step (the engine sets
    them to None after it).  When a replica has more micro-batches than it holds in flight, a
    forward runs after its first backward: K micro-batches' activations beside every gradient,
    and a later backward, as it starts, adds its first matmul's gradients to them (it frees a
    layer's activations as it goes down, so its start is its peak unless a lower layer makes
    much more: the walk below).  Otherwise all its forwards run first: the peak is in its first
    backward, which frees a layer's activations and makes its gradients layer by layer from the
    last (the layer that runs backward holds both), with the K - 1 other micro-batches'
    activations alive.
    """
    # ``num_params``: ``stage_params_held``; ``state``: their ``_state_bytes`` (the gradients in
    # full, under ZeRO-2 too), both as ``stage_memory_parts`` has them
    grad_bytes = regime.grad_bytes_per_param
    # A stage that sends keeps each micro-batch's output until its gradient comes back (no layer
    # of the stage saves it for its own backward); receive buffers: the next input's, posted a
    # step ahead, and the gradient of the stage's output (``runtime/trainer.py``, DeepSpeed's
    # pipe buffers alike).
    holds_head = layer_end == len(table.output_bytes)
    sent = 0 if holds_head else table.output_bytes[layer_end - 1]
    received = table.output_bytes[layer_start - 1] if layer_start > 0 else 0
    comm = received + sent
    act_cum, params_cum = table.act_cum, table.params_cum
    one = act_cum[layer_end] - act_cum[layer_start] + sent
    loss = regime.loss_working_bytes_per_logit * head_logits
    accumulating = num_microbatches == 0 or num_microbatches > num_inflight
    kept = state - num_params * grad_bytes
    others = (num_inflight - 1) * one
    prof = table.profile
    rework = recompute_working_bytes(prof)  # full recomputation: one block's re-run forward
    best = (-1, 0, 0, 0, 0)
    layers: Sequence[int] = range(layer_end - 1, layer_start - 1, -1)
    if accumulating:
        # Every gradient held and the blocks alike: of the blocks the highest holds the most
        # activations, so only the top layer, the block under the head and the embedding can peak.
        top = layer_end - 1
        layers = [top]
        if top == table.num_layers - 1 and top - 1 >= max(layer_start, 1):
            layers.append(top - 1)
        if layer_start == 0 and top > 0:
            layers.append(0)
    for layer in layers:
        act = others + act_cum[layer + 1] - act_cum[layer_start] + sent
        if accumulating:
            grads = num_params * grad_bytes
        else:
            grads = (num_params - (params_cum[layer] - params_cum[layer_start])) * grad_bytes
        layer_loss = loss if layer == layer_end - 1 and holds_head else 0  # the loss runs backward with the head
        work = backward_working_bytes(prof.model, prof.tp_degree, prof.micro_batch_size, prof.seq_len, layer,
                                      regime.activation_bytes_per_element, grad_bytes, accumulating)
        if rework and 0 < layer < table.num_layers - 1:
            work += rework
        if act + grads + layer_loss + work > best[0]:
            best = (act + grads + layer_loss + work, kept + grads, act, layer_loss, work)
    return best[1], best[2], best[3], best[4], comm


def stage_params_held(table: LayerTable, layer_start: int, layer_end: int) -> int:
    """Parameters one GPU holding layers [start, end) holds: its layers' and, when it holds the
    head without layer 0, a tied embedding's copy (``tied_copy_params``)."""
    num_params = table.params_cum[layer_end] - table.params_cum[layer_start]
    if layer_start > 0 and layer_end == len(table.output_bytes):
        num_params += tied_copy_params(table.profile)
    return num_params


def embedding_group_params(profile: ModelProfile) -> int:
    """Parameters of the tied matrix one GPU of ``profile``'s (GPU, TP) sums in the embedding
    group of a multi-stage plan: its copy (``tied_copy_params``, 0 under a framework that ties
    nothing across stages, whose last stage keeps what its head counts as its own)."""
    return tied_copy_params(profile)


def tied_params_summed_apart(table: LayerTable, layer_start: int, layer_end: int) -> int:
    """Parameters of a tied embedding matrix one GPU holding layers [start, end) sums in the
    embedding group instead of its stage's DP sync: layer 0's matrix on a first stage that does
    not hold the head, the copy on a last stage that does not hold layer 0 (the engine's
    ``_dp_params``); 0 for a stage holding both (one stage: no embedding group) or neither, and
    without an embedding group (``embedding_group_params``)."""
    if (layer_start == 0) == (layer_end == len(table.output_bytes)):
        return 0
    if layer_start == 0:  # layer 0's parameters include its matrix (a hand-made profile may not)
        return min(embedding_group_params(table.profile), table.params_cum[1])
    return embedding_group_params(table.profile)


def dp_synced_params(table: LayerTable, layer_start: int, layer_end: int) -> int:
    """Parameters whose gradients one GPU holding layers [start, end) sums over its stage's
    replicas: all it holds but a tied matrix the embedding group sums (``tied_params_summed_apart``)."""
    return stage_params_held(table, layer_start, layer_end) - tied_params_summed_apart(table, layer_start, layer_end)


def dp_bucket_bytes(num_params: int, regime: TrainingRegime, dp_degree: int, zero_stage: int = 0) -> int:
    """The engine's data-parallel gradient buckets for ``num_params`` (``dp_synced_params``): a flat
    copy of those gradients kept for the whole run (``runtime/trainer.py``, as DDP keeps its
    buckets), under ZeRO-2 only the replica's range of each (1/D: ``runtime/zero.py``);
    none with one replica, and none counted for DeepSpeed (Sailor's profiles: its constant
    reserve holds its buffers)."""
    if dp_degree <= 1 or regime.name in BLOCKING_P2P_REGIMES:
        return 0
    if zero_stage >= 2:
        return sharded(num_params, dp_degree) * regime.grad_bytes_per_param
    return num_params * regime.grad_bytes_per_param


def peak_inputs(num_inflight: int, num_microbatches: int, dp_degree: int, zero_stage: int) -> tuple:
    """What of these a stage's peak (``stage_peak_bytes``) and its DP buckets (``dp_bucket_bytes``)
    depend on, for one GPU's layers and regime: K in flight, whether the replica accumulates
    (``_activation_peak``: more micro-batches than K, or 0), and the DP degree where ZeRO shards
    by it, else only whether the stage has replicas (the buckets).  Equal inputs, equal peaks."""
    accumulating = num_microbatches == 0 or num_microbatches > num_inflight
    return num_inflight, accumulating, dp_degree if zero_stage else dp_degree > 1


def stage_peak_bytes(
    table: LayerTable, layer_start: int, layer_end: int, num_inflight: int, regime: TrainingRegime,
    head_logits: int, num_microbatches: int = 0, dp_degree: int = 1, zero_stage: int = 0,
) -> int:
    """``stage_memory(...).peak_bytes`` without building the breakdown (the planner's searches
    for the largest stage that fits ask for many), the DP buckets left out."""
    _, state, act, loss, work, overhead, comm, temps = stage_memory_parts(
        table, layer_start, layer_end, num_inflight, regime, head_logits, num_microbatches, dp_degree, zero_stage)
    return state + act + loss + work + comm + temps + overhead


def stage_memory(
    profile: ModelProfile,
    layer_start: int,
    layer_end: int,
    num_inflight: int,
    regime: TrainingRegime,
    capacity_bytes: int,
    dp_degree: int = 1,
    num_microbatches: int = 0,
    zero_stage: int = 0,
) -> MemoryBreakdown:
    """Memory of one GPU of ``profile``'s (GPU, TP) holding layers [start, end) with K in flight,
    in a stage of ``dp_degree`` replicas, the replica running ``num_microbatches`` (0: more than K),
    its states sharded by ``zero_stage`` (``profile`` recomputing: ``levers.recomputed_profile``)."""
    table = layer_table(profile)
    num_params, state, act, loss, work, overhead, comm, temps = stage_memory_parts(
        table, layer_start, layer_end, num_inflight, regime, profile_head_logits(profile), num_microbatches,
        dp_degree, zero_stage)
    return MemoryBreakdown(
        state_bytes=state,
        activation_bytes=act,
        loss_working_bytes=loss,
        overhead_bytes=overhead,
        num_params=num_params,
        num_inflight=num_inflight,
        capacity_bytes=capacity_bytes,
        comm_bytes=comm + dp_bucket_bytes(dp_synced_params(table, layer_start, layer_end), regime, dp_degree,
                                          zero_stage),
        optimizer_working_bytes=temps,
        backward_working_bytes=work,
    )
