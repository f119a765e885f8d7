"""Per-layer sizes of a model from its architecture: parameters, FLOPs, activation and output bytes.

Layer indices follow Sailor: 0 is the embedding, 1..L the transformer blocks, L+1 the final
norm + LM head + loss.  Every figure is for ONE GPU holding its tensor-parallel shard
(Megatron-style: column-parallel QKV/FC1, row-parallel out-proj/FC2, vocab-parallel embedding
and head; norms, position embeddings and row-parallel biases replicated; no sequence parallel).

Notation: h hidden, f FFN width, a heads, g KV heads, d head dim (h/a unless the config says), kv = g*d, V vocab,
s sequence length, t the TP degree, P the max positions, e the OPT-350m embedding projection width.

Parameters (whole layer, t = 1):
  * OPT embedding   V*e' + (P+2)*h + [e*h]          (e' = e if projected else h; OPT offsets positions by 2)
  * GPT-Neo embed.  V*h + P*h
  * LLaMA embed.    V*h
  * OPT block       4h^2 + 4h (attention) + 2h*f + f + h (MLP) + 4h (two LayerNorms)
  * GPT-Neo block   3h^2 (QKV, no bias) + h^2 + h (out) + 2h*f + f + h + 4h
  * LLaMA block     2h*a*d + 2h*kv (attention) + 3h*f (gated MLP) + 2h (RMSNorms); the other
                    Llama-style families add a*d + 2kv (Qwen2's q/k/v biases), 2d (q/k norms: Qwen3,
                    Gemma 3), 2h (Gemma's post norms)
  * head            final norm (2h LayerNorm / h RMSNorm; none for post-LN OPT) + [h*e out-proj]
                    + V*e' unless the head is tied to the embedding (then the matrix is counted once,
                    in the embedding, as transformers' num_parameters(); the head still reads it:
                    ``params_read``; a pipeline stage holding the head without the embedding holds a
                    copy, which the memory model adds: sailor_core/simulator/memory.py).  Under a
                    regime whose pipeline ties nothing across stages (DeepSpeed's: Sailor's OPT and
                    Llama pipes declare a head of their own) the head counts V*e' of its own.
  Sharded: matmul weights and their column-parallel biases / t, vocab rows ceil(V/t);
  KV heads g/t per GPU (TP divides them, as the engine needs: catalog.models.tp_split_problem).

Forward FLOPs per token (per GPU): 2 x (matmul weights of the shard) plus attention
  2 * 2 * s_eff * (a/t)*d for Q K^T and P V, where s_eff = s/2 for a fused causal kernel
  (masked tiles are skipped) and s for eager attention (the full square is computed).  A local
  (sliding-window) block whose window w is shorter than s runs with an explicit band mask, which
  no kernel the engine uses skips tiles of: s_eff = s under every kernel (the engine runs a
  window w >= s as plain causal attention, so that block costs as a global one).  Attention
  soft-capping (Gemma 2) is eager attention under every regime (s_eff = s, probabilities kept).
  Backward is 2x forward (input and weight gradients).

Activation bytes kept for backward, per sequence, counted from the tensors autograd saves
(r = residual/norm dtype bytes, c = activation dtype bytes; per token):
  * norm inputs                          2 * h * r; an RMSNorm (LLaMA family) 2 * 2 * h * r: both
                                         transformers' and F.rms_norm keep its input and the
                                         normalised fp32 tensor the weight multiplies (measured on
                                         CPU, issue 35: Llama-3.2-1B 154.70 MB per block at seq 256)
  * linear inputs: attention in          h * c, or 3*h*c when autocast casts the fp32 norm output
                                         separately for each of Q, K, V (each linear keeps its copy)
                   MLP in                h * c  (x2 for gate/up under autocast)
  * Q, K, V                              (h + 2*kv)/t * c
  * attention output (out-proj input)    h/t * c
  * softmax probabilities (eager only)   (a/t) * s * c;  fused kernels keep a logsumexp (a/t)*4
  * MLP: ReLU keeps its output f/t*c (shared with FC2's input); GELU its input as well 2f/t*c;
    SwiGLU gate, up, silu(gate), product 4f/t*c
  plus, per micro-batch and independent of its size, the compute-dtype copies of the weights
  autocast makes (regime.weight_copy_bytes_per_param x params).
  Embedding: token ids 8 B/token (+ the projection input e*c for OPT-350m; + RoPE's cos and sin,
  2*d*r, made once per micro-batch and kept by every block's rotation, LLaMA family).
  Head: norm input h*r (post-LN OPT-350m, no final norm: project_out's cast input h*c) + head
  input e*c + fp32 log-softmax V/t*4; the bf16 logits are not saved by autograd (the cast to fp32
  keeps nothing) and live only while the model's output references them, i.e. while that
  micro-batch's loss runs: the regime's loss working memory, not once per micro-batch in flight
  (measured, issue 35: transformers' OPT-350m under CPU autocast saves 33.575 MB per block and
  106.1 MB for embedding + head at seq 256, these formulas 33.571 and 106.1).
  (fp32 regimes: logits and probabilities, 2 * V/t * 4).

Output bytes per sequence (sent to the next stage): s*h*r for the embedding and the blocks
(the residual stream); 0 for the last index (nothing follows it).

Forward kernel launches: embedding 2 (+1 projection), block 20 (two norms, Q/K/V/out and two MLP
matmuls, attention, bias/activation/residual element-wise ops, dtype casts), head 6 (norm,
matmul, log-softmax, loss); backward launches about twice as many.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from sailor_core.catalog.models import ModelSpec, get_model, tp_split_problem
from sailor_core.errors import InputError
from sailor_core.regimes import DEFAULT_REGIME, TrainingRegime, get_regime

_TOKEN_ID_BYTES = 8
_LOGSUMEXP_BYTES = 4
_EMBEDDING_KERNELS = 2
BLOCK_KERNELS = 20
_HEAD_KERNELS = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerShape:
    """Sizes of one layer index on one GPU of a TP group."""

    index: int
    kind: str  # "embedding", "block" or "head"
    params: int  # held by one GPU (its TP shard)
    params_read: int  # read by its kernels per pass: params, plus the embedding matrix a tied head uses
    fwd_flops_per_token: float  # on one GPU
    activation_bytes_per_seq: int  # saved for backward, grows with the micro-batch
    activation_bytes_fixed: int  # per micro-batch whatever its size (autocast weight copies)
    output_bytes_per_seq: int  # sent to the next stage
    # written and read by the forward but not saved for backward (the head's bf16 logits): memory
    # traffic for the time estimate, not memory in flight
    unsaved_bytes_per_seq: int = 0
    # forward kernel launches (order of magnitude, from the layer's operators): what a layer costs
    # at least when the GPU waits for the CPU to issue work
    num_kernels: int = 1

    def activation_bytes(self, micro_batch_size: int) -> int:
        return self.activation_bytes_per_seq * micro_batch_size + self.activation_bytes_fixed

    def traffic_bytes(self, micro_batch_size: int) -> int:
        """The activation bytes the forward moves: what it saves and what it makes and drops."""
        return self.activation_bytes(micro_batch_size) + self.unsaved_bytes_per_seq * micro_batch_size

    def output_bytes(self, micro_batch_size: int) -> int:
        return self.output_bytes_per_seq * micro_batch_size

    def fwd_flops(self, micro_batch_size: int, seq_len: int) -> float:
        return self.fwd_flops_per_token * micro_batch_size * seq_len


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check(spec: ModelSpec, tp_degree: int, seq_len: int) -> None:
    problem = tp_split_problem(spec, tp_degree)
    if problem:
        raise InputError(problem)
    if seq_len < 1:
        raise InputError(f"sequence length must be >= 1, got {seq_len}")


def _embedding(spec: ModelSpec, t: int, s: int, regime: TrainingRegime) -> LayerShape:
    h, v = spec.hidden_size, spec.vocab_size
    e = spec.word_embed_proj_dim or h
    c = regime.activation_bytes_per_element
    vocab_rows = _ceil_div(v, t)
    params = vocab_rows * e
    flops = 0.0
    act = _TOKEN_ID_BYTES
    if spec.family == "opt":
        params += (spec.max_position_embeddings + 2) * h
    elif spec.family == "gptneo":
        params += spec.max_position_embeddings * h
    if spec.is_llama:
        act += 2 * spec.head_dim * regime.residual_bytes_per_element  # RoPE's cos and sin, which every block's rotation keeps
    if spec.word_embed_proj_dim:
        params += e * h  # project_in, replicated
        flops += 2.0 * e * h
        act += e * c
    return LayerShape(
        index=0,
        kind="embedding",
        params=params,
        params_read=params,
        fwd_flops_per_token=flops,
        activation_bytes_per_seq=act * s,
        activation_bytes_fixed=regime.weight_copy_bytes_per_param * (e * h if spec.word_embed_proj_dim else 0),
        output_bytes_per_seq=s * h * regime.residual_bytes_per_element,
        num_kernels=_EMBEDDING_KERNELS + (1 if spec.word_embed_proj_dim else 0),
    )


def _norm_saved(spec: ModelSpec) -> int:
    """Tensors of the hidden width a norm saves for backward: a LayerNorm its input (its mean and
    rstd are per token), an RMSNorm its input and the normalised tensor."""
    return 2 if spec.is_llama else 1


def _attention_span(spec: ModelSpec, index: int, s: int, eager: bool) -> float:
    """s_eff of block ``index``: the keys per query its attention kernel computes."""
    if eager or (spec.attention_kind(index) == "local" and spec.attention_window < s):
        return float(s)
    return s / 2


def _attention_core(spec: ModelSpec, t: int, s: int, regime: TrainingRegime, index: int) -> tuple[int, float]:
    """(bytes per token the attention core alone saves for backward, its forward FLOPs per token)
    of block ``index`` on one GPU: the softmax probabilities (eager) or the fused kernel's
    logsumexp, and Q K^T plus P V.  What selective recomputation drops and re-runs
    (``simulator/levers.py``); Q, K, V and the context stay saved by the linears around it."""
    # attention soft-capping (Gemma 2) runs eager attention in the engine whatever the regime
    eager = regime.attention_kernel == "eager" or spec.attn_logit_softcap is not None
    heads = spec.num_heads // t
    s_eff = _attention_span(spec, index, s, eager)
    q = heads * spec.head_dim
    return (heads * s * regime.activation_bytes_per_element if eager else heads * _LOGSUMEXP_BYTES), 4.0 * s_eff * q


def attention_core(model: str, *, tp_degree: int, seq_len: int, regime: TrainingRegime | str,
                   index: int) -> tuple[int, float]:
    """``_attention_core`` of block ``index`` of a catalog model: (saved bytes per sequence,
    forward FLOPs per token)."""
    spec = get_model(model)
    reg = regime if isinstance(regime, TrainingRegime) else get_regime(regime)
    per_token, flops = _attention_core(spec, int(tp_degree), int(seq_len), reg, index)
    return per_token * int(seq_len), flops


def _block(spec: ModelSpec, t: int, s: int, regime: TrainingRegime, index: int) -> LayerShape:
    h, f, a, d = spec.hidden_size, spec.ffn_size, spec.num_heads, spec.head_dim
    kv = _ceil_div(spec.num_kv_heads, t) * d  # per GPU
    q = (a // t) * d  # per GPU: the query width (h / t when d = h / a)
    fs = _ceil_div(f, t)
    c, r = regime.activation_bytes_per_element, regime.residual_bytes_per_element
    if spec.is_llama:
        matmul = h * q + 2 * h * kv + q * h + 3 * h * fs
        params = (matmul + 2 * h + (q + 2 * kv if spec.qkv_bias else 0) + (2 * d if spec.qk_norm else 0)
                  + (2 * h if spec.post_norms else 0))
        mlp_saved, mlp_inputs = 4 * fs, 2
    else:
        qkv_bias = 0 if spec.family == "gptneo" else q + 2 * kv
        matmul = h * q + 2 * h * kv + q * h + 2 * h * fs
        params = matmul + qkv_bias + h + fs + h + 4 * h  # biases: QKV, out, fc1, fc2; two LayerNorms
        mlp_saved = fs if spec.family == "opt" else 2 * fs  # ReLU keeps one tensor, GELU two
        mlp_inputs = 1
    core_saved, core_flops = _attention_core(spec, t, s, regime, index)
    flops = 2.0 * matmul + core_flops
    attn_in = 3 if regime.casts_linear_inputs else 1
    mlp_in = mlp_inputs if regime.casts_linear_inputs else 1
    per_token = (
        2 * _norm_saved(spec) * h * r
        + (attn_in + mlp_in) * h * c
        + (q + 2 * kv) * c
        + q * c
        + mlp_saved * c
        + core_saved
    )
    return LayerShape(
        index=index,
        kind="block",
        params=params,
        params_read=params,
        fwd_flops_per_token=flops,
        activation_bytes_per_seq=per_token * s,
        activation_bytes_fixed=regime.weight_copy_bytes_per_param * matmul,
        output_bytes_per_seq=s * h * r,
        num_kernels=BLOCK_KERNELS,
    )


def _head(spec: ModelSpec, t: int, s: int, regime: TrainingRegime, index: int) -> LayerShape:
    h, v = spec.hidden_size, spec.vocab_size
    e = spec.word_embed_proj_dim or h
    c, r = regime.activation_bytes_per_element, regime.residual_bytes_per_element
    vocab_rows = _ceil_div(v, t)
    matmul = vocab_rows * e
    # a framework that ties nothing across stages (DeepSpeed's pipes) gives the head a matrix of
    # its own whatever the config says (``TrainingRegime.ties_embedding_across_stages``)
    tied = spec.tie_embeddings and regime.ties_embedding_across_stages
    params = 0 if tied else matmul
    if spec.pre_norm:
        params += h if spec.is_llama else 2 * h
    if spec.word_embed_proj_dim:
        matmul += h * e  # project_out, replicated
        params += h * e
    unsaved = 0
    if regime.casts_linear_inputs:
        # only the fp32 log-softmax is saved: the bf16 logits live while the loss runs (the
        # model's output references them), the regime's loss working memory, once per stage
        logits = vocab_rows * 4
        unsaved = vocab_rows * c
    else:
        logits = vocab_rows * 2 * regime.activation_bytes_per_element
    # a final norm keeps its residual-dtype input; post-LN OPT-350m has none, and its
    # project_out keeps the compute-dtype cast of the residual (reading the residual itself)
    head_in = _norm_saved(spec) * r if spec.pre_norm else c
    if not spec.pre_norm:
        unsaved += h * (r - c)
    per_token = h * head_in + e * c + logits
    return LayerShape(
        index=index,
        kind="head",
        params=params,
        params_read=params + (vocab_rows * e if tied else 0),
        fwd_flops_per_token=2.0 * matmul,
        activation_bytes_per_seq=per_token * s,
        activation_bytes_fixed=regime.weight_copy_bytes_per_param * matmul,
        output_bytes_per_seq=0,
        unsaved_bytes_per_seq=unsaved * s,
        num_kernels=_HEAD_KERNELS,
    )


@lru_cache(maxsize=512)
def _layer_shapes(model: str, tp_degree: int, seq_len: int, regime_name: str) -> tuple[LayerShape, ...]:
    spec = get_model(model)
    regime = get_regime(regime_name)
    _check(spec, tp_degree, seq_len)
    emb = _embedding(spec, tp_degree, seq_len, regime)
    by_kind: dict[str, LayerShape] = {}  # the blocks of one attention kind are alike
    for i in range(1, spec.num_layers + 1):
        by_kind.setdefault(spec.attention_kind(i), _block(spec, tp_degree, seq_len, regime, i))
    blocks = [replace(by_kind[spec.attention_kind(i)], index=i) for i in range(1, spec.num_layers + 1)]
    head = _head(spec, tp_degree, seq_len, regime, spec.num_layers + 1)
    return (emb, *blocks, head)


def layer_shapes(
    model: ModelSpec | str,
    *,
    tp_degree: int = 1,
    seq_len: int | None = None,
    regime: TrainingRegime | str = DEFAULT_REGIME,
) -> tuple[LayerShape, ...]:
    """Sizes of every layer index 0..L+1 on one GPU of a ``tp_degree``-way TP group (cached)."""
    name = model.name if isinstance(model, ModelSpec) else get_model(model).name
    seq = int(seq_len) if seq_len is not None else get_model(name).seq_len
    regime_name = regime.name if isinstance(regime, TrainingRegime) else get_regime(regime).name
    return _layer_shapes(name, int(tp_degree), seq, regime_name)


def total_params(model: ModelSpec | str, *, tp_degree: int = 1) -> int:
    """Parameters of the whole model held by one GPU of each TP group (t = 1: the model's size)."""
    return sum(layer.params for layer in layer_shapes(model, tp_degree=tp_degree, seq_len=1))
