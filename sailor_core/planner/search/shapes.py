"""Segments and shapes: a segment is a run of consecutive stages on one GPU type (its TP and DP
degree, number of stages, placement rule and bound figures); a shape is at most one segment per
GPU type, searched in two orders."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_core.catalog.gpus import get_gpu
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import Kind


@dataclass(slots=True, eq=False)
class Segment:
    """A run of consecutive stages on one GPU type (see the module docstring).  Never changed
    once built; not frozen because searches build them by the ten thousand (a frozen
    dataclass's constructor takes 4 us instead of 0.9 us with 13 fields)."""

    gpu: str
    kind: Kind
    tp_degree: int
    dp_degree: int
    num_stages: int
    rule: str  # "stage" or "pipeline" (see placement)
    capacity: float  # num_stages / (microbatches per replica * slowness)
    slowness: float  # per-micro-batch time of a block on this kind / on the fastest kind (>= that)
    num_microbatches: int  # per replica (the busiest)
    min_usd_per_hr: float
    block_busy_s: float  # num_microbatches x the fastest block (any variant): a stage's busy time per block
    head_busy_s: float  # num_microbatches x the fastest last layer: what the stage holding it adds
    egress_usd: float = 0.0  # a lower bound on its own p2p egress per iteration (stages in different zones)

    @property
    def num_gpus(self) -> int:
        return self.num_stages * self.dp_degree * self.tp_degree



NO_SEGMENT = None  # "this GPU type is not used" in a per-type list


def stages_key(mbs: int, stages: tuple[FastStage, ...]) -> tuple:
    return (mbs, tuple(
        (s.layer_start, s.layer_end, tuple((k.gpu, k.tp_degree, z, n) for k, z, n in s.groups))
        for s in stages
    ))



def d_grid(d_max: int) -> list[int]:
    out, d = [], 1
    while d <= d_max:
        out.append(d)
        if d * 3 // 2 <= d_max and d >= 2 and d * 3 // 2 != d:
            out.append(d * 3 // 2)
        d *= 2
    out.append(d_max)
    return sorted(set(out))


def largest_divisor_at_most(n: int, limit: int) -> int:
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


def order_key(shape: tuple[Segment, ...]) -> tuple:
    return tuple((s.gpu, s.tp_degree, s.dp_degree, s.num_stages, s.rule, s.kind.micro_batch_size) for s in shape)


def orders(shape: tuple[Segment, ...]) -> list[tuple[Segment, ...]]:
    """Larger-memory GPUs first (early 1F1B stages hold more micro-batches), and the reverse."""
    if len(shape) == 1:
        return [shape]
    first = tuple(sorted(shape, key=lambda s: (-get_gpu(s.gpu).memory_bytes, s.gpu)))
    return [first, first[::-1]]
