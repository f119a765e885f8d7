"""``sailor memory``'s settings: one GPU holding a stage, and the stage's memory levers."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.specs.fields import SpecError, at_least, option

RECOMPUTE_CHOICES = ("none", "selective", "full")  # plan.types.RECOMPUTE_MODES (plain module: the CLI reads it)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySpec:
    """A stage on one GPU: the model, the GPU, its shape and the levers to apply."""

    model: str = option(help="A catalog model, e.g. opt-350m, or a Hugging Face model folder (its config.json).")
    gpu: str = option(help="GPU type, e.g. A100-40.")
    mbs: int = option(help="Micro-batch size (sequences).")
    inflight: int = option(1, help="Micro-batches in flight (1F1B: P - stage index).")
    layers: str | None = option(None, help="Half-open layer range START:END (default: all).")
    tp: int = option(1, help="Tensor-parallel degree.")
    seq_len: int | None = option(None, help="Sequence length (default: the model's).")
    regime: str | None = option(None, help="Training regime (default: the profile's).")
    recompute: str = option("none", help="Activation recomputation: none, selective (the attention core) or "
                                         "full (every block).")
    zero: int = option(0, help="ZeRO stage: 0, 1 (optimizer states sharded over --dp replicas) or 2 "
                               "(gradients too).")
    dp: int = option(1, help="Data-parallel replicas of the stage (what ZeRO shards over).")
    microbatches: int = option(0, help="Micro-batches this replica runs per step (0: more than in flight; "
                                       "with as many as in flight the step's peak differs).")

    def __post_init__(self) -> None:
        at_least("mbs", self.mbs, 1)
        at_least("inflight", self.inflight, 1)
        at_least("tp", self.tp, 1)
        at_least("seq_len", self.seq_len, 1, optional=True)
        at_least("dp", self.dp, 1)
        at_least("microbatches", self.microbatches, 0)
        if self.microbatches and self.microbatches < self.inflight:
            raise SpecError("microbatches", f"must be at least --inflight ({self.inflight}) or 0, got {self.microbatches}")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise SpecError("recompute", f"must be one of {', '.join(RECOMPUTE_CHOICES)}, got {self.recompute!r}")
        if self.zero not in (0, 1, 2):
            raise SpecError("zero", f"must be 0, 1 or 2, got {self.zero}")
