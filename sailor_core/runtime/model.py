"""Decoder-only models split by Sailor's layer indices, with Megatron TP inside a layer.

Layer index 0 is the embedding, 1..L the transformer blocks, L+1 the final
norm + LM head + loss (DESIGN.md).  Each index is its own module, built by
``build_layer`` on its own (the profiler times layers one by one).

Every parameter is defined by its FULL (logical) shape and a shard dimension
(``None``: replicated on every TP rank).  Initial values are a pure function
of (seed, layer index, parameter name) on the full shape, then sliced, so any
split into stages and any TP degree start from the same model, and a
checkpoint of full tensors loads under any other split.

Families: ``opt`` (LayerNorm, learned positions, ReLU MLP, biases; pre- or
post-norm), ``gptneo`` (as opt with GELU; its local-attention layers are
trained as global attention), ``llama`` (RMSNorm, RoPE, SwiGLU, grouped-query
attention, no biases).  Embedding and LM head are not TP-sharded and are
never tied across stages (a tied model is trained with an untied head).
"""

from __future__ import annotations

import zlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sailor_core.catalog.models import ModelSpec
from sailor_core.errors import PlanError
from sailor_core.runtime.tp import copy_to_tp, reduce_from_tp

INIT_STD = 0.02
ROPE_THETA = 500_000.0


def check_tp_degree(spec: ModelSpec, tp_degree: int) -> None:
    """TP must split heads, KV heads and the FFN evenly."""
    for what, n in (("attention heads", spec.num_heads), ("KV heads", spec.num_kv_heads),
                    ("FFN size", spec.ffn_size)):
        if n % tp_degree:
            raise PlanError(f"TP degree {tp_degree} does not divide {spec.name}'s {n} {what}")


