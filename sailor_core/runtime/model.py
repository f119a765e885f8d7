"""Decoder-only models split by Sailor's layer indices, with Megatron TP inside a layer.

Layer index 0 is the embedding, 1..L the transformer blocks, L+1 the final
norm + LM head + loss (DESIGN.md).  Each index is its own module, built by
``build_layer`` on its own (the profiler times layers one by one).

Every parameter is defined by its FULL (logical) shape and a shard dimension
(``None``: replicated on every TP rank).  Initial values are a pure function
of (seed, layer index, parameter name) on the full shape, then sliced, so any
split into stages and any TP degree start from the same model, and a
checkpoint of full tensors loads under any other split.

The families are Hugging Face ``transformers``' models, computed the same way
(``tests/runtime/test_hf_parity.py`` checks logits against them):

* ``opt`` (``OPTForCausalLM``): learned positions with OPT's offset of 2, an
  optional projection in and out (``word_embed_proj_dim``, opt-350m), LayerNorm
  before (or after, opt-350m: then no final norm) each sublayer, ReLU MLP, biases.
* ``gptneo`` (``GPTNeoForCausalLM``): learned positions, no biases on Q/K/V, unscaled
  attention scores, ``gelu_new`` (GELU's tanh form), and blocks that alternate
  global and local attention (a window of the ``attention_window`` latest positions).
* ``llama`` (``LlamaForCausalLM``): RMSNorm, RoPE with the config's theta and Llama 3
  frequency scaling, grouped-query attention, SwiGLU, no biases.  The other Llama-style
  families are this block with ModelSpec's features switched on: q/k/v biases (Qwen2), q/k
  RMSNorm per head (Qwen3, Gemma 3; replicated on TP ranks, their gradient summed over the
  ranks' heads by ``copy_to_tp``), a head size other than hidden / heads, sliding-window layers
  (Mistral, Phi-3, Qwen2, Gemma: the ``local`` mask), GeGLU, Gemma's (1 + weight) RMSNorm, post
  norms, scaled embeddings, query_pre_attn_scalar and attention / final logit soft-capping
  (elementwise, so applied to each rank's own heads / vocabulary shard), and a separate RoPE
  theta for local layers (Gemma 3).  Phi-3's fused qkv and gate/up weights are split on import.

Embedding and LM head are vocabulary-parallel: TP rank r holds rows
``shard_range(V, t, r)`` and the loss never gathers the full logits
(``runtime/tp.py``).  A model that ties them (``ModelSpec.tie_embeddings``) has
one matrix, ``tok`` of layer 0: a stage holding both layer 0 and L+1 shares it;
a last stage without layer 0 holds a copy, also named ``tok`` and listed in the
head's ``tied`` (initialised as layer 0's, its gradient summed with the
embedding's every step by the trainer's embedding group, never checkpointed).
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from sailor_core.catalog.models import ModelSpec, RopeScaling, get_model, tp_split_problem
from sailor_core.errors import PlanError
from sailor_core.plan.types import RECOMPUTE_FULL, RECOMPUTE_MODES, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from sailor_core.runtime.tp import (copy_to_tp, gather_shards, reduce_from_tp, shard_range,
                                    vocab_parallel_cross_entropy, vocab_parallel_embedding)

INIT_STD = 0.02
OPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: position p is row p + 2
TIED = "tok"  # the token embedding; the LM head of a tied model


def check_tp_degree(spec: ModelSpec, tp_degree: int) -> None:
    """TP must split heads, KV heads and the FFN evenly (``catalog.models.tp_split_problem``)."""
    problem = tp_split_problem(spec, tp_degree)
    if problem:
        raise PlanError(problem)


def check_plan_for_engine(plan) -> None:
    """What the engine needs beyond plan validation: TP splits evenly; learned positions cover the
    sequence; all-CPU or all-GPU."""
    spec = get_model(plan.model)
    for stage in plan.stages:
        for rep in stage.replicas:
            check_tp_degree(spec, rep.tp_degree)
    if not spec.is_llama and plan.effective_seq_len() > spec.max_position_embeddings:
        raise PlanError(f"sequence length {plan.effective_seq_len()} exceeds {spec.name}'s "
                        f"{spec.max_position_embeddings} learned positions")
    kinds = {rep.gpu == "cpu" for stage in plan.stages for rep in stage.replicas}
    if len(kinds) > 1:
        raise PlanError("the engine runs a plan entirely on CPUs or entirely on GPUs, not both")


def _seed_for(seed: int, layer_index: int, name: str) -> int:
    return zlib.crc32(f"{seed}/{layer_index}/{name}".encode())


class ShardedLayer(nn.Module):
    """A layer whose parameters are TP shards of full tensors with known shard dims."""

    def __init__(self, layer_index: int, tp_degree: int, tp_rank: int, tp_group) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.tp_degree = tp_degree
        self.tp_rank = tp_rank
        self.tp_group = tp_group if tp_degree > 1 else None
        self.shard_dims: dict[str, int | None] = {}
        self.full_shapes: dict[str, tuple[int, ...]] = {}
        self.tied: frozenset[str] = frozenset()  # copies of layer 0's parameters (a tied head)

    def _add(self, name: str, full_shape: tuple[int, ...], shard_dim: int | None,
             init: str, seed: int, *, init_layer: int | None = None) -> None:
        """``init_layer``: draw the initial values as that layer's parameter of this name does."""
        layer = self.layer_index if init_layer is None else init_layer
        full = _init_full(_seed_for(seed, layer, name), full_shape, init)
        self.shard_dims[name] = shard_dim
        self.full_shapes[name] = tuple(full_shape)
        self.register_parameter(name, nn.Parameter(self.shard(name, full)))

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full tensor of parameter ``name``."""
        dim = self.shard_dims[name]
        if dim is None or self.tp_degree == 1:
            return full.clone()
        start, end = shard_range(full.shape[dim], self.tp_degree, self.tp_rank)
        return full.narrow(dim, start, end - start).clone()

    def gather(self, name: str, shard: torch.Tensor) -> torch.Tensor:
        """The full tensor of parameter ``name`` from every TP rank's ``shard`` (a collective)."""
        dim = self.shard_dims[name]
        if dim is None:
            return shard.detach().clone()
        return gather_shards(shard, dim, self.full_shapes[name][dim], self.tp_degree, self.tp_group).clone()

    def own_parameters(self):
        """(name, parameter) of this layer's own parameters: not the copies of layer 0's."""
        return [(n, p) for n, p in self.named_parameters(recurse=False) if n not in self.tied]


