"""The egress and rent bounds of segments and placed shapes for one search, memoised: what
micro-batches and gradient rings that must cross zones cost at the least (the formulas are
``bounds``'; this module asks for them and keeps the answers in the search's ``SearchMemos``)."""

from __future__ import annotations

import functools
import math

from sailor_core.plan import routing
from sailor_core.planner.kinds import Kind
from sailor_core.planner.search import bounds
from sailor_core.planner.search.figures import KindFigures
from sailor_core.planner.search.memo import SearchMemos
from sailor_core.planner.search.shapes import Placed, Segment, place_run, place_segment
from sailor_core.simulator import compose


class EgressParts:
    """Egress and rent bounds (see the module docstring)."""

    __slots__ = ("network", "zone_gpus", "global_batch_size", "fast", "figures", "memos")

    def __init__(self, *, network, zone_gpus: dict[str, dict[str, int]], global_batch_size: int, fast,
                 figures: KindFigures, memos: SearchMemos) -> None:
        self.network = network
        self.zone_gpus = zone_gpus
        self.global_batch_size = global_batch_size
        self.fast = fast
        self.figures = figures
        self.memos = memos

    def round_trip_usd_per_byte(self, za: str, zb: str) -> float:
        """Egress USD of a byte from ``za`` to ``zb`` plus one back."""
        memo = self.memos.own.round_trip
        key = (za, zb)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = compose.round_trip_usd_per_byte(self.network, za, zb)
        return hit

    def crossing_usd_per_byte(self, kind: Kind) -> float:
        """USD of one micro-batch's boundary, both ways, between two zones of its GPU type, at
        the least (the cheapest pair, the smallest activation over its regime variants)."""
        memo = self.memos.own.crossing_usd
        pkey = (kind.gpu, kind.tp_degree, kind.micro_batch_size)
        per_byte = memo.get(pkey)
        if per_byte is None:
            zones = [z for z, n in self.zone_gpus[kind.gpu].items() if n > 0]
            price = min(self.round_trip_usd_per_byte(a, b) for a in zones for b in zones if a != b)
            figures = self.figures
            per_byte = memo[pkey] = price * min(figures.min_boundary_bytes(v) for v in figures.variants(kind))
        return per_byte

    def crossings_counter(self, gpu: str):
        """``fewest_crossings`` on ``gpu``'s pools, as a function of (GPU, TP, DP degree, stages)
        that holds the process's memos alone (a segment keeps it until it counts)."""
        memos = self.memos.process
        zones = {z: n for z, n in self.zone_gpus[gpu].items() if n > 0}
        return functools.partial(fewest_crossings, zones, (gpu, tuple(zones.items())), memos.segment_places,
                                 memos.fewest_crossings)

    # ---- gradient rings -------------------------------------------------------------------

    def ring_usd_per_byte(self, seg: Segment) -> float:
        """``bounds.ring_egress_usd_per_byte`` of the segment's rings."""
        memo = self.memos.types.ring_usd
        key = (seg.gpu, seg.tp_degree, seg.dp_degree, seg.rule)
        per_byte = memo.get(key)
        if per_byte is None:
            per_byte = memo[key] = bounds.ring_egress_usd_per_byte(
                self.network, self.zone_gpus[seg.gpu], seg.tp_degree, seg.dp_degree, seg.rule)
        return per_byte

    def rings_egress_lb(self, shape: tuple[Segment, ...]) -> float:
        """``bounds.rings_egress_lb`` of a shape."""
        whole, block = self.figures.gradient_bytes_lb(shape[0].kind.micro_batch_size)
        return bounds.rings_egress_lb([self.ring_usd_per_byte(s) for s in shape],
                                      [s.num_stages for s in shape], whole, block)

    # ---- micro-batches between stages -------------------------------------------------------

    def placed_costs_lb(self, mbs: int, stages: Placed) -> tuple[float, float]:
        """(USD per hour, a lower bound on the egress USD per iteration) of a placed shape before
        its split: the rent is exact; every micro-batch routed across a zone boundary carries at
        least the smallest activation both ways (the rings' egress depends on the split: left out)."""
        fast = self.fast
        num_mb = self.global_batch_size // mbs
        usd_per_hr = egress = 0.0
        for i, (kind, placed) in enumerate(stages):
            for zone, n in placed:
                usd_per_hr += n * kind.tp_degree * fast.price(kind.gpu, zone)
            if i + 1 == len(stages):
                break
            nxt = stages[i + 1][1]
            if placed == nxt:
                continue  # the same replicas per zone: m mod D sends every micro-batch within its zone
            if len(placed) == 1 and len(nxt) == 1:
                crossing = num_mb * self.round_trip_usd_per_byte(placed[0][0], nxt[0][0])
            else:
                pairs = routing.group_p2p_pairs(num_mb, tuple(n for _, n in placed), tuple(n for _, n in nxt))
                crossing = sum(carried * self.round_trip_usd_per_byte(placed[a][0], nxt[b][0])
                               for (a, b), carried in pairs.items() if placed[a][0] != nxt[b][0])
            if crossing:
                egress += crossing * self.figures.min_boundary_bytes(kind)
        return usd_per_hr, egress

    def route(self, seg: Segment):
        """Where a segment's stages route micro-batches, whatever comes before it: "one zone" (its
        zones have room for each stage whole, so the stage rule puts each in one zone), the
        replicas per zone of every stage (the pipeline rule), or None (unknown)."""
        memo = self.memos.types.routes
        key = (seg.gpu, seg.tp_degree, seg.dp_degree, seg.num_stages, seg.rule)
        hit = memo.get(key, memo)
        if hit is memo:
            pools = self.zone_gpus[seg.gpu]
            if seg.rule == "stage":
                room = sum((n // seg.tp_degree) // seg.dp_degree for n in pools.values())
                hit = "one zone" if room >= seg.num_stages else None
            else:
                placed = place_segment(seg, pools, None, self.memos.process.segment_places)
                hit = None if placed is None else placed[0]
            memo[key] = hit
        return hit

    def between_segments_usd(self, num_mb: int, first: list[Segment], second: list[Segment], *, kinds=None):
        """USD per iteration, at the least, of the micro-batches crossing zones between two
        segments (``bounds.boundary_crossings``, in its form: (matrix, row of each of ``first``,
        column of each of ``second``)), each crossing carrying the smallest boundary activation
        both ways (over ``kinds``, else the segments' own) at the cheapest price."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        gpus = {seg.gpu for seg in (*first, *second)}
        zones = sorted({z for gpu in gpus for z in self.zone_gpus[gpu]})
        crossings = bounds.boundary_crossings(num_mb, zones, [self.route(s) for s in first],
                                              [self.route(s) for s in second])
        if crossings is None:
            return np.zeros((1, 1)), np.zeros(len(first), dtype=int), np.zeros(len(second), dtype=int)
        live = {z for gpu in gpus for z, n in self.zone_gpus[gpu].items() if n > 0}
        price = min(self.round_trip_usd_per_byte(x, y) for x in live for y in live if x != y)
        figures = self.figures
        if kinds is None:
            kinds = {id(seg.kind): seg.kind for seg in (*first, *second)}.values()
        nbytes = min(figures.min_boundary_bytes(v) for kind in kinds for v in figures.variants(kind))
        matrix, rows, cols = crossings
        return matrix * nbytes * price, rows, cols


def fewest_crossings(zones: dict[str, int], pools_key: tuple, places: dict, memo: dict, gpu: str, tp: int, d: int,
                     num_stages: int) -> int:
    """The fewest boundaries between consecutive stages placed whole in different ``zones``
    (``gpu``'s with GPUs left; ``pools_key``: (``gpu``, their items)), over the zones the stage
    placement may start after (0 for a one-zone type), on the placements the search takes
    (``shapes.place_run``, memoised in ``places``)."""
    key = (pools_key, tp, d, num_stages)
    fewest = memo.get(key)
    if fewest is None:
        fewest = 0 if len(zones) < 2 else math.inf
        for prev in (None, *sorted(zones)) if fewest else ():
            placed = places.get((*pools_key, tp, d, num_stages, "stage", prev), False)  # place_run's key
            if placed is False:
                placed = place_run(gpu, zones, tp, d, num_stages, "stage", prev, places)
            if placed is None:
                fewest = 0
                break
            crossings = sum(1 for a, b in zip(placed, placed[1:])
                            if len(a) == 1 and len(b) == 1 and a[0][0] != b[0][0])
            fewest = min(fewest, crossings)
            if not fewest:
                break  # none is the least there is (most segments: every stage in one zone)
        memo[key] = fewest
    return fewest
