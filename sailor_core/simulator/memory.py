"""Peak memory of one GPU holding a pipeline stage, from first principles.

    peak = params x state_bytes_per_param            (weights + grads + optimizer, per regime)
         + K x (activation_bytes(stage, micro-batch) (saved for backward; K micro-batches in flight)
                + output bytes)                      (a sending stage keeps its output for backward)
         + loss working memory                       (only the GPU holding the LM head)
         + communication buffers                     (receives posted ahead, DP gradient buckets)
         + constant_overhead_bytes                   (CUDA context, workspaces; per regime)

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
  replicated stage's gradients for its data-parallel all-reduce (4 B/param in fp32).
  The engine's peak tensor memory with K = 1..8 in flight on CPU matches this within
  a few percent (``benchmarks/bench_memory_inflight.py``).  A CUDA caching allocator
  rounds each tensor to 512 B (``max_memory_allocated``), which is left out: a few
  hundred tensors per micro-batch make it kilobytes.
* Loss working memory: during the backward of the cross-entropy, the fp32
  gradient of the log-probabilities and the fp32 gradient of the logits
  (N x V/t elements each) exist at once on top of the saved tensors:
  ``2 x 4 B x micro_batch x seq x ceil(V / tp)``.  It exists for one
  micro-batch at a time (the last stage runs each backward right after its
  forward), so it does not scale with K.  (The engine's vocabulary-parallel
  cross-entropy turns its saved softmax into the gradient in place, so for it
  this is an upper bound.)
* Tied embeddings: a model whose LM head is its token embedding counts that
  matrix once, in layer 0 (the head layer's parameters leave it out, as
  ``transformers``' ``num_parameters()`` does).  A stage that holds the head
  but not layer 0 holds a copy (Megatron's embedding group, the engine's too):
  ``ceil(V / tp) x embedding width`` more parameters, with their gradients and
  optimizer state (``tied_copy_params``).  A profile whose head layer already
  counts a vocabulary matrix (Sailor's OPT profiles, measured with Megatron's
  untied head) gets no copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog.models import get_model
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime
from sailor_core.simulator.compose import BLOCKING_P2P_REGIMES
from sailor_core.simulator.tables import LayerTable, layer_table

# fp32 gradient of the log-probabilities + fp32 gradient of the logits.
LOSS_GRAD_BYTES_PER_LOGIT = 2 * 4


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

    @property
    def peak_bytes(self) -> int:
        return (self.state_bytes + self.activation_bytes + self.loss_working_bytes + self.comm_bytes
                + self.overhead_bytes)

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
            "state_bytes": self.state_bytes,
            "activation_bytes": self.activation_bytes,
            "loss_working_bytes": self.loss_working_bytes,
            "comm_bytes": self.comm_bytes,
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


def loss_working_bytes(model: str, tp_degree: int, micro_batch_size: int, seq_len: int) -> int:
    vocab_rows = -(-get_model(model).vocab_size // tp_degree)
    return LOSS_GRAD_BYTES_PER_LOGIT * micro_batch_size * seq_len * vocab_rows


def head_loss_bytes(profile: ModelProfile) -> int:
    """Loss working memory of the GPU of ``profile``'s (GPU, TP) that holds the LM head."""
    return loss_working_bytes(profile.model, profile.tp_degree, profile.micro_batch_size, profile.seq_len)


def tied_copy_params(profile: ModelProfile) -> int:
    """Parameters a GPU of ``profile``'s (GPU, TP) holding the LM head but not layer 0 holds beyond
    the layers' own: its copy of a tied embedding matrix (0 for an untied model)."""
    return _tied_copy_params(profile.model, profile.tp_degree, profile.layers[-1].params)