def _init_full(seed: int, shape, init: str) -> torch.Tensor:
    if init == "zeros":
        return torch.zeros(shape)
    if init == "ones":
        return torch.ones(shape)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * INIT_STD


def _norm(spec: ModelSpec) -> Callable:
    if spec.is_llama and spec.norm_unit_offset:  # Gemma: x / rms(x) * (1 + w)
        return lambda x, w, b=None: F.rms_norm(x, (x.shape[-1],), 1.0 + w, eps=spec.norm_eps)
    if spec.is_llama:
        return lambda x, w, b=None: F.rms_norm(x, (x.shape[-1],), w, eps=spec.norm_eps)
    return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=spec.norm_eps)


def _norm_init(spec: ModelSpec) -> str:
    return "zeros" if spec.norm_unit_offset else "ones"


def _softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


def _vocab_start(spec: ModelSpec, layer: ShardedLayer) -> int:
    return shard_range(spec.vocab_size, layer.tp_degree, layer.tp_rank)[0]


class Embedding(ShardedLayer):
    """Layer 0: vocabulary-parallel token embedding, optional projection in (opt-350m), learned
    positions (OPT: offset by 2; GPT-Neo)."""

    def __init__(self, spec: ModelSpec, tp_degree=1, tp_rank=0, tp_group=None, seed=0):
        super().__init__(0, tp_degree, tp_rank, tp_group)
        self.spec = spec
        h = spec.hidden_size
        self._add(TIED, (spec.vocab_size, spec.embedding_dim), 0, "normal", seed)
        self.position_offset = OPT_POSITION_OFFSET if spec.family == "opt" else 0
        if not spec.is_llama:
            self._add("pos", (spec.max_position_embeddings + self.position_offset, h), None, "normal", seed)
        if spec.word_embed_proj_dim:
            self._add("proj_in", (h, spec.embedding_dim), None, "normal", seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = vocab_parallel_embedding(tokens, self.tok, _vocab_start(self.spec, self), self.tp_group,
                                     self.spec.pad_token_id)
        if self.spec.word_embed_proj_dim:
            x = F.linear(x, self.proj_in)
        if self.spec.scale_embeddings:  # as Gemma: sqrt(hidden) as a tensor of the weights' dtype
            x = x * torch.tensor(self.spec.hidden_size ** 0.5, dtype=self.tok.dtype)
        if not self.spec.is_llama:
            x = x + self.pos[self.position_offset: self.position_offset + tokens.shape[1]]
        return x


@functools.lru_cache(maxsize=16)
def _inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """RoPE inverse frequencies, Llama 3 scaled when asked (as ``transformers``' rope utils)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rope(x: torch.Tensor, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Rotary embedding (rotate-half form, Hugging Face's weight layout) on [batch, heads, seq, head_dim]."""
    seq, hd = x.shape[-2], x.shape[-1]
    inv = _inv_freq(hd, theta, scaling).to(x.device)
    ang = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@functools.lru_cache(maxsize=8)
def _local_mask(seq: int, window: int, device) -> torch.Tensor:
    """True where query i may attend key j: i - window < j <= i (GPT-Neo's local layers)."""
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    return (j <= i) & (j > i - window)


class Block(ShardedLayer):
    """Layers 1..L: attention + MLP; QKV and FFN-in column-parallel, out projections row-parallel."""

    def __init__(self, spec: ModelSpec, layer_index: int, tp_degree=1, tp_rank=0, tp_group=None,
                 seed=0):
        super().__init__(layer_index, tp_degree, tp_rank, tp_group)
        check_tp_degree(spec, tp_degree)
        self.spec = spec
        self.local = spec.attention_kind(layer_index) == "local"
        self.recompute_core = False  # selective recomputation (StageModel sets it)
        h, hd, f = spec.hidden_size, spec.head_dim, spec.ffn_size
        nh, nkv = spec.num_heads, spec.num_kv_heads
        self.local_heads, self.local_kv_heads = nh // tp_degree, nkv // tp_degree
        biases = not spec.is_llama
        norm_init = _norm_init(spec)
        self._add("norm1_w", (h,), None, norm_init, seed)
        if biases:
            self._add("norm1_b", (h,), None, "zeros", seed)
        self._add("q_w", (nh * hd, h), 0, "normal", seed)
        self._add("k_w", (nkv * hd, h), 0, "normal", seed)
        self._add("v_w", (nkv * hd, h), 0, "normal", seed)
        self._add("o_w", (h, nh * hd), 1, "normal", seed)
        if spec.family == "opt" or spec.qkv_bias:
            self._add("q_b", (nh * hd,), 0, "zeros", seed)
            self._add("k_b", (nkv * hd,), 0, "zeros", seed)
            self._add("v_b", (nkv * hd,), 0, "zeros", seed)
        if spec.qk_norm:
            self._add("q_norm_w", (hd,), None, norm_init, seed)
            self._add("k_norm_w", (hd,), None, norm_init, seed)
        if biases:
            self._add("o_b", (h,), None, "zeros", seed)
        self._add("norm2_w", (h,), None, norm_init, seed)
        if spec.post_norms:
            self._add("attn_post_w", (h,), None, norm_init, seed)
            self._add("mlp_post_w", (h,), None, norm_init, seed)
        if biases:
            self._add("norm2_b", (h,), None, "zeros", seed)
        if spec.is_llama:
            self._add("gate_w", (f, h), 0, "normal", seed)
        self._add("up_w", (f, h), 0, "normal", seed)
        self._add("down_w", (h, f), 1, "normal", seed)
        if biases:
            self._add("up_b", (f,), 0, "zeros", seed)
            self._add("down_b", (h,), None, "zeros", seed)

    def _p(self, name):
        return getattr(self, name, None)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.spec.head_dim
        x = copy_to_tp(x, self.tp_group)
        q = F.linear(x, self.q_w, self._p("q_b")).view(b, s, self.local_heads, hd).transpose(1, 2)
        k = F.linear(x, self.k_w, self._p("k_b")).view(b, s, self.local_kv_heads, hd).transpose(1, 2)
        v = F.linear(x, self.v_w, self._p("v_b")).view(b, s, self.local_kv_heads, hd).transpose(1, 2)
        if self.spec.qk_norm:  # replicated weights seeing this rank's heads: gradients summed over TP
            norm = _norm(self.spec)
            q = norm(q, copy_to_tp(self.q_norm_w, self.tp_group))
            k = norm(k, copy_to_tp(self.k_norm_w, self.tp_group))
        if self.spec.is_llama:
            local_theta = self.spec.rope_local_theta if self.local else None
            theta, scaling = (local_theta, None) if local_theta else (self.spec.rope_theta, self.spec.rope_scaling)
            q, k = _rope(q, theta, scaling), _rope(k, theta, scaling)
        if self.local_kv_heads != self.local_heads:
            rep = self.local_heads // self.local_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.recompute_core and torch.is_grad_enabled():
            # Megatron's selective recomputation: keep q, k, v, drop the core's scores and
            # probabilities, re-run it in backward (no collective inside, so TP needs nothing)
            y = checkpoint(self._scores_to_output, q, k, v, x.device, use_reentrant=False)
        else:
            y = self._scores_to_output(q, k, v, x.device)
        y = F.linear(y.transpose(1, 2).reshape(b, s, self.local_heads * hd), self.o_w)
        y = reduce_from_tp(y, self.tp_group)
        return y if self._p("o_b") is None else y + self.o_b

    def _scores_to_output(self, q, k, v, device) -> torch.Tensor:
        """softmax(scale * q k^T (soft-capped), causal or local mask) v; eager when soft-capped."""
        spec, s = self.spec, q.shape[-2]
        scale = 1.0 if spec.family == "gptneo" else None  # GPT-Neo does not scale its scores
        if spec.query_pre_attn_scalar is not None:
            scale = spec.query_pre_attn_scalar ** -0.5
        # a window at least the sequence is plain causal attention (the fused kernels skip masked tiles)
        mask = _local_mask(s, spec.attention_window, device) if self.local and spec.attention_window < s else None
        if spec.attn_logit_softcap is not None:
            scores = _softcap(torch.matmul(q, k.transpose(2, 3)) * (scale or q.shape[-1] ** -0.5),
                              spec.attn_logit_softcap)
            allowed = mask if mask is not None else _local_mask(s, s, device)
            scores = scores.masked_fill(~allowed, float("-inf"))
            return torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp_group)
        if self.spec.is_llama:
            gate = F.linear(x, self.gate_w)
            gate = F.silu(gate) if self.spec.mlp_activation == "silu" else F.gelu(gate, approximate="tanh")
            y = gate * F.linear(x, self.up_w)
        else:
            y = F.linear(x, self.up_w, self.up_b)
            y = F.gelu(y, approximate="tanh") if self.spec.family == "gptneo" else F.relu(y)
        y = reduce_from_tp(F.linear(y, self.down_w), self.tp_group)
        return y if self._p("down_b") is None else y + self.down_b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = _norm(self.spec)
        n1 = lambda t: norm(t, self.norm1_w, self._p("norm1_b"))  # noqa: E731
        n2 = lambda t: norm(t, self.norm2_w, self._p("norm2_b"))  # noqa: E731
        if self.spec.pre_norm:
            post = (lambda t, w: norm(t, w)) if self.spec.post_norms else (lambda t, w: t)  # noqa: E731
            x = x + post(self._attention(n1(x)), self._p("attn_post_w"))
            return x + post(self._mlp(n2(x)), self._p("mlp_post_w"))
        x = n1(x + self._attention(x))
        return n2(x + self._mlp(x))


