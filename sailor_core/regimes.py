"""Training regimes: how many bytes each parameter costs and how activations are stored.

A regime is what a profile was measured under (optimizer, precision, attention
kernel, framework).  The memory model and the analytic estimator read it; a
profile carries the name of its regime so numbers from different frameworks are
never mixed silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.errors import UnknownNameError


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingRegime:
    """Precision, optimizer and framework of a training run.

    Memory of a stage per GPU = params * state_bytes_per_param + activations
    + constant_overhead_bytes.  The activation fields describe which dtype the
    tensors saved for backward have (see ``sailor_core.catalog.layers``).
    """

    name: str
    description: str
    weight_bytes_per_param: int
    grad_bytes_per_param: int
    optimizer_bytes_per_param: int
    # CUDA context, allocator slack, framework buffers: what a process holds besides the model.
    constant_overhead_bytes: int
    # dtype of the activations saved for backward (2 for bf16/fp16 compute, 4 for fp32).
    activation_bytes_per_element: int
    # dtype of the residual stream and the norm inputs (fp32 under autocast).
    residual_bytes_per_element: int
    # autocast casts an fp32 input separately for every linear that reads it and each
    # linear keeps its own copy; frameworks computing in one dtype share one tensor.
    casts_linear_inputs: bool
    # autocast keeps a compute-dtype copy of every weight alive until backward.
    weight_copy_bytes_per_param: int
    # "flash": fused attention, nothing quadratic in seq is stored;
    # "eager": the softmax probabilities (heads x seq x seq) are kept for backward.
    attention_kernel: str
    # matmul datapath: "bf16" (tensor cores), "tf32" (fp32 storage, TF32 tensor cores where the
    # GPU has them, else plain fp32) or "fp32".
    matmul_precision: str
    # bytes read + written per parameter by one optimizer step (AdamW: weight, grad, 2 moments
    # read; weight and 2 moments written).
    optimizer_traffic_bytes_per_param: int
    # What the loss holds per logit during its backward beyond the head's counted activations
    # (``catalog/layers.py``: logits and probabilities): torch's cross-entropy allocates the fp32
    # gradient of the log-probabilities and that of the logits (8 B); a cross-entropy that turns
    # its saved softmax into the gradient in place (Megatron's idea, the engine's
    # ``runtime/tp.py``) allocates none.
    loss_working_bytes_per_logit: int
    # Parameter-sized temporaries the optimizer step holds at once for one tensor: the
    # single-tensor AdamW (``foreach=False``) computes ``exp_avg_sq.sqrt() / bias_correction``
    # (two), a fused kernel none.  The step's peak is the largest tensor's.
    optimizer_temp_tensors: int
    # Whether the framework's pipeline ties a tied model's LM head to its embedding across stages:
    # the last stage holds a copy of the embedding matrix, summed with the first stage's in an
    # embedding group (Megatron's, Sailor's own engine: ``runtime/process_groups.py``).  False:
    # the last stage holds the head its pipeline module declares with a matrix of its own, or
    # none (DeepSpeed's ``PipelineModule`` without a ``TiedLayerSpec``, Sailor's OPT/Llama/GPT-Neo
    # pipes), and nothing is summed between the stages.  The one predicate behind the embedding
    # group's time (``simulator/compose.ties_embedding_across_stages``), the tied copy in memory
    # (``simulator/memory.tied_copy_params``) and an estimated head's parameters
    # (``catalog/layers.py``).
    ties_embedding_across_stages: bool = True

    @property
    def state_bytes_per_param(self) -> int:
        return self.weight_bytes_per_param + self.grad_bytes_per_param + self.optimizer_bytes_per_param


_REGIMES: dict[str, TrainingRegime] = {
    r.name: r
    for r in (
        TrainingRegime(
            name="megatron-fp32-adamw",
            description=(
                "Megatron-DeepSpeed, fp32 weights/activations (TF32 matmuls on Ampere+), AdamW, no ZeRO, "
                "no recomputation: Sailor's published profiles"
            ),
            weight_bytes_per_param=4,
            grad_bytes_per_param=4,
            # two Adam moments (8 B) plus the two extra fp32 copies DeepSpeed keeps (8 B):
            # Sailor's memory model charges 24 B per parameter in total.
            optimizer_bytes_per_param=16,
            # Sailor's validated memory check reserves about 5.06 GB for the framework.
            constant_overhead_bytes=5_060_000_000,
            activation_bytes_per_element=4,
            residual_bytes_per_element=4,
            casts_linear_inputs=False,
            weight_copy_bytes_per_param=0,
            attention_kernel="eager",
            matmul_precision="tf32",
            optimizer_traffic_bytes_per_param=28,
            # Sailor's memory rule (its validated check); DeepSpeed's fused Adam: no temporaries.
            loss_working_bytes_per_logit=8,
            optimizer_temp_tensors=0,
            # Sailor's Megatron-DeepSpeed pipes declare no TiedLayerSpec (eth-easl/sailor 494eaa5):
            # OPT's head is LayerSpec(OPTLMHeadPipe), Llama's LlamaLMHeadPipe, each a
            # ColumnParallelLinear of its own; GPT-Neo's pipe ends with a LayerNorm (no head)
            ties_embedding_across_stages=False,
        ),
        TrainingRegime(
            name="torch-bf16-autocast-adamw",
            description=(
                "PyTorch, fp32 parameters, torch.autocast(bfloat16), SDPA attention, fused AdamW: "
                "data/measurements and Sailor's own engine"
            ),
            weight_bytes_per_param=4,
            grad_bytes_per_param=4,
            optimizer_bytes_per_param=8,
            # CUDA context + cuBLAS workspaces; not visible in torch's allocated counters.
            constant_overhead_bytes=1_000_000_000,
            activation_bytes_per_element=2,
            residual_bytes_per_element=4,
            casts_linear_inputs=True,
            weight_copy_bytes_per_param=2,
            attention_kernel="flash",
            matmul_precision="bf16",
            optimizer_traffic_bytes_per_param=28,
            # data/measurements were taken with transformers' loss (torch's cross-entropy): the
            # fp32 gradients of the log-probabilities and of the logits (8 B) beside the bf16
            # logits the output references while that micro-batch's loss runs (2 B; autograd
            # saves only the fp32 log-softmax, catalog/layers.py); for the engine's in-place
            # cross-entropy on a GPU this is an upper bound (docs/simulator.md).
            loss_working_bytes_per_logit=10,
            optimizer_temp_tensors=0,  # AdamW(fused=True) on CUDA (runtime/trainer.make_optimizer)
        ),
        TrainingRegime(
            name="torch-fp32-adamw",
            description=(
                "Sailor's engine on CPU: PyTorch fp32 throughout (no autocast), SDPA attention, "
                "AdamW (foreach=False), gloo; what `sailor profile --device cpu` measures"
            ),
            weight_bytes_per_param=4,
            grad_bytes_per_param=4,
            optimizer_bytes_per_param=8,
            # RSS of a worker with torch + gloo initialised after it trained a few steps of a tiny
            # model (1 intra-op thread), measured by sailor_core.profiler.overhead on a 2-core x86
            # VM: ~0.42 GB (a third of it shared-library code).
            constant_overhead_bytes=420_000_000,
            activation_bytes_per_element=4,
            residual_bytes_per_element=4,
            casts_linear_inputs=False,
            weight_copy_bytes_per_param=0,
            attention_kernel="flash",
            matmul_precision="fp32",
            optimizer_traffic_bytes_per_param=28,
            loss_working_bytes_per_logit=0,  # the engine's vocabulary-parallel cross-entropy
            optimizer_temp_tensors=2,  # AdamW(foreach=False) on CPU (runtime/trainer.make_optimizer)
        ),
    )
}

DEFAULT_REGIME = "torch-bf16-autocast-adamw"


def regime_names() -> list[str]:
    return list(_REGIMES)


def get_regime(name: str) -> TrainingRegime:
    hit = _REGIMES.get(name)  # a profile's regime name is already the table's (hot in the planner)
    if hit is not None:
        return hit
    try:
        return _REGIMES[str(name).strip().lower()]
    except KeyError:
        raise UnknownNameError(f"unknown training regime {name!r}; known: {', '.join(_REGIMES)}") from None


def register_regime(regime: TrainingRegime) -> None:
    """Add a regime (e.g. from a user's profile) to the in-process table."""
    _REGIMES[regime.name] = regime