def check_plan_for_engine(plan) -> None:
    """What the engine needs beyond plan validation: TP splits evenly; all-CPU or all-GPU."""
    from sailor_core.catalog.models import get_model

    spec = get_model(plan.model)
    for stage in plan.stages:
        for rep in stage.replicas:
            check_tp_degree(spec, rep.tp_degree)
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

    def _add(self, name: str, full_shape: tuple[int, ...], shard_dim: int | None,
             init: str, seed: int) -> None:
        full = self._init_full(name, full_shape, init, seed)
        self.shard_dims[name] = shard_dim
        self.full_shapes[name] = tuple(full_shape)
        self.register_parameter(name, nn.Parameter(self.shard(name, full)))

    def _init_full(self, name: str, shape, init: str, seed: int) -> torch.Tensor:
        if init == "zeros":
            return torch.zeros(shape)
        if init == "ones":
            return torch.ones(shape)
        gen = torch.Generator().manual_seed(_seed_for(seed, self.layer_index, name))
        return torch.randn(shape, generator=gen) * INIT_STD

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full tensor of parameter ``name``."""
        dim = self.shard_dims[name]
        if dim is None or self.tp_degree == 1:
            return full.clone()
        return full.chunk(self.tp_degree, dim=dim)[self.tp_rank].clone()


def _norm(spec: ModelSpec) -> Callable:
    return _rms_norm if spec.is_llama else _layer_norm


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def _rms_norm(x, w, b=None):
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-5)


class Embedding(ShardedLayer):
    """Layer 0: token (+ learned position) embedding, optional projection in (opt-350m)."""

    def __init__(self, spec: ModelSpec, tp_degree=1, tp_rank=0, tp_group=None, seed=0):
        super().__init__(0, tp_degree, tp_rank, tp_group)
        self.spec = spec
        dim = spec.word_embed_proj_dim or spec.hidden_size
        self._add("tok", (spec.vocab_size, dim), None, "normal", seed)
        if not spec.is_llama:
            self._add("pos", (spec.max_position_embeddings, dim), None, "normal", seed)
        if spec.word_embed_proj_dim:
            self._add("proj_in", (spec.hidden_size, dim), None, "normal", seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tokens, self.tok)
        if not self.spec.is_llama:
            x = x + self.pos[: tokens.shape[1]]
        if self.spec.word_embed_proj_dim:
            x = F.linear(x, self.proj_in)
        return x


def _rope(x: torch.Tensor, theta: float = ROPE_THETA) -> torch.Tensor:
    """Rotary embedding (rotate-half form) on [batch, heads, seq, head_dim]."""
    seq, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(ShardedLayer):
    """Layers 1..L: attention + MLP; QKV and FFN-in column-parallel, out projections row-parallel."""

    def __init__(self, spec: ModelSpec, layer_index: int, tp_degree=1, tp_rank=0, tp_group=None,
                 seed=0):
        super().__init__(layer_index, tp_degree, tp_rank, tp_group)
        check_tp_degree(spec, tp_degree)
        self.spec = spec
        h, hd, f = spec.hidden_size, spec.head_dim, spec.ffn_size
        nh, nkv = spec.num_heads, spec.num_kv_heads
        self.local_heads, self.local_kv_heads = nh // tp_degree, nkv // tp_degree
        bias = not spec.is_llama
        norm_bias = not spec.is_llama
        self._add("norm1_w", (h,), None, "ones", seed)
        if norm_bias:
            self._add("norm1_b", (h,), None, "zeros", seed)
        self._add("q_w", (nh * hd, h), 0, "normal", seed)
        self._add("k_w", (nkv * hd, h), 0, "normal", seed)
        self._add("v_w", (nkv * hd, h), 0, "normal", seed)
        self._add("o_w", (h, nh * hd), 1, "normal", seed)
        if bias:
            self._add("q_b", (nh * hd,), 0, "zeros", seed)
            self._add("k_b", (nkv * hd,), 0, "zeros", seed)
            self._add("v_b", (nkv * hd,), 0, "zeros", seed)
            self._add("o_b", (h,), None, "zeros", seed)
        self._add("norm2_w", (h,), None, "ones", seed)
        if norm_bias:
            self._add("norm2_b", (h,), None, "zeros", seed)
        if spec.is_llama:
            self._add("gate_w", (f, h), 0, "normal", seed)
        self._add("up_w", (f, h), 0, "normal", seed)
        self._add("down_w", (h, f), 1, "normal", seed)
        if bias:
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
        if self.spec.is_llama:
            q, k = _rope(q), _rope(k)
        if self.local_kv_heads != self.local_heads:
            rep = self.local_heads // self.local_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = F.linear(y.transpose(1, 2).reshape(b, s, self.local_heads * hd), self.o_w)
        y = reduce_from_tp(y, self.tp_group)
        return y if self._p("o_b") is None else y + self.o_b

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp_group)
        if self.spec.is_llama:
            y = F.silu(F.linear(x, self.gate_w)) * F.linear(x, self.up_w)
        else:
            y = F.linear(x, self.up_w, self.up_b)
            y = F.gelu(y) if self.spec.family == "gptneo" else F.relu(y)
        y = reduce_from_tp(F.linear(y, self.down_w), self.tp_group)
        return y if self._p("down_b") is None else y + self.down_b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = _norm(self.spec)
        n1 = lambda t: norm(t, self.norm1_w, self._p("norm1_b"))  # noqa: E731
        n2 = lambda t: norm(t, self.norm2_w, self._p("norm2_b"))  # noqa: E731
        if self.spec.pre_norm:
            x = x + self._attention(n1(x))
            return x + self._mlp(n2(x))
        x = n1(x + self._attention(x))
        return n2(x + self._mlp(x))


class Head(ShardedLayer):
    """Layer L+1: final norm, optional projection out, LM head and mean token cross-entropy."""

    def __init__(self, spec: ModelSpec, tp_degree=1, tp_rank=0, tp_group=None, seed=0):
        super().__init__(spec.num_layers + 1, tp_degree, tp_rank, tp_group)
        self.spec = spec
        h = spec.hidden_size
        dim = spec.word_embed_proj_dim or h
        if spec.pre_norm:
            self._add("norm_w", (h,), None, "ones", seed)
            if not spec.is_llama:
                self._add("norm_b", (h,), None, "zeros", seed)
        if spec.word_embed_proj_dim:
            self._add("proj_out", (dim, h), None, "normal", seed)
        self._add("lm_w", (spec.vocab_size, dim), None, "normal", seed)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.spec.pre_norm:
            x = _norm(self.spec)(x, self.norm_w, getattr(self, "norm_b", None))
        if self.spec.word_embed_proj_dim:
            x = F.linear(x, self.proj_out)
        logits = F.linear(x, self.lm_w).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))


def build_layer(spec: ModelSpec, layer_index: int, tp_degree: int = 1, tp_group=None, *,
                tp_rank: int = 0, seed: int = 0) -> ShardedLayer:
    """The module of one Sailor layer index (TP shard ``tp_rank`` of ``tp_degree``)."""
    if not 0 <= layer_index < spec.num_layer_indices:
        raise PlanError(f"layer index {layer_index} out of range 0..{spec.num_layer_indices - 1} "
                        f"for {spec.name}")
    if layer_index == 0:
        return Embedding(spec, tp_degree, tp_rank, tp_group, seed)
    if layer_index == spec.num_layers + 1:
        return Head(spec, tp_degree, tp_rank, tp_group, seed)
    return Block(spec, layer_index, tp_degree, tp_rank, tp_group, seed)


class StageModel(nn.Module):
    """Layers [start, end) of a model; the last stage returns the loss."""

    def __init__(self, spec: ModelSpec, layer_start: int, layer_end: int, tp_degree: int = 1,
                 tp_rank: int = 0, tp_group=None, seed: int = 0) -> None:
        super().__init__()
        self.spec = spec
        self.layer_start, self.layer_end = layer_start, layer_end
        self.layers = nn.ModuleList(
            build_layer(spec, i, tp_degree, tp_group, tp_rank=tp_rank, seed=seed)
            for i in range(layer_start, layer_end)
        )

    @property
    def is_first(self) -> bool:
        return self.layer_start == 0

    @property
    def is_last(self) -> bool:
        return self.layer_end == self.spec.num_layer_indices

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, labels) if isinstance(layer, Head) else layer(x)
        return x

    def named_layer_params(self):
        """(layer, name, parameter) for every parameter, in a fixed order."""
        for layer in self.layers:
            for name, p in layer.named_parameters(recurse=False):
                yield layer, name, p

