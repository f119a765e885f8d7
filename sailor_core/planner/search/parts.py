"""The time bounds of segments for one search, memoised: links, rings, sync curves and the
granular bound (the formulas are ``bounds``'; this module decides what they are asked for and
keeps the answers in the search's ``SearchMemos``)."""

from __future__ import annotations

import itertools
import math

from sailor_core.planner.search import bounds
from sailor_core.planner.search.alone import blocked_pipeline_s
from sailor_core.planner.search.figures import KindFigures
from sailor_core.planner.search.memo import SearchMemos
from sailor_core.planner.search.shapes import Segment, place_run
from sailor_core.simulator import compose
from sailor_core.simulator.stage import boundary_transfer_s, endpoint
from sailor_core.simulator.tables import layer_table

GRANULAR_STEPS = 16  # of the granular bound's bisection (``bounds.granular_many``)
_GRANULAR_MEMO_SIZE = 1 << 16  # two-segment granular bounds the process keeps (then starts afresh)


def ring_room(pools: dict[str, int], tp_degree: int) -> dict[str, int]:
    """Replicas of a TP degree each zone of a GPU type has room for (zones with none left out)."""
    return {z: n // tp_degree for z, n in pools.items() if n // tp_degree > 0}


class SegmentParts:
    """Links, rings, sync curves and granular bounds of segments (see the module docstring).

    Behind the search's memos, the process's: links (``ProcessMemos.bound_parts``) on its type's
    zone names and its kind under each regime it may run in (``KindFigures.variants``); rings and
    sync curves (``ProcessMemos.rings``) on the zones that can hold a segment's replicas
    (``ring_zones``) and the gradient bytes of those variants alone, so the searches of every
    lever setting (whose kinds hold the same parameters) share them; all on the network (the
    memo's)."""

    __slots__ = ("network", "zone_gpus", "num_layers", "num_blocks", "max_stages", "figures", "memos",
                 "placed", "_links", "_zone_names")

    def __init__(self, *, network, zone_gpus: dict[str, dict[str, int]], num_layers: int, max_stages: int,
                 figures: KindFigures, memos: SearchMemos, placed: bool = True) -> None:
        self.network = network
        self.zone_gpus = zone_gpus
        self.num_layers = num_layers
        self.num_blocks = num_layers - 2 if num_layers >= 3 else num_layers
        self.max_stages = max_stages
        self.figures = figures
        self.memos = memos
        self.placed = placed  # whether the bounds of a segment placed alone (``alone``) are taken
        self._links = memos.types.links  # (the most asked: bound here)
        self._zone_names = {gpu: tuple(sorted(zones)) for gpu, zones in zone_gpus.items()}

    def _shared(self, key: tuple, kind):
        """The process's memo entry of a part of a kind's segments (None if absent) and its full key."""
        key = (key, tuple(self.figures.variants(kind)))
        return self.memos.process.bound_parts.get(key), key

    # ---- links --------------------------------------------------------------------------

    def link_s(self, a: Segment, b: Segment) -> float:
        """Activation + gradient of one micro-batch between replicas of a and b (``bounds.link_s``)."""
        key = (a.gpu, a.tp_degree, b.gpu, b.tp_degree, a.kind.micro_batch_size)
        t = self._links.get(key)
        return t if t is not None else self._link(key, a.kind)

    def own_link_s(self, gpu: str, tp_degree: int, kind) -> float:
        """``link_s`` between two segments of ``gpu``, ``tp_degree`` and ``kind`` (before any is built)."""
        key = (gpu, tp_degree, gpu, tp_degree, kind.micro_batch_size)
        t = self._links.get(key)
        return t if t is not None else self._link(key, kind)

    def _link(self, key: tuple, kind) -> float:
        gpu_a, tp_a, gpu_b, tp_b, _ = key
        hit, full = self._shared(("link", key, self._zone_names[gpu_a], self._zone_names[gpu_b]), kind)
        if hit is None:
            hit = self.memos.process.bound_parts[full] = bounds.link_s(
                self.network, self.figures.link_bytes(kind), self.zone_gpus[gpu_a], self.zone_gpus[gpu_b],
                gpu_a, tp_a, gpu_b, tp_b)
        self._links[key] = hit
        return hit

    def steady_links_s(self, seg: Segment) -> float:
        return bounds.steady_links_s(seg.num_microbatches, self.link_s(seg, seg), seg.num_stages)

    def blocked_s(self, seg: Segment, steps_s: float) -> float:
        """The pipeline of a shape of this segment alone, whose steps sum to ``steps_s``, at the
        least, where every regime it may run in blocks on its sends (``blocked``); else 0 (also
        when the search draws a Pareto front: see ``Searcher``)."""
        if not self.placed or seg.num_stages < 2:
            return 0.0
        memo = self.memos.types.blocked_s
        key = (seg.gpu, seg.tp_degree, seg.kind.micro_batch_size, seg.dp_degree, seg.num_stages, seg.rule, steps_s)
        t = memo.get(key)
        if t is None:
            links = self._blocked_links(seg)
            t = memo[key] = blocked_pipeline_s(steps_s, seg.num_microbatches, links) if links else 0.0
        return t

    def blocked_column(self, columns: dict, idx, work_s: float):
        """``blocked_s`` of a list's segments (``scored.segment_columns``, index len(segs): none),
        filled for the segments ``idx`` as needed (it places each segment: most of a seeded
        search's have no shape within the limits on the cheaper bounds)."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        segs = columns["segs"]
        if "blocked" not in columns:
            columns["blocked"], columns["have_blocked"] = np.zeros(len(segs) + 1), np.arange(len(segs) + 1) == len(segs)
        have, blocked = columns["have_blocked"], columns["blocked"]
        need = np.flatnonzero(np.bincount(idx[~have[idx]], minlength=len(have)))
        if len(need):
            blocked[need] = [self.blocked_s(segs[i], work_s * segs[i].slowness) for i in need.tolist()]
            have[need] = True
        return blocked

    def _blocked_links(self, seg: Segment) -> tuple[float, ...] | None:
        """Per boundary of the segment placed alone, a bound on its link (``placed_links``); None
        (no bound) for one stage, a prefetching regime or no room."""
        return self.placed_links(seg) if self._blocked_kind(seg) else None

    def blocks_sends(self, seg: Segment) -> bool:
        """Whether the blocked-sends bounds hold for ``seg``'s kind (every regime a plan holding it
        may run in blocks on its sends) and are taken (``placed``: not for a Pareto front)."""
        return self.placed and self._blocked_kind(seg)

    def _blocked_kind(self, seg: Segment) -> bool:
        """Whether every regime a plan holding ``seg``'s kind may run in blocks on its sends."""
        memo = self.memos.types.blocked_links
        kind_key = (seg.gpu, seg.tp_degree, seg.kind.micro_batch_size)
        if kind_key not in memo:
            memo[kind_key] = all(compose.p2p_schedule(v.regime) == "blocking" for v in self.figures.variants(seg.kind))
        return memo[kind_key]

    def placed_links(self, seg: Segment) -> tuple[float, ...] | None:
        """Per boundary of the segment placed alone (``shapes.place_run``: no stage before it), a
        lower bound on the link fastsim charges it: the slowest pair of zones of its route
        (``_routes_of``) at the kind's smallest boundary bytes, and at least the segment's own link
        (``link_s``); None for one stage or no room."""
        if seg.num_stages < 2:
            return None
        if len(self._zone_names[seg.gpu]) == 1:
            return (self.link_s(seg, seg),) * (seg.num_stages - 1)  # (one zone: its link is the least)
        routes = self._routes_of(seg.gpu, seg.tp_degree, seg.dp_degree, seg.num_stages, seg.rule)
        if routes is None:
            return None
        pairs, every = self._zone_links(seg), seg.num_microbatches > 1
        links = pairs.get((routes, every))  # (segments of other degrees and depths share routes)
        if links is None:
            each = [max([self._zone_link(seg, pairs, za, zb) for za, zb in (r if every else r[:1])])
                    for r in routes[0]]
            links = pairs[(routes, every)] = tuple([each[i] for i in routes[1]])
        return links

    def _routes_of(self, gpu: str, tp: int, dp: int, num_stages: int, rule: str) -> tuple | None:
        """(the distinct routes, each boundary's route) of a segment placed alone
        (``shapes.place_run``), a route the distinct zone pairs of a boundary's replicas, replica
        0's first (``_replica_pairs``); None if it cannot be placed.  Kept by what the placement
        depends on, not the micro-batch size (each list of a search, one per size, asks for the
        same ones).

        Micro-batch m goes from replica m mod D of a stage to replica m mod D of the next, and
        fastsim charges a boundary the slowest pair it routes: with more micro-batches than
        replicas every pair of a route carries some, else at least replica 0's."""
        memo = self.memos.types.blocked_links
        key = ("routes", gpu, tp, dp, num_stages, rule)
        if key in memo:
            return memo[key]
        placed = place_run(gpu, self.zone_gpus[gpu], tp, dp, num_stages, rule, None, self.memos.process.segment_places)
        out = None
        if placed is not None and rule == "pipeline":  # (every stage placed alike: one route)
            out = ((_replica_pairs(placed[0], placed[0]),), (0,) * (num_stages - 1))
        elif placed is not None:
            # The stage rule places S stages as S - 1 and one more (``placement._place_stages``).
            head = self._routes_of(gpu, tp, dp, num_stages - 1, rule) if num_stages > 2 else ((), ())
            distinct, index = head
            last = _replica_pairs(placed[-2], placed[-1])
            if last not in distinct:
                distinct = (*distinct, last)
            out = (distinct, (*index, distinct.index(last)))
        memo[key] = out
        return out

    def _zone_links(self, seg: Segment) -> dict:
        """{(zone a, zone b): link s} of the segment's GPU type, TP degree and kind, with its own
        link ("own") and smallest boundary bytes ("bytes")."""
        memo = self.memos.types.blocked_links
        key = ("pairs", seg.gpu, seg.tp_degree, seg.kind.micro_batch_size)
        pairs = memo.get(key)
        if pairs is None:
            pairs = memo[key] = {"own": self.link_s(seg, seg), "bytes": self.figures.link_bytes(seg.kind)}
        return pairs

    def _zone_link(self, seg: Segment, pairs: dict, zone_a: str, zone_b: str) -> float:
        """The link of ``seg``'s kind from a replica in ``zone_a`` to one in ``zone_b`` (``bounds.link_s``'s
        bytes), at least its own link bound, kept in ``pairs``."""
        t = pairs.get((zone_a, zone_b))
        if t is None:
            t = pairs[(zone_a, zone_b)] = max(pairs["own"], boundary_transfer_s(
                self.network, pairs["bytes"], endpoint(zone_a, seg.gpu, seg.tp_degree),
                endpoint(zone_b, seg.gpu, seg.tp_degree)))
        return t

    # ---- rings ------------------------------------------------------------------------------

    def ring_zones(self, seg: Segment) -> tuple:
        """All ``bounds.rings_s`` depends on of the type's pools: the zones that hold the
        segment's replicas alone (it takes the least ring over them), else every zone's room."""
        room = ring_room(self.zone_gpus[seg.gpu], seg.tp_degree)
        alone = sorted(z for z, c in room.items() if c >= seg.dp_degree)
        return ("alone", tuple(alone)) if alone else ("spread", tuple(sorted(room.items())))

    def ring_row(self, seg: Segment) -> list[float]:
        """``ring_lb`` of the segment's GPU type, TP and DP degree at every depth 1..max_stages
        (index 0: inf), at once (``bounds.ring_rows_s``)."""
        row = self.memos.types.ring_rows.get((seg.gpu, seg.tp_degree, seg.dp_degree))
        if row is None:
            self.fill_ring_rows([seg])
            row = self.memos.types.ring_rows[(seg.gpu, seg.tp_degree, seg.dp_degree)]
        return row

    def fill_ring_rows(self, segs) -> None:
        """``ring_row`` of each segment of ``segs`` with more than one replica, the rows missing
        from the memos computed together per GPU type, TP degree and gradient: their degrees share
        the pairs of zones to time (``bounds.rings_s``; the widening pass asks for ~60 new degrees)."""
        memo, rings = self.memos.types.ring_rows, self.memos.process.rings
        missing: dict[tuple, dict[int, tuple]] = {}
        asked = set()
        for seg in segs:
            key = (seg.gpu, seg.tp_degree, seg.dp_degree)
            if seg.dp_degree <= 1 or key in memo or key in asked:
                continue
            asked.add(key)
            grad_bytes = min(v.total_params * v.regime.grad_bytes_per_param for v in self.figures.variants(seg.kind))
            full = ("sync", seg.gpu, seg.dp_degree, self.ring_zones(seg), self.max_stages, grad_bytes)
            row = rings.get(full)
            if row is not None:
                memo[key] = row
            else:
                missing.setdefault((seg.gpu, seg.tp_degree, grad_bytes), {})[seg.dp_degree] = (key, full)
        for (gpu, tp, grad_bytes), wanted in missing.items():
            rows = bounds.ring_rows_s(self.network, gpu, list(wanted), ring_room(self.zone_gpus[gpu], tp), grad_bytes,
                                      self.max_stages)
            for (key, full), row in zip(wanted.values(), rows):
                memo[key] = rings[full] = row

    def ring_lb(self, seg: Segment, num_stages: int) -> float:
        """The sync of a pipeline of ``num_stages`` holding this segment (``bounds.ring_rows_s``)."""
        return self.ring_row(seg)[num_stages] if seg.dp_degree > 1 else 0.0

    def sync_curve(self, seg: Segment) -> tuple[float, ...]:
        """The segment's slowest ring per share k / GRID of the blocks (``bounds.sync_curve_s``)."""
        memo = self.memos.types.sync_curves
        key = (seg.gpu, seg.tp_degree, seg.dp_degree, seg.num_stages)
        curve = memo.get(key)
        if curve is None:
            L = self.num_layers
            if seg.dp_degree <= 1 or L < 3:
                curve = memo[key] = (0.0,) * (bounds.GRID + 1)
                return curve
            blocks = min(layer_table(v.profile).params(1, L - 1) * v.regime.grad_bytes_per_param
                         for v in self.figures.variants(seg.kind))
            zones = self.ring_zones(seg)
            rings = self.memos.process.rings
            curve = rings.get(("sync curve", seg.gpu, seg.dp_degree, seg.num_stages, zones, blocks))
            if curve is None:
                # Every depth's at once (the same figures): a two-type search asks for most of them,
                # and one call for them all costs about what one costs (the floor row: 298 -> 74).
                depths = range(1, max(self.max_stages, seg.num_stages) + 1)
                curves = bounds.sync_curve_s(self.network, seg.gpu, seg.dp_degree,
                                             ring_room(self.zone_gpus[seg.gpu], seg.tp_degree), blocks, depths)
                for p, c in zip(depths, curves):
                    rings[("sync curve", seg.gpu, seg.dp_degree, p, zones, blocks)] = c
                curve = curves[seg.num_stages - 1]
            memo[key] = curve
        return curve

    def joint_lb(self, work_s: float, shape: tuple[Segment, ...], floor_s: float) -> float:
        """``bounds.joint_lb`` of a two-segment shape."""
        a, b = shape
        na, nb = a.num_microbatches, b.num_microbatches
        k1 = self.steady_links_s(a) * float(bounds.steady_share(na, nb))
        k2 = self.steady_links_s(b) * float(bounds.steady_share(nb, na))
        return bounds.joint_lb(floor_s, work_s / a.capacity, k1, self.sync_curve(a),
                               work_s / b.capacity, k2, self.sync_curve(b))

    # ---- whole blocks -----------------------------------------------------------------------

    def granular_busiest_s(self, shape: tuple[Segment, ...]) -> float:
        """A lower bound on the busiest stage of every split of ``shape`` (``bounds.granular_busiest_s``)."""
        memo = self.memos.types.granular
        key = tuple(sorted((s.num_stages, s.block_busy_s, s.head_busy_s) for s in shape))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = bounds.granular_busiest_s(key, self.num_blocks)
        return hit

    def granular_id(self, num_stages: int, block_s: float, head_s: float) -> int:
        """The process's number of a segment's granular figures (a two-segment shape's granular
        bound depends on them alone, and they recur from request to request)."""
        ids = self.memos.process.granular_ids
        return ids.setdefault((num_stages, block_s, head_s), len(ids))

    def granular_column(self, columns: dict, idx):
        """``granular_id`` of a list's segments ``idx`` (``scored.segment_columns``' "gid"; one type's
        -1 where not asked for yet: a seeded search refines a few hundred of its thousands, whereas
        two types' grids refine nearly every segment and are numbered with their columns)."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        gid, segs = columns["gid"], columns["segs"]
        got = gid[idx]
        if columns["alone"] and len(got) and got.min() < 0:
            need = np.flatnonzero(np.bincount(idx[got < 0], minlength=len(gid)))
            gid[need] = [self.granular_id(seg.num_stages, seg.block_busy_s, seg.head_busy_s)
                         for seg in (segs[i] for i in need.tolist())]
            got = gid[idx]
        return got

    def granular_of(self, a: dict, ia, b: dict, ib, *, steps: int | None = None, start=None):
        """``bounds.granular_many`` of the shapes (ia, ib) of two lists' columns (``scored``), each
        pair of segment numbers worked out once (in one batch: each shape's figures depend on its
        own inputs alone), kept by pair of numbers for the process; with ``steps``, the ends of
        each shape's interval after that many of its steps from ``start`` (``bounds.granular_steps``;
        not kept: the low end is a bound, and after ``GRANULAR_STEPS`` in all it is the bound)."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        if steps is not None:
            return bounds.granular_steps(a["stages"][ia], a["block"][ia], a["head"][ia], b["stages"][ib],
                                         b["block"][ib], b["head"][ib], self.num_blocks, steps, start=start)
        memo = self.memos.process.granular_bounds
        codes = self.granular_column(a, ia) * (1 << 32) + self.granular_column(b, ib)
        uniq, at, inverse = np.unique(codes, return_index=True, return_inverse=True)
        # Read and written a list at a time, nan where missing (code by code took a third of this
        # on the floor row, where nearly every code is new; the bounds are never nan).
        keys = uniq.tolist()
        known = np.array(list(map(memo.get, keys, itertools.repeat(math.nan))), dtype=float)
        miss = np.flatnonzero(np.isnan(known))
        if len(miss):
            m = at[miss]
            known[miss] = bounds.granular_many(a["stages"][ia[m]], a["block"][ia[m]], a["head"][ia[m]],
                                               b["stages"][ib[m]], b["block"][ib[m]], b["head"][ib[m]],
                                               self.num_blocks, iterations=GRANULAR_STEPS)
            if len(memo) > _GRANULAR_MEMO_SIZE:
                memo.clear()
            memo.update(zip(uniq[miss].tolist(), known[miss].tolist()))
        return known[inverse]

    def granular_ahead(self, batches: list[tuple]) -> None:
        """``granular_of``'s figures of several lists' shapes (``batches``: (a, ia, b, ib) each) put
        in its memo in one ``bounds.granular_many`` (each shape's figure depends on its own inputs
        alone): the micro-batch sizes' spaces each refine their first shapes, a few dozen each on
        the homogeneous rows, where numpy's cost per call is most of it."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        memo = self.memos.process.granular_bounds
        batches = [(a, ia, b, ib) for a, ia, b, ib in batches if len(ia)]
        if not batches:
            return
        codes = np.concatenate([self.granular_column(a, ia) * (1 << 32) + self.granular_column(b, ib)
                                for a, ia, b, ib in batches])
        uniq, at = np.unique(codes, return_index=True)
        miss = [j for j, c in enumerate(uniq.tolist()) if c not in memo]
        if miss:
            m = at[miss]
            columns = [np.concatenate([x[name][idx] for x, idx in cols])[m]
                       for cols in ([(a, ia) for a, ia, _, _ in batches], [(b, ib) for _, _, b, ib in batches])
                       for name in ("stages", "block", "head")]
            got = bounds.granular_many(*columns, self.num_blocks, iterations=GRANULAR_STEPS)
            if len(memo) > _GRANULAR_MEMO_SIZE:
                memo.clear()
            memo.update(zip(uniq[miss].tolist(), got.tolist()))


def _replica_pairs(a, b) -> tuple[tuple[str, str], ...]:
    """The distinct (zone of replica j of placement ``a``, zone of replica j of ``b``) over j (two
    stages of one segment: as many replicas each), from their runs of replicas per zone."""
    if len(a) == 1 and len(b) == 1:
        return ((a[0][0], b[0][0]),)
    if a == b:  # (whole pipelines per zone: every stage placed alike)
        return tuple([(z, z) for z, _ in a])
    out: dict = {}
    i = j = 0
    left_a, left_b = a[0][1], b[0][1]
    while i < len(a) and j < len(b):
        out[(a[i][0], b[j][0])] = None
        step = min(left_a, left_b)
        left_a, left_b = left_a - step, left_b - step
        if not left_a:
            i += 1
            left_a = a[i][1] if i < len(a) else 0
        if not left_b:
            j += 1
            left_b = b[j][1] if j < len(b) else 0
    return tuple(out)
