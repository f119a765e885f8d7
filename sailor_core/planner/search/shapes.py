"""Segments and shapes, and building them.

A *segment* is a run of consecutive pipeline stages on one GPU type: its TP degree, data-parallel
degree, number of stages and zone placement rule, with the figures its bounds need.  A *shape* is
at most one segment per GPU type; it is searched in two orders (``orders``).  ``build_segments``
makes one GPU type's segment list; ``place_shape`` puts an ordered shape's stages in zones.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.instances import gpu_price_usd_per_hr
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import Kind
from sailor_core.planner.placement import StagePlacement, place_pipelines, place_stages


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

Placed = list[tuple[Kind, StagePlacement]]  # a placed shape: per stage, its kind and replicas per zone


def order_key(shape: tuple[Segment, ...]) -> tuple:
    """What identifies an ordered shape across searches of one model (memo key)."""
    return tuple((s.gpu, s.tp_degree, s.dp_degree, s.num_stages, s.rule, s.kind.micro_batch_size) for s in shape)


def orders(shape: tuple[Segment, ...]) -> list[tuple[Segment, ...]]:
    """Larger-memory GPUs first (early 1F1B stages hold more micro-batches), and the reverse."""
    if len(shape) == 1:
        return [shape]
    first = tuple(sorted(shape, key=lambda s: (-get_gpu(s.gpu).memory_bytes, s.gpu)))
    return [first, first[::-1]]


def stages_key(mbs: int, stages: tuple[FastStage, ...]) -> tuple:
    """What identifies a plan: micro-batch size, and per stage its layers and replica groups."""
    return (mbs, tuple(
        (s.layer_start, s.layer_end, tuple((k.gpu, k.tp_degree, z, n) for k, z, n in s.groups))
        for s in stages
    ))


def placed_key(mbs: int, stages: Placed) -> tuple:
    """What identifies a placed shape under any lever setting: micro-batch size, and per stage its
    GPU type, TP degree and replicas per zone (the kinds' levers left out)."""
    return (mbs, tuple((kind.gpu, kind.tp_degree, placed) for kind, placed in stages))


def fast_stages(stages: Placed, ends: list[int]) -> tuple[FastStage, ...]:
    """A placed shape split at ``ends`` (each stage's end layer), as fastsim takes it."""
    out, start = [], 0
    for (kind, placed), end in zip(stages, ends):
        out.append(FastStage(start, end, tuple((kind, z, n) for z, n in placed)))
        start = end
    return tuple(out)


def build_segments(gpu: str, pools: dict[str, int], *, spot: bool, num_mb: int, degrees: str,
                   max_stages: int, terms: tuple, fewest_crossings, matters=None) -> list[Segment]:
    """Every segment of one GPU type: per TP degree of ``terms`` (TP, kind, slowness, fastest
    block and last layer, USD per micro-batch crossing zones or None), per stage count up to
    ``max_stages``, the data-parallel degrees ``degrees`` names (``DP_SPACES``), under each
    placement rule that differs.  ``fewest_crossings(gpu, tp, dp, stages)``: zone crossings the
    stage rule cannot avoid (``EgressParts.fewest_crossings``).  ``matters(capacity, tp, stages,
    micro-batches per replica)``: whether such a segment can matter, false on the smaller degrees
    only (``Searcher._capacity_cut``); None: all can."""
    live = {z: n for z, n in pools.items() if n > 0}
    min_price = min(gpu_price_usd_per_hr(gpu, z, spot=spot) for z in live)
    out: list[Segment] = []
    # (efficient degrees up to any d_max are a prefix of those up to the most: listed once)
    efficient = dp_degrees(degrees, num_mb, num_mb, []) if degrees == "efficient" else None
    for tp, kind, ratio, block_s, head_s, per_byte in terms:
        total_rep = sum(n // tp for n in live.values())
        zone_reps = sorted((n // tp for n in live.values()), reverse=True)
        zone_max = zone_reps[0]
        for num_stages in range(1, max_stages + 1):
            d_max = min(total_rep // num_stages, num_mb)
            if d_max < 1:
                break
            # (none matters if the largest degree does not)
            n_least = -(-num_mb // d_max)
            if matters is not None and not matters(num_stages / (n_least * ratio), tp, num_stages, n_least):
                continue
            whole_pipelines = sum(n // (tp * num_stages) for n in live.values()) if len(live) > 1 else 0
            ds = efficient[:bisect.bisect_right(efficient, d_max)] if efficient else dp_degrees(
                degrees, d_max, num_mb, zone_reps)
            if matters is not None:
                # the degrees that matter are the largest ones: from the top, down to the first that does not
                first = len(ds)
                while first:
                    n = -(-num_mb // ds[first - 1])
                    if not matters(num_stages / (n * ratio), tp, num_stages, n):
                        break
                    first -= 1
                ds = ds[first:]
            for d in ds:
                n_per_rep = -(-num_mb // d)
                cap = num_stages / (n_per_rep * ratio)
                rules = ["stage"]
                # Whole pipelines per zone only differ from the stage rule when the segment
                # does not fit one zone: the stage rule then sends every micro-batch across
                # a zone boundary between stages, this one crosses zones in the DP rings.
                if d * num_stages > zone_max and whole_pipelines >= d:
                    rules.append("pipeline")
                for rule in rules:
                    # A lower bound on the segment's own p2p egress: consecutive stages placed
                    # whole in different zones send every micro-batch across, both ways,
                    # whatever zone the segment starts after; none under the pipeline rule
                    # (its p2p stays in a zone) or for a one-zone type.
                    egress = fewest_crossings(gpu, tp, d, num_stages) * num_mb * per_byte \
                        if per_byte is not None and rule == "stage" and num_stages > 1 else 0.0
                    # (positionally, in the fields' order: keywords made the constructor 3-4x slower)
                    out.append(Segment(gpu, kind, tp, d, num_stages, rule, cap, ratio, n_per_rep,
                                       num_stages * d * tp * min_price, n_per_rep * block_s, n_per_rep * head_s,
                                       egress))
    return out


# The data-parallel degrees a segment list holds (``build_segments``), by name:
DP_SPACES = {
    # every degree from 1: the exhaustive yardstick's space (``planner/exhaustive.py``)
    "every": "every degree from 1 to the most the pools hold",
    # a cost objective, caps or a Pareto front: fewer GPUs can be cheaper, so every degree that
    # can be best is searched
    "efficient": "every degree that is the smallest for its busiest-replica micro-batch count",
    # the throughput objective alone: the most replicas the k largest zones hold, for every k
    "zones": "per number of zones k, the largest efficient degree the k largest zones hold, "
             "and the largest dividing the micro-batches",
    # several GPU types under a cost objective, caps or a Pareto front: their product of
    # every efficient degree is 7x as many shapes (2.6 million at one micro-batch on the floor
    # row), so a grid; each type alone is searched over "efficient" first
    "grid": "the zones degrees, and the efficient degrees of 1, 2, 3, 4, 6, 8, 12, ... (powers of "
            "two and 1.5 times them)",
}


def dp_degrees(space: str, d_max: int, num_mb: int, zone_reps: list[int]) -> list[int]:
    """The data-parallel degrees up to ``d_max`` in ``space`` (``DP_SPACES``).  *Efficient*
    degrees are the smallest for each busiest-replica micro-batch count ``ceil(num_mb / d)``:
    micro-batch m goes to replica m mod D, so a degree between two of them has the same busiest
    replica (the same pipeline time and memory) with more GPUs (more rent, a ring no shorter,
    zones no easier to fit) and is never better; there are about ``2 sqrt(num_mb)`` of them.
    ``zone_reps``: replicas per zone, largest first."""
    if space == "every":
        return list(range(1, d_max + 1))
    if space == "efficient":
        # (from each, the next: the fewest replicas whose busiest holds one micro-batch fewer)
        out, d = [], 1
        while d <= d_max:
            out.append(d)
            per_rep = -(-num_mb // d)
            if per_rep == 1:
                break
            d = -(-num_mb // (per_rep - 1))
        return out
    assert space in ("zones", "grid"), space
    out, held = set(), 0
    if space == "grid":
        d = 1
        while d <= d_max:
            out.update((_efficient(d, num_mb), _efficient(min(d * 3 // 2, d_max), num_mb)))
            d *= 2
    for reps in zone_reps:
        held += reps
        d = min(d_max, held)
        out.add(_efficient(d, num_mb))
        out.add(largest_divisor_at_most(num_mb, d))
        if held >= d_max:
            break
    return sorted(out)


def largest_divisor_at_most(n: int, limit: int) -> int:
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


def _efficient(d: int, num_mb: int) -> int:
    """The fewest replicas whose busiest holds as few micro-batches as ``d`` replicas' busiest."""
    return -(-num_mb // -(-num_mb // d))


def place_segment(seg: Segment, pools: dict[str, int], prev_zone: str | None,
                  memo: dict) -> tuple[StagePlacement, ...] | None:
    """Zones of each stage of ``seg`` under its rule (``placement``), after a stage ending in
    ``prev_zone``; None if the pools cannot hold it.  ``memo``: by pools and segment."""
    return place_run(seg.gpu, pools, seg.tp_degree, seg.dp_degree, seg.num_stages, seg.rule, prev_zone, memo)


def place_run(gpu: str, pools: dict[str, int], tp: int, dp: int, num_stages: int, rule: str,
              prev_zone: str | None, memo: dict) -> tuple[StagePlacement, ...] | None:
    """``place_segment`` of a segment's figures (what a placement depends on), memoised in ``memo``."""
    zones = {z: n for z, n in pools.items() if n > 0}
    key = (gpu, tuple(zones.items()), tp, dp, num_stages, rule, prev_zone if rule == "stage" else None)
    if key in memo:
        return memo[key]
    if rule == "pipeline":
        placed = memo[key] = place_pipelines(zones, tp, dp, num_stages)
    else:
        placed = memo[key] = place_stages(zones, tp, dp, num_stages, prev_zone)
    return placed


def place_shape(shape: tuple[Segment, ...], zone_gpus: dict[str, dict[str, int]], kinds,
                memo: dict) -> Placed | None:
    """The stages of an ordered shape, each with its kind (as ``simulate`` takes it in a plan
    whose first replica is the first segment's) and replicas per zone; None if it does not fit."""
    stages: Placed = []
    prev_zone: str | None = None
    first = shape[0].kind
    for seg in shape:
        placed = place_segment(seg, zone_gpus[seg.gpu], prev_zone, memo)
        if placed is None:
            return None
        kind = kinds.in_regime_of(seg.kind, first)
        for p in placed:
            stages.append((kind, p))
        last = placed[-1]
        prev_zone = max(last, key=lambda p: (p[1], p[0]))[0]
    return stages