@lru_cache(maxsize=1024)
def _tied_copy_params(model: str, tp_degree: int, head_params: int) -> int:
    spec = get_model(model)
    if not spec.tie_embeddings:
        return 0
    matrix = -(-spec.vocab_size // tp_degree) * spec.embedding_dim
    return 0 if head_params >= matrix else matrix  # a head measured untied counts its own matrix


def stage_memory_parts(
    table: LayerTable, layer_start: int, layer_end: int, num_inflight: int, regime: TrainingRegime,
    loss_bytes: int,
) -> tuple[int, int, int, int, int, int]:
    """(params, state, activation, loss working, overhead, p2p buffers) bytes of one GPU holding layers
    [start, end) with K in flight; ``loss_bytes`` is ``head_loss_bytes`` of the profile (counted
    only when the stage holds the head); params include a tied copy (``tied_copy_params``) when
    the stage holds the head without layer 0.  The memory model's arithmetic, in one place: the
    breakdown (``stage_memory``) and the planner's bare peak (``stage_peak_bytes``) both use it."""
    num_params = stage_params_held(table, layer_start, layer_end)
    holds_head = layer_end == len(table.output_bytes)
    # A stage that sends keeps each micro-batch's output until its gradient comes back (no layer
    # of the stage saves it for its own backward); receive buffers: the next input's, posted a
    # step ahead, and the gradient of the stage's output (``runtime/trainer.py``, DeepSpeed's
    # pipe buffers alike).
    sent = 0 if holds_head else table.output_bytes[layer_end - 1]
    received = table.output_bytes[layer_start - 1] if layer_start > 0 else 0
    return (
        num_params,
        num_params * regime.state_bytes_per_param,
        num_inflight * (table.act_cum[layer_end] - table.act_cum[layer_start] + sent),
        loss_bytes if holds_head else 0,
        regime.constant_overhead_bytes,
        received + sent,
    )


def stage_params_held(table: LayerTable, layer_start: int, layer_end: int) -> int:
    """Parameters one GPU holding layers [start, end) holds: its layers' and, when it holds the
    head without layer 0, a tied embedding's copy (``tied_copy_params``)."""
    num_params = table.params_cum[layer_end] - table.params_cum[layer_start]
    if layer_start > 0 and layer_end == len(table.output_bytes):
        num_params += tied_copy_params(table.profile)
    return num_params


def dp_bucket_bytes(num_params: int, regime: TrainingRegime, dp_degree: int) -> int:
    """The engine's data-parallel gradient buckets: a flat copy of the stage's gradients kept for
    the whole run (``runtime/trainer.py``, as DDP keeps its buckets); none with one replica, and
    none counted for DeepSpeed (Sailor's profiles: its constant reserve holds its buffers)."""
    if dp_degree <= 1 or regime.name in BLOCKING_P2P_REGIMES:
        return 0
    return num_params * regime.grad_bytes_per_param


def stage_peak_bytes(
    table: LayerTable, layer_start: int, layer_end: int, num_inflight: int, regime: TrainingRegime,
    loss_bytes: int,
) -> int:
    """``stage_memory(...).peak_bytes`` without building the breakdown (the planner's searches
    for the largest stage that fits ask for many)."""
    _, state, act, loss, overhead, comm = stage_memory_parts(table, layer_start, layer_end, num_inflight,
                                                             regime, loss_bytes)
    return state + act + loss + comm + overhead


def stage_memory(
    profile: ModelProfile,
    layer_start: int,
    layer_end: int,
    num_inflight: int,
    regime: TrainingRegime,
    capacity_bytes: int,
    dp_degree: int = 1,
) -> MemoryBreakdown:
    """Memory of one GPU of ``profile``'s (GPU, TP) holding layers [start, end) with K in flight,
    in a stage of ``dp_degree`` replicas."""
    table = layer_table(profile)
    holds_head = layer_end == table.num_layers
    num_params, state, act, loss, overhead, comm = stage_memory_parts(
        table, layer_start, layer_end, num_inflight, regime, head_loss_bytes(profile) if holds_head else 0)
    return MemoryBreakdown(
        state_bytes=state,
        activation_bytes=act,
        loss_working_bytes=loss,
        overhead_bytes=overhead,
        num_params=num_params,
        num_inflight=num_inflight,
        capacity_bytes=capacity_bytes,
        comm_bytes=comm + dp_bucket_bytes(num_params, regime, dp_degree),
    )