class Head(ShardedLayer):
    """Layer L+1: final norm, optional projection out, vocabulary-parallel LM head and mean token
    cross-entropy (or, without labels, the full logits).

    ``embedding``: layer 0 of the same stage, whose matrix a tied head uses; without it a tied
    head holds its own copy (``tied``)."""

    def __init__(self, spec: ModelSpec, tp_degree=1, tp_rank=0, tp_group=None, seed=0,
                 embedding: Embedding | None = None):
        super().__init__(spec.num_layers + 1, tp_degree, tp_rank, tp_group)
        self.spec = spec
        h = spec.hidden_size
        if spec.pre_norm:
            self._add("norm_w", (h,), None, _norm_init(spec), seed)
            if not spec.is_llama:
                self._add("norm_b", (h,), None, "zeros", seed)
        if spec.word_embed_proj_dim:
            self._add("proj_out", (spec.embedding_dim, h), None, "normal", seed)
        self._shared = (embedding,) if spec.tie_embeddings and embedding is not None else ()  # not a submodule
        if not spec.tie_embeddings:
            self._add("lm_w", (spec.vocab_size, spec.embedding_dim), 0, "normal", seed)
        elif not self._shared:
            self._add(TIED, (spec.vocab_size, spec.embedding_dim), 0, "normal", seed, init_layer=0)
            self.tied = frozenset({TIED})

    def lm_weight(self) -> torch.Tensor:
        if self._shared:
            return self._shared[0].tok
        return self.tok if self.spec.tie_embeddings else self.lm_w

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.spec.pre_norm:
            x = _norm(self.spec)(x, self.norm_w, getattr(self, "norm_b", None))
        if self.spec.word_embed_proj_dim:
            x = F.linear(x, self.proj_out)
        logits = _softcap(F.linear(copy_to_tp(x, self.tp_group), self.lm_weight()), self.spec.final_logit_softcap)
        if labels is None:
            return gather_shards(logits, logits.ndim - 1, self.spec.vocab_size, self.tp_degree, self.tp_group)
        return vocab_parallel_cross_entropy(logits, labels, _vocab_start(self.spec, self), self.tp_group)


