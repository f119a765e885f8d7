"""The kinds of one search's GPU types under every regime a plan may run them in, and the
figures the bounds take from them: the fastest over those regimes, so that a bound holds
whatever regime the plan ends up in."""

from __future__ import annotations

import math

from sailor_core.planner.kinds import Kind, valid_tp_degrees
from sailor_core.planner.search.memo import SearchMemos
from sailor_core.simulator.tables import layer_table


class KindFigures:
    """Regime variants of kinds and their fastest figures, for one search (see the module
    docstring); memoised in the search's ``SearchMemos``."""

    __slots__ = ("kinds", "model", "regime", "max_tp_degree", "gpu_types", "num_layers", "memos")

    def __init__(self, *, kinds, model: str, regime: str | None, max_tp_degree: int, gpu_types: list[str],
                 num_layers: int, memos: SearchMemos) -> None:
        self.kinds = kinds
        self.model = model
        self.regime = regime
        self.max_tp_degree = max_tp_degree
        self.gpu_types = gpu_types
        self.num_layers = num_layers
        self.memos = memos

    def kinds_of(self, gpu: str, mbs: int) -> list[tuple[int, Kind]]:
        """(TP degree, kind) of every TP degree of ``gpu`` with a profile (or an estimate)."""
        return [(tp, k) for tp in valid_tp_degrees(self.model, gpu, self.max_tp_degree)
                if (k := self.kinds.get(gpu, tp, mbs)) is not None]

    def variants(self, kind: Kind) -> list[Kind]:
        """``kind`` under every regime a plan holding it may run in.

        ``simulate`` runs a plan under its first replica's profile's regime (unless the request
        names one), and another regime can make a GPU type several times faster or slower
        (estimated profiles), so a valid bound must take the fastest of these.
        """
        if self.regime is not None:
            return [kind]
        memo = self.memos.types.variants
        key = (kind.gpu, kind.tp_degree, kind.micro_batch_size)
        hit = memo.get(key)
        if hit is not None:
            return hit
        firsts = [f for g in self.gpu_types for tp in valid_tp_degrees(self.model, g, self.max_tp_degree)
                  if (f := self.kinds.get(g, tp, kind.micro_batch_size)) is not None]
        out = [kind]
        for f in firsts:
            v = self.kinds.in_regime_of(kind, f)
            # a kind of the same profile under the same regime has every figure of one already in
            if all(v is not o and (v.profile is not o.profile or v.regime is not o.regime) for o in out):
                out.append(v)
        memo[key] = out
        return out

    def block_and_head_s(self, kind: Kind) -> tuple[float, float]:
        """(fastest block, fastest last layer) of ``kind`` over its variants, per micro-batch.

        A stage holding b blocks takes at least b times the first; the stage holding the last
        layer (the LM head: one to two blocks' worth of compute) also the second.
        """
        memo = self.memos.types.block_head
        key = (kind.gpu, kind.tp_degree, kind.micro_batch_size)
        hit = memo.get(key)
        if hit is None:
            vs = self.variants(kind)
            shared = self.memos.process.kind_figures
            hit = shared.get(("block and head", tuple(vs)))
            if hit is None:
                L = self.num_layers
                # (``Kind.time_s`` of each layer, read off the kinds' sums)
                if L >= 3:
                    block = min(c[i + 1] - c[i] for c in (v.comp_cum for v in vs) for i in range(1, L - 1))
                    head = min(v.time_s(L - 1, L) for v in vs)
                else:
                    block, head = min(c[i + 1] - c[i] for c in (v.comp_cum for v in vs) for i in range(L)), 0.0
                hit = shared[("block and head", tuple(vs))] = (block, head)
            memo[key] = hit
        return hit

    def slowness(self, kind: Kind, ref: list[float], ref_key: tuple) -> float:
        """Per-micro-batch time of a layer on ``kind`` over ``ref``'s (the fastest kind's), the
        least over its variants and the layers ``ref`` counts (>= 1 when ``ref`` is the fastest)."""
        # The same variants against the same reference, in every request of these GPU types.
        shared = self.memos.process.kind_figures
        key = ("slowness", tuple(self.variants(kind)), ref_key)
        ratio = shared.get(key)
        if ratio is None:
            ratio = shared[key] = min(
                ((c[i + 1] - c[i]) / ref[i]) for c in (v.comp_cum for v in self.variants(kind))  # (``Kind.time_s``)
                for i in range(self.num_layers) if ref[i] > 0
            ) if any(r > 0 for r in ref) else 1.0
        return ratio

    def gradient_bytes_lb(self, mbs: int) -> tuple[float, float]:
        """(whole model, one block): gradient bytes a DP ring of any kind of this search carries
        for them, TP shards counted whole (shard x degree), the least over kinds and regime
        variants layer by layer, so that the bytes of any split's stages add up to at least the
        first."""
        # Kinds and variants only: the same for every search of these GPU types in the process.
        shared = self.memos.process.small
        key = ("gradient bytes", mbs, tuple(self.gpu_types), self.max_tp_degree)
        hit = shared.get(key)
        if hit is None:
            L = self.num_layers
            per_layer = [math.inf] * L
            for g in self.gpu_types:
                for tp in valid_tp_degrees(self.model, g, self.max_tp_degree):
                    kind = self.kinds.get(g, tp, mbs)
                    for v in self.variants(kind) if kind is not None else ():
                        cum = layer_table(v.profile).params_cum
                        scale = tp * v.regime.grad_bytes_per_param
                        # (``LayerTable.params`` of each layer, scaled)
                        per_layer = list(map(min, per_layer, [scale * (cum[i + 1] - cum[i]) for i in range(L)]))
            blocks = per_layer[1:L - 1] if L >= 3 else per_layer
            hit = shared[key] = (sum(per_layer), min(blocks))
        return hit

    def min_boundary_bytes(self, kind: Kind) -> int:
        """The smallest activation ``kind`` sends between two stages (any boundary)."""
        memo = self.memos.own.boundary_bytes
        key = id(kind)
        hit = memo.get(key)
        if hit is None:
            out = layer_table(kind.profile).output_bytes
            hit = memo[key] = min(out[: max(1, self.num_layers - 1)])
        return hit

    def link_bytes(self, kind: Kind) -> int:
        """The smallest first-block activation over ``kind``'s variants (what a link bound sends)."""
        return min(layer_table(v.profile).output_bytes[min(1, self.num_layers - 1)] for v in self.variants(kind))

    def ideal_gpu_s(self, gpus: list[str], micro_batch_sizes: list[int], global_batch_size: int) -> float:
        """The least GPU-seconds of an iteration on these GPU types (inf: no kind): each layer of
        each micro-batch on its fastest kind and variant, times that kind's TP degree."""
        L = self.num_layers
        shared = self.memos.process.small
        key = ("ideal GPU-seconds", tuple(gpus), tuple(self.gpu_types), tuple(micro_batch_sizes),
               global_batch_size, self.max_tp_degree)
        gpu_s = shared.get(key)
        if gpu_s is None:
            gpu_s = math.inf
            for mbs in micro_batch_sizes:
                per_layer = [math.inf] * L
                for g in gpus:
                    for tp in valid_tp_degrees(self.model, g, self.max_tp_degree):
                        kind = self.kinds.get(g, tp, mbs)
                        for v in self.variants(kind) if kind is not None else ():
                            for i in range(L):
                                per_layer[i] = min(per_layer[i], tp * v.time_s(i, i + 1))
                gpu_s = min(gpu_s, global_batch_size // mbs * sum(per_layer))
            shared[key] = gpu_s
        return gpu_s
