"""Profile records: per-layer forward/backward time and sizes of one (model, GPU, TP, mbs, seq)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """One layer index on one GPU of a TP group, for one micro-batch of the profile's size."""

    fwd_s: float
    bwd_s: float
    params: int  # parameters of this layer held by ONE GPU (its TP shard)
    activation_bytes: int  # kept alive for backward, per micro-batch, per GPU
    output_bytes: int  # sent to the next stage per micro-batch
    measured: bool  # False when estimated


ProfileKey = tuple[str, str, int, int, int]  # (model, gpu, tp_degree, micro_batch_size, seq_len)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelProfile:
    """Per-layer profile of a model on one GPU type at one (TP, micro-batch, sequence length).

    ``update_s(n)`` is the optimizer step of a GPU holding ``n`` parameters:
    ``update_fixed_s + update_s_per_param * n`` (a step touches every parameter once, so its
    time is linear in the parameters; the fixed part is launch overhead).
    """

    model: str
    gpu: str
    tp_degree: int
    micro_batch_size: int
    seq_len: int
    layers: tuple[LayerProfile, ...]  # one per layer index 0..L+1
    regime: str  # training regime it was measured under (sailor_core/regimes.py)
    source: str  # e.g. "sailor:profiles_tmp.json", "measurements:h200", "estimated from A100-40 ..."
    update_s_per_param: float
    update_fixed_s: float = 0.0
    update_measured: bool = True

    @property
    def key(self) -> ProfileKey:
        return (self.model, self.gpu, self.tp_degree, self.micro_batch_size, self.seq_len)

    @property
    def measured(self) -> bool:
        """True when every layer's time was measured."""
        return all(layer.measured for layer in self.layers)

    @property
    def num_layer_indices(self) -> int:
        return len(self.layers)

    def update_s(self, num_params: int) -> float:
        """Optimizer-update time of a stage holding ``num_params`` parameters per GPU."""
        if num_params <= 0:
            return 0.0
        return self.update_fixed_s + self.update_s_per_param * num_params

    def fwd_bwd_s(self, start: int = 0, end: int | None = None) -> float:
        """Forward + backward time of one micro-batch over layer indices [start, end)."""
        return sum(layer.fwd_s + layer.bwd_s for layer in self.layers[start:end])

    def params(self, start: int = 0, end: int | None = None) -> int:
        return sum(layer.params for layer in self.layers[start:end])