def build_layer(spec: ModelSpec, layer_index: int, tp_degree: int = 1, tp_group=None, *,
                tp_rank: int = 0, seed: int = 0) -> ShardedLayer:
    """The module of one Sailor layer index (TP shard ``tp_rank`` of ``tp_degree``); a tied head
    built on its own holds its copy of the embedding matrix, as on a last pipeline stage."""
    if not 0 <= layer_index < spec.num_layer_indices:
        raise PlanError(f"layer index {layer_index} out of range 0..{spec.num_layer_indices - 1} "
                        f"for {spec.name}")
    if layer_index == 0:
        return Embedding(spec, tp_degree, tp_rank, tp_group, seed)
    if layer_index == spec.num_layers + 1:
        return Head(spec, tp_degree, tp_rank, tp_group, seed)
    return Block(spec, layer_index, tp_degree, tp_rank, tp_group, seed)


class StageModel(nn.Module):
    """Layers [start, end) of a model; the last stage returns the loss (the logits without labels).

    ``recompute`` (a plan stage's, ``plan/types.RECOMPUTE_MODES``): ``selective`` re-runs each
    block's attention core in backward, ``full`` each block (its input kept, nothing inside).
    Both use ``torch.utils.checkpoint`` without re-entrance, so the 1F1B's manual
    ``backward(grad)`` and the TP collectives of a re-run block (issued again, in the same order
    on every TP rank) need nothing special.  The values are the same either way."""

    def __init__(self, spec: ModelSpec, layer_start: int, layer_end: int, tp_degree: int = 1,
                 tp_rank: int = 0, tp_group=None, seed: int = 0, *, recompute: str = RECOMPUTE_NONE) -> None:
        super().__init__()
        if recompute not in RECOMPUTE_MODES:
            raise PlanError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {recompute!r}")
        self.spec = spec
        self.recompute = recompute
        self.layer_start, self.layer_end = layer_start, layer_end
        layers: list[ShardedLayer] = []
        for i in range(layer_start, layer_end):
            if i == spec.num_layers + 1 and layer_start == 0:  # the head shares the stage's embedding
                layers.append(Head(spec, tp_degree, tp_rank, tp_group, seed, embedding=layers[0]))
            else:
                layers.append(build_layer(spec, i, tp_degree, tp_group, tp_rank=tp_rank, seed=seed))
        self.layers = nn.ModuleList(layers)
        for layer in layers:
            if isinstance(layer, Block):
                layer.recompute_core = recompute == RECOMPUTE_SELECTIVE

    @property
    def is_first(self) -> bool:
        return self.layer_start == 0

    @property
    def is_last(self) -> bool:
        return self.layer_end == self.spec.num_layer_indices

    @property
    def tied_copy(self) -> torch.Tensor | None:
        """This stage's copy of the tied embedding matrix (a last stage without layer 0), or None."""
        head = self.layers[-1]
        return head.tok if isinstance(head, Head) and head.tied else None

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            if isinstance(layer, Head):
                x = layer(x, labels)
            elif self.recompute == RECOMPUTE_FULL and isinstance(layer, Block) and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return x

    def named_layer_params(self):
        """(layer, name, parameter) for every parameter, in a fixed order."""
        for layer in self.layers:
            for name, p in layer.named_parameters(recurse=False):
                yield layer, name, p
