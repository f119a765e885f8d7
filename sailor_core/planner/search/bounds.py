"""Lower bounds on the iteration time and cost of a shape, as pure functions.

Each takes the figures it needs and returns a number (or a numpy array, for the ``_many`` forms
that score many shapes at once).  What a bound leaves out only makes it lower: pruning a shape
whose bound cannot enter the top N is safe.  ``parts`` and ``egress`` memoise them per segment
for one search; ``tight`` composes them into a shape's bound; ``scored`` does the same with
numpy for every shape of one or two GPU types.  Reference: ``simulator/pipeline_time.py`` (1F1B),
``planner/fastsim.py`` (what a plan costs).

Time units: a *block* is a transformer block; *work* is in seconds of the fastest kind, per micro-batch
(``slowness`` scales it to a kind); a segment's ``capacity`` is ``stages / (micro-batches per replica x slowness)``.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

from sailor_core.network.model import Endpoint, ring_hop_pairs
from sailor_core.planner.search.shapes import Segment, orders
from sailor_core.simulator import compose
from sailor_core.simulator.stage import boundary_transfer_s, endpoint
from sailor_core.zones import ring_zone_order

GRID = 8  # intervals of a segment's share of the blocks in the joint compute/sync bound


# ---- compute: capacity, whole blocks, warm-up ----------------------------------------


def capacity_s(work_s: float, shape: tuple[Segment, ...]) -> float:
    """The iteration's compute at the least: every stage busy all the time, with fractions of
    blocks (``tau``): the block work over the shape's capacity."""
    cap = sum(s.capacity for s in shape)
    return work_s / cap


def granular_busiest_s(segments, num_blocks: int) -> float:
    """Smallest ``t`` such that stages of busy time at most ``t`` can hold every block whole.

    ``segments``: (stages, busy seconds per block, busy seconds of the last layer) per segment.
    A stage of busy time <= t holds at most floor(t / r) blocks, the one holding the last layer
    floor((t - h) / r); the capacity bound (``tau``) counts fractions of blocks, which on deep
    pipelines of a few blocks per stage and with the heavy LM head is 25-35 % too optimistic.
    Counts only change at the breakpoints k r and h + k r, so step through them from the
    fractional bound.  (The embedding is left out: a bound may ignore work.)
    """
    if num_blocks <= 0 or any(r <= 0 for _, r, _ in segments):
        return 0.0
    t = num_blocks / sum(n / r for n, r, _ in segments)
    while True:
        count, loss, nxt = 0, math.inf, math.inf
        for n, r, h in segments:
            k = int(t / r + 1e-9)
            count += n * k
            nxt = min(nxt, (k + 1) * r)
            if t >= h:
                kh = int((t - h) / r + 1e-9)
                loss = min(loss, k - kh)
                nxt = min(nxt, h + (kh + 1) * r)
            else:
                nxt = min(nxt, h)
        if loss < math.inf and count - loss >= num_blocks:
            return t
        t = nxt


def granular_many(sa, ra, ha, sb, rb, hb, num_blocks: int, iterations: int = 24):
    """``granular_busiest_s`` of many two-segment shapes at once (numpy bisection; an absent
    segment has 0 stages).  Returns the low end of the last interval: a bound, to ~1e-7."""
    return granular_steps(sa, ra, ha, sb, rb, hb, num_blocks, iterations)[0]


def granular_steps(sa, ra, ha, sb, rb, hb, num_blocks: int, iterations: int, start=None):
    """``granular_many``'s bisection: each shape's interval's (low, high) ends after ``iterations`` steps
    from ``start`` (else its first); the low end a bound after any step, steps in parts all at once's."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    if num_blocks <= 0:
        return np.zeros(len(sa)), np.zeros(len(sa))
    if start is None:
        inv = np.where(sa > 0, sa / ra, 0.0) + np.where(sb > 0, sb / rb, 0.0)
        lo = num_blocks / inv
        start = lo, lo + np.where(sa > 0, ra + ha, 0.0) + np.where(sb > 0, rb + hb, 0.0)
    lo, hi = start
    has_a, has_b = sa > 0, sb > 0
    ra1, rb1 = np.where(has_a, ra, 1.0), np.where(has_b, rb, 1.0)
    # One segment each (one GPU type): the same bits without the absent one's terms (+ 0.0, min with inf)
    one = bool(has_a.all()) and not has_b.any()
    for _ in range(iterations):
        t = 0.5 * (lo + hi)
        # Whether stages of busy time at most t hold every block whole (``granular_busiest_s``).
        if one:
            ka = np.floor(t / ra + 1e-9)
            base, loss = sa * ka, np.where(t >= ha, ka - np.floor(np.maximum(t - ha, 0.0) / ra + 1e-9), np.inf)
        else:
            ka = np.where(has_a, np.floor(t / ra1 + 1e-9), 0.0)
            kb = np.where(has_b, np.floor(t / rb1 + 1e-9), 0.0)
            base = sa * ka + sb * kb
            # The last layer's stage loses the blocks its head time displaces (or cannot be it).
            loss = np.minimum(np.where(has_a & (t >= ha), ka - np.floor(np.maximum(t - ha, 0.0) / ra1 + 1e-9), np.inf),
                              np.where(has_b & (t >= hb), kb - np.floor(np.maximum(t - hb, 0.0) / rb1 + 1e-9), np.inf))
        ok = base - loss >= num_blocks
        hi = np.where(ok, t, hi)
        lo = np.where(ok, lo, t)
    return lo, hi


def pipe_work_rate(order: tuple[Segment, ...]) -> float:
    """Block work (in fastest-kind seconds per micro-batch) a pipeline of these segments, in this
    order, can hold per second of iteration.

    In 1F1B (``simulator.pipeline_time``) stage k's busiest replica needs at least
    ``n_k t_k + sum_{j<k} t_j``: its own micro-batches, after the first one's forward through
    the stages before it and before the last one's backward through them.  For an iteration
    of T, the most work the stages can hold with every such path within T is a linear
    programme solved from the last stage back: a stage that holds anything takes all the time
    its path allows, ``(T - sum_{j<k} t_j) / n_k``, and holds that over its slowness; it is
    worth it while 1 / slowness beats what the time is worth to the stages after it.
    Capacity (``Segment.capacity``) is the same with the warm-up left out."""
    rate = 0.0
    for seg in reversed(order):
        inv = 1.0 / seg.slowness
        if rate < inv:
            rate = inv - (inv - rate) * (1 - 1 / seg.num_microbatches) ** seg.num_stages
    return rate


def pipe_work_rate_many(inv_a, drain_a, inv_b, drain_b):
    """``pipe_work_rate`` of many two-segment shapes at once, in the better of their two orders
    (numpy; per segment 1 / slowness and (1 - 1 / n) ** stages; an unused type: 0 and 1)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    held_a, held_b = inv_a * (1 - drain_a), inv_b * (1 - drain_b)  # each segment last, alone
    a_then_b = np.where(held_b >= inv_a, held_b, inv_a - (inv_a - held_b) * drain_a)
    b_then_a = np.where(held_a >= inv_b, held_a, inv_b - (inv_b - held_a) * drain_b)
    return np.maximum(a_then_b, b_then_a)


def pipe_lb(work_s: float, shape: tuple[Segment, ...]) -> float:
    """The pipeline's warm-up and cool-down: no iteration is shorter than ``pipe_work_rate``
    allows, in the better of the shape's orders."""
    return work_s / max(pipe_work_rate(order) for order in orders(shape))


@functools.lru_cache(maxsize=1 << 12)
def _warm_up_coefficients(num_microbatches: int, num_stages: int) -> tuple[float, float]:
    """(alpha, reached) of ``warm_up_with_links_s`` for one segment."""
    keep = 1 - 1 / num_microbatches
    reached = 0.0
    for k in range(num_stages):
        reached = reached * keep - k / num_microbatches
    return 1 - keep ** num_stages, reached


def warm_up_with_links_s(steps_s, num_microbatches, num_stages, link_s):
    """A lower bound on the pipeline time of one segment whose stage steps sum to ``steps_s``,
    with links of at least ``link_s`` between its stages (numpy arrays or floats).

    ``pipe_work_rate`` with the links: in 1F1B stage k's path holds the steps and the links
    before it and its own n steps, ``sum_{j<k} (t_j + l) + n t_k <= T``.  Every stage taking
    all the time its path allows holds the most; the step sum so reached is affine in T,
    alpha T - gamma l, with alpha = 1 - (1 - 1/n)^s (the warm-up bound) and gamma from the
    same recursion with T = 0, l = 1.  (Allowing negative steps only loosens it.)"""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    if not isinstance(steps_s, np.ndarray):
        alpha, reached = _warm_up_coefficients(int(num_microbatches), int(num_stages))
        return (steps_s - reached * link_s) / alpha
    n, s = np.asarray(num_microbatches, dtype=float), np.asarray(num_stages)
    keep, few = 1 - 1 / n, n.ndim == 1 and n.shape == s.shape and len(n) <= 128
    reached = np.array([_warm_up_coefficients(a, b)[1] for a, b in zip(n.tolist(), s.tolist())], dtype=float) \
        if few else np.zeros(np.broadcast(n, s).shape)  # (few: the scalar form's recursions, cached: cheaper)
    for k in range(0 if few else int(np.max(s))):
        reached = np.where(k < s, reached * keep - k / n, reached)
    alpha = 1 - keep ** s
    return (steps_s - reached * link_s) / alpha


# ---- links between stages -------------------------------------------------------------


def link_s(network, nbytes: float, zones_a, zones_b, gpu_a: str, tp_a: int, gpu_b: str, tp_b: int) -> float:
    """Activation forward and gradient back of one micro-batch of ``nbytes`` between a replica
    of (``gpu_a``, ``tp_a``) and one of (``gpu_b``, ``tp_b``), the least over every pair of their
    types' zones: the fastest link two stages of these types can have, given the smallest boundary
    activation of ``nbytes``.  (Not a shared zone's: the measured links differ by zone, and one
    inside a zone can be slower than another zone's, or than one between two zones; fastsim
    charges a boundary its slowest replica pair, which is no faster than the least pair.)"""
    return min(boundary_transfer_s(network, nbytes, endpoint(za, gpu_a, tp_a), endpoint(zb, gpu_b, tp_b))
               for za in sorted(zones_a) for zb in sorted(zones_b))


def link_lb(num_mb: int, shape: tuple[Segment, ...], link_s) -> float:
    """A link's steady state alone, (n - 1) l / 2, bounds the iteration (1F1B, ``simulator.pipeline_time``):
    inside a segment n = ceil(M / D); between segments the narrower side's NIC carries more.
    ``link_s(a, b)``: the link bound between replicas of segments a and b."""
    worst = 0.0
    for seg in shape:
        if seg.num_stages > 1:
            worst = max(worst, (seg.num_microbatches - 1) * link_s(seg, seg) / 2)
    for a, b in itertools.combinations(shape, 2):
        n = -(-num_mb // min(a.dp_degree, b.dp_degree))
        worst = max(worst, (n - 1) * min(link_s(a, b), link_s(b, a)) / 2)
    return worst


def steady_links_s(num_microbatches, link_s, num_stages):
    """What links add, at the least, to the pipeline time of a segment beyond n sum(t) / s (numpy
    arrays of segments, or numbers).

    In 1F1B (``simulator.pipeline_time``) a stage's path holds its step and (n - 1) times the mean
    of its and a neighbour's step plus their link l, so for the neighbours (t, t') with the
    largest sum an iteration lasts at least n (t + t') / 2 + (n - 1) l / 2, and at least
    n t_max.  The largest neighbour sum is at least (2 sum t - 2 t_max) / (s - 1); the least
    over t_max of the larger of the two is n sum(t) / s + (n - 1) l / 2 (s - 1) / s."""
    if type(num_stages) is int or not hasattr(num_stages, "shape"):  # (a number: as each element below)
        return 0.0 if num_stages < 2 else (num_microbatches - 1) * link_s / 2 * (num_stages - 1) / num_stages
    return (num_microbatches - 1) * link_s / 2 * (num_stages - 1) / num_stages * (num_stages >= 2)


def steady_share(n_own, n_other):
    """The share of ``steady_links_s`` a segment keeps beside one whose replicas get ``n_other``
    micro-batches each: 1 with equal counts.  The engine's lookahead counts in the widest stage's
    micro-batches (``runtime/pipeline_order``), so a segment with fewer replicas runs more
    warm-up forwards and its neighbour pairs' cycles span n_own / min(n_own, n_other) + 1 of its
    micro-batches instead of 2 (``simulator.pipeline_time``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    n_own = np.asarray(n_own, dtype=float)
    return 2 / (n_own / np.minimum(n_own, n_other) + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSide:
    """One segment of two-segment shapes as ``pipeline_lines`` sees it (numpy columns, one value
    per shape, or floats): ``compute_s`` its compute were it to do all the block work (the
    slope of a1 x), ``steady_links_s`` its links' steady state, ``steps_s`` its step sum at all
    the work (the work times the slowness), its stages and micro-batches."""

    compute_s: Any
    steady_links_s: Any
    steps_s: Any
    num_stages: Any
    num_microbatches: Any


def pipeline_lines(floor_s, side_a: PipelineSide, side_b: PipelineSide, link_s):
    """Lower bounds on the pipeline time of a two-segment shape as lines in x, the share of the
    block work segment a does: (intercepts, slopes), numpy arrays with the lines on axis 0.

    ``floor_s``: a bound whatever the split.  Each segment's compute and links' steady state:
    a1 x + k1 and a2 (1 - x) + k2 (see ``joint_lb``; a1, k1: ``side_a``'s ``compute_s``,
    ``steady_links_s``).  Where the segments meet: in 1F1B
    (``simulator.pipeline_time``) each of the two boundary stages' paths holds its step and n - 1
    times the mean of both steps plus the link l, with its own n, so an iteration T lasts at
    least ((n_a + 1) t_a + (n_a - 1) t_b + (n_a - 1) l) / 2, and the same from b's side.  No
    stage is busier than T, so a boundary stage's step is at least its segment's step sum
    (x steps_a, (1 - x) steps_b: the work times the slowness) minus (stages - 1) T / n.  The
    least T meeting that is the largest of the linear solutions with each side counted or
    dropped: each a line in x.  ``PIPELINE_RISING`` / ``PIPELINE_FALLING`` name the lines
    that may rise / fall."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    a1, a2, steps_a, steps_b = side_a.compute_s, side_b.compute_s, side_a.steps_s, side_b.steps_s
    num_stages_a, num_stages_b, n_a, n_b = (side_a.num_stages, side_b.num_stages, side_a.num_microbatches,
                                            side_b.num_microbatches)
    ones = np.ones_like(np.asarray(floor_s, dtype=float))
    k1, k2 = side_a.steady_links_s * steady_share(n_a, n_b), side_b.steady_links_s * steady_share(n_b, n_a)
    us, vs = [floor_s * ones, k1 * ones, (a2 + k2) * ones], [0 * ones, a1 * ones, -a2 * ones]
    p, q = (num_stages_a - 1) / n_a, (num_stages_b - 1) / n_b
    (own_a, other_a), (own_b, other_b) = (_boundary_coefficients(n_a, n_b, num_stages_a, num_stages_b),
                                          _boundary_coefficients(n_b, n_a, num_stages_b, num_stages_a))
    for ca, cb, paired in ((own_a, other_a, other_a), (other_b, own_b, other_b)):
        fixed = paired * link_s
        d_a, d_b, d_ab = 1 + ca * p, 1 + cb * q, 1 + ca * p + cb * q
        us += [fixed * ones, fixed / d_a, (cb * steps_b + fixed) / d_b, (cb * steps_b + fixed) / d_ab]
        vs += [0 * ones, ca * steps_a / d_a, -cb * steps_b / d_b, (ca * steps_a - cb * steps_b) / d_ab]
    return np.array(us, dtype=float), np.array(vs, dtype=float)


def _boundary_coefficients(n_own, n_other, stages_own, stages_other):
    """(coefficient of the boundary stage's own step, of its neighbour's step and of the link)
    in a lower bound on the iteration from the boundary stage's path (``pipeline_time``): it
    runs w warm-up forwards (at most the stages after it, in either order of the two segments,
    times its ``spread``)
    and w + 1 steps before its steady state, whose ``pairs = n - 1 - w`` steps the neighbour
    pair's cycle paces: a cycle carries both steps and the link and spans ``span`` of its
    micro-batches (2 with equal replica counts), so T >= (w + 1) t + (pairs + 1 - span) / span
    (t + t' + l).  The coefficients are the least over w, so the line holds whatever w is."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    n_own = np.asarray(n_own, dtype=float)
    spread = n_own / np.minimum(n_own, n_other)  # the lookahead counts the widest stage's micro-batches
    span = spread + 1
    most_w = np.minimum(np.floor(np.maximum(stages_other, stages_own - 1) * spread), n_own - 1)
    own = np.maximum(1.0, n_own / span)
    other = np.maximum(0.0, n_own - most_w - span) / span
    return own, other


# pipeline_lines' order: floor, a's compute, b's compute, then per boundary side: the link
# alone (flat), a's step (rises), b's step (falls), both (either).
PIPELINE_RISING, PIPELINE_FALLING = (1, 4, 6, 8, 10), (2, 5, 6, 9, 10)


def min_max_lines(u, v, intervals, rising=None, falling=None):
    """For each interval [lo, hi]: the least over x in it of the largest line u + v x, per
    column (numpy; lines on axis 0).  The largest line is convex in x: its least is where the
    rising and falling lines cross, the largest of any rising/falling pair's crossing, unless
    that lies outside the interval, where the rising lines at lo or the falling ones at hi
    decide; flat lines count throughout.  ``rising`` / ``falling``: the only lines that may
    rise / fall (indices; default all), to pair fewer."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    rise, fall = v > 0, v < 0
    i, j, i_rises, j_rises = _line_pairs(len(u), rising, falling)
    # A pair's crossing, (v_i u_j - v_j u_i) / (v_i - v_j), is the same number either way
    # round, so each unordered pair is computed once and counts if either line may rise
    # while the other falls.
    ui, vi, uj, vj = u[i], v[i], u[j], v[j]
    with np.errstate(divide="ignore", invalid="ignore"):
        pair = (vi * uj - vj * ui) / (vi - vj)
    counts = (i_rises[:, None] & rise[i] & fall[j]) | (j_rises[:, None] & rise[j] & fall[i])
    cross = np.where(counts, pair, -np.inf).max(axis=0) if len(i) else np.full(u.shape[1:], -np.inf)
    flat = np.where(rise | fall, -np.inf, u).max(axis=0)
    base = np.maximum(cross, flat)
    r = slice(None) if rising is None else list(rising)
    f = slice(None) if falling is None else list(falling)
    up_u, up_v = np.where(rise[r], u[r], -np.inf), np.where(rise[r], v[r], 0.0)
    down_u, down_v = np.where(fall[f], u[f], -np.inf), np.where(fall[f], v[f], 0.0)
    return [np.maximum(base, np.maximum((up_u + up_v * lo).max(axis=0), (down_u + down_v * hi).max(axis=0)))
            for lo, hi in intervals]


@functools.lru_cache(maxsize=64)
def _line_pairs(num_lines: int, rising, falling):
    """Unordered pairs (i < j) of lines where one may rise while the other falls: (i, j, whether
    i may rise with j falling, whether j may rise with i falling), as numpy arrays."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    may_rise = set(range(num_lines)) if rising is None else set(rising)
    may_fall = set(range(num_lines)) if falling is None else set(falling)
    pairs = [(a, b, a in may_rise and b in may_fall, b in may_rise and a in may_fall)
             for a in range(num_lines) for b in range(a + 1, num_lines)]
    pairs = [p for p in pairs if p[2] or p[3]]
    return (np.array([p[0] for p in pairs], dtype=int), np.array([p[1] for p in pairs], dtype=int),
            np.array([p[2] for p in pairs], dtype=bool), np.array([p[3] for p in pairs], dtype=bool))


# ---- gradient sync: data-parallel rings -------------------------------------------------


def rings_s(network, gpu: str, dp_degrees, room: dict[str, int], nbytes):
    """Per ``d`` of ``dp_degrees`` (a row each; every pair of zones timed once for all), the fastest ring
    ``d`` replicas of ``gpu`` can form, for each of ``nbytes`` (numpy): a ring in one zone with ``room``
    (replicas each zone has room for) for them all, else one over a set of zones that has room.  A ring
    is paced by the slowest of its hops (as ``NetworkModel`` times it), and the planner visits a ring's
    zones in ring order (``placement``), so over a set of zones it is at least the ring whose every hop
    is the slowest between zones next to each other in that order."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    nb, d, zones = np.asarray(nbytes, dtype=float), np.asarray(dp_degrees), tuple(sorted(room))
    fits = np.array([room[z] for z in zones])[None, :] >= d[:, None]
    out, alone, tail = np.empty((len(d), *nb.shape)), fits.any(axis=1), (1,) * nb.ndim
    own, pairs, sets = _zone_sets(gpu, zones)
    if alone.any():
        times = network.paced_allreduce_times_many(nb, own, d[alone])
        out[alone] = np.where(fits[alone].T.reshape(*times.shape[:2], *tail), times, np.inf).min(axis=0)
    if not alone.all():
        # The sets of zones share their hops: every (sender, receiver) pair is timed once, all at
        # once (one numpy pass instead of one per pair), then each set's ring is its slowest hop.
        held = np.array([sum([room[z] for z in combo]) for combo, _ in sets])[:, None] >= d[~alone][None, :]
        assert held.any(axis=0).all(), "a segment's replicas fit its GPU type's zones"
        times = network.paced_allreduce_times_many(nb, pairs, d[~alone])
        worst = times[np.array([hops for _, hops in sets])].max(axis=1)
        out[~alone] = np.where(held.reshape(*held.shape, *tail), worst, np.inf).min(axis=0)
    return out


@functools.lru_cache(maxsize=256)
def _zone_sets(gpu: str, zones: tuple[str, ...]) -> tuple[tuple, tuple, tuple]:
    """(each zone's endpoint of ``gpu`` with itself, every (sender, receiver) pair a ring over a set
    of two or more of ``zones`` (sorted) uses in ring order, ((set, indices of its pairs), ...) padded
    with a pair of the set's own to one length): one tuple a call, whose links the network keeps."""
    pairs: dict[tuple[str, str], int] = {}
    sets = []
    for size in range(2, len(zones) + 1):
        for combo in itertools.combinations(zones, size):
            sets.append((combo, [pairs.setdefault(p, len(pairs)) for p in ring_hop_pairs(ring_zone_order(combo))]))
    widest = max((len(hops) for _, hops in sets), default=0)
    at = {z: Endpoint(zone=z, gpu=gpu) for z in zones}
    return (tuple((at[z], at[z]) for z in zones), tuple((at[a], at[b]) for a, b in pairs),
            tuple((combo, tuple(hops + hops[:1] * (widest - len(hops)))) for combo, hops in sets))


def ring_rows_s(network, gpu: str, dp_degrees, room: dict[str, int], grad_bytes: float,
                max_stages: int) -> list[list[float]]:
    """Per degree of ``dp_degrees``, the sync of a pipeline of P = 1..max_stages stages (index 0: inf): its
    largest stage holds >= 1/P of ``grad_bytes``, its ring at best ``rings_s`` (up to TP-sharding rounding)."""
    shares = [grad_bytes / p for p in range(1, max_stages + 1)]
    return [[math.inf, *row] for row in rings_s(network, gpu, dp_degrees, room, shares).tolist()]


def sync_curve_s(network, gpu: str, dp_degree: int, room: dict[str, int], blocks_grad_bytes: float,
                 stage_counts) -> list[tuple[float, ...]]:
    """Per stage count of ``stage_counts``, the slowest ring of a segment of that many stages holding
    k / GRID of the blocks (gradient ``blocks_grad_bytes``), k = 0..GRID: one stage holds >= 1 / stages of it."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    shares = blocks_grad_bytes * np.arange(GRID + 1) / GRID  # (one call for all: the same figures)
    rings = rings_s(network, gpu, [dp_degree], room, np.concatenate([shares / n for n in stage_counts]))[0]
    return [tuple(row) for row in rings.reshape(len(stage_counts), GRID + 1).tolist()]


def sync_lb(shape: tuple[Segment, ...], ring_lb) -> float:
    """An iteration's gradient sync at the least: the least over the shape's segments of the ring of the
    largest stage (``ring_lb(seg, depth)``); 0 where a segment has one replica per stage (it may hold all)."""
    num_stages = sum(s.num_stages for s in shape)
    if any(seg.dp_degree == 1 for seg in shape):
        return 0.0
    return min(ring_lb(seg, num_stages) for seg in shape)


# ---- compute, links and sync together (two segments) -------------------------------------


def joint_lb(floor_s: float, a1: float, k1: float, s1, a2: float, k2: float, s2) -> float:
    """Compute, links and gradient sync together, for a shape of two segments.

    An iteration lasts at least its pipeline plus its slowest ring (fastsim: the pipeline,
    then each stage's sync).  A segment doing the share x of the block work has stages whose
    steps sum to at least x work slowness, so its pipeline lasts at least ``a x`` (a: the work
    over its capacity) plus its links' steady state ``k`` (``steady_links_s``), and its ring at
    least its sync curve ``s`` (``sync_curve_s``) at x: shifting work to one segment to shorten
    the other's ring or pipeline lengthens its own; the bound is the best x (over the GRID
    intervals, each ring at its interval's low end).  ``floor_s`` already bounds the pipeline
    (capacity, granular, links, warm-up).  (``scored`` also counts where the segments meet.)"""
    balanced = (a2 + k2 - k1) / (a1 + a2)
    best = math.inf
    for k in range(GRID):
        x = min(max(balanced, k / GRID), (k + 1) / GRID)
        best = min(best, max(floor_s, a1 * x + k1, a2 * (1 - x) + k2) + max(s1[k], s2[GRID - 1 - k]))
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class JointSide:
    """One segment of a two-segment shape as ``joint_cost_lb`` sees it: its compute were it to do
    all the block work (``compute_s``), its links' steady state (``steady_links_s``), its rings'
    ``sync_curve`` (per GRID point of its share) and their egress at all the work (``ring_usd``)."""

    compute_s: float
    steady_links_s: float
    sync_curve: Any
    ring_usd: float


def joint_cost_lb(floor_s: float, side_a: JointSide, side_b: JointSide, usd_per_hr: float,
                  fixed_usd: float) -> float:
    """USD per iteration of a two-segment shape: rent over ``joint_lb``'s time and the egress of
    its rings together, ``fixed_usd`` (its p2p) added.  ``e1``, ``e2`` (the sides' ``ring_usd``):
    the rings' egress of each segment were it to do all the block work; the segment doing the share x holds at least x of
    the blocks (``Space.num_blocks_lb``), whose gradient its rings carry across zones if they
    must: shifting blocks to the segment whose rings stay in a zone saves egress but lengthens
    its pipeline.  On each GRID interval the cost is convex and piecewise linear in x, so its
    least is at an end or where two of its pieces meet."""
    a1, k1, s1, e1 = side_a.compute_s, side_a.steady_links_s, side_a.sync_curve, side_a.ring_usd
    a2, k2, s2, e2 = side_b.compute_s, side_b.steady_links_s, side_b.sync_curve, side_b.ring_usd
    per_s = usd_per_hr / 3600
    best = math.inf
    for k in range(GRID):
        lo, hi = k / GRID, (k + 1) / GRID
        ring = max(s1[k], s2[GRID - 1 - k])
        for x in (lo, hi, (a2 + k2 - k1) / (a1 + a2), (floor_s - k1) / a1, 1 - (floor_s - k2) / a2):
            x = min(max(x, lo), hi)
            usd = per_s * (max(floor_s, a1 * x + k1, a2 * (1 - x) + k2) + ring) + e1 * x + e2 * (1 - x)
            if usd < best:
                best = usd
    return best + fixed_usd


# ---- egress: rings and micro-batches that must cross zones --------------------------------


def ring_egress_usd_per_byte(network, pools: dict[str, int], tp_degree: int, dp_degree: int, rule: str) -> float:
    """USD per gradient byte (whole-model bytes, TP shards counted whole) a segment's rings
    send across zones, 0 when they can stay in a zone.  When no zone of ``pools`` holds
    ``dp_degree`` replicas, or under the pipeline rule (only searched for segments no zone
    holds whole, so its pipelines span zones), every stage's ring spans two zones or more,
    each boundary carrying 2 (d - 1) / d of the stage's gradient times its TP degree (as
    fastsim charges it), at the cheapest price between two of the zones, both ways."""
    live = sorted(z for z, n in pools.items() if n > 0)
    per_byte = 0.0
    if dp_degree > 1 and len(live) > 1 and (rule == "pipeline" or dp_degree > max(
            pools[z] // tp_degree for z in live)):
        price = min(network.egress_usd_per_byte(a, b) for a in live for b in live if a != b)
        per_byte = compose.ring_egress_usd_per_byte_lb(dp_degree, price)
    return per_byte


def rings_egress_lb(usd_per_byte, num_stages, whole_bytes: float, block_bytes: float) -> float:
    """USD per iteration of the gradient rings that must cross zones, for a shape of segments
    (one per GPU type) with rings at ``usd_per_byte`` (``ring_egress_usd_per_byte``) and
    ``num_stages`` stages each.  One segment holds the whole model's gradient (``whole_bytes``);
    of several, each holds at least a block (``block_bytes``, or the embedding) per stage but
    one and together the whole model, so the cheapest split gives each its least and puts the
    rest on the cheapest rings."""
    if len(usd_per_byte) == 1:
        return usd_per_byte[0] * whole_bytes
    least = [(n - 1) * block_bytes for n in num_stages]
    cheapest = min(usd_per_byte)
    return cheapest * whole_bytes + sum((f - cheapest) * b for f, b in zip(usd_per_byte, least))


def rings_egress_lb_many(fa, fb, stages_a, stages_b, both, whole_bytes: float, block_bytes: float):
    """``rings_egress_lb`` of many shapes at once (numpy; ``both``: the shape has two segments,
    else the absent one's figures are 0)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    least_a, least_b = (stages_a - 1) * block_bytes, (stages_b - 1) * block_bytes
    return np.where(both, np.where(fa <= fb, fa * whole_bytes + (fb - fa) * least_b,
                                   fb * whole_bytes + (fa - fb) * least_a),
                    (fa + fb) * whole_bytes)


def boundary_crossings(num_mb: int, zones: list[str], routes_a: list, routes_b: list):
    """Micro-batches that must cross zones where a segment of ``routes_a`` meets one of ``routes_b``
    (0 where unknown), or None when no route is known: (a numpy matrix over the distinct routes, each
    route's row, each route's column), route i of ``routes_a`` meeting j: ``matrix[rows[i], cols[j]]``.

    A route is "one zone" (every stage of the segment in one zone, which at best is the zone
    the other segment routes the most micro-batches to), None (unknown), or the replicas per
    zone of every stage (the pipeline rule: the same whatever comes before), so micro-batch m
    goes from replica m mod D to replica m mod D' between known zones (``p2p_pairs``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    m = np.arange(num_mb)
    (ia, ra), (ib, rb) = _route_rows(routes_a, zones, m), _route_rows(routes_b, zones, m)
    if not (len(ra) or len(rb)):
        return None
    # Crossings between rows, and with a one-zone stage (the row / column after them; two one-zone
    # stages may share a zone; the last: unknown): per zone, which micro-batches each row has there
    # (summed products count those two rows keep in a zone, exact; ``einsum``: BLAS threads cost more).
    in_a, in_b = ([(rows == z).astype(np.int32) for z in range(len(zones))] for rows in (ra, rb))
    crossing = np.zeros((len(ra) + 2, len(rb) + 2))
    crossing[:-2, :-2] = len(m) - sum(np.einsum("im,jm->ij", x, y) for x, y in zip(in_a, in_b))
    if len(ra):
        crossing[:-2, -2] = len(m) - np.max([x.sum(axis=1) for x in in_a], axis=0)  # off the busiest zone
    if len(rb):
        crossing[-2, :-2] = len(m) - np.max([y.sum(axis=1) for y in in_b], axis=0)
    return (crossing, np.where(ia == -2, len(ra), np.where(ia == -1, len(ra) + 1, ia)),
            np.where(ib == -2, len(rb), np.where(ib == -1, len(rb) + 1, ib)))


def _route_rows(routes: list, zones: list[str], m):
    """(per route: its row, -2 for one zone a stage, -1 unknown; rows: the zone index of each
    micro-batch ``m``)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    index, rows, seen = [-1] * len(routes), [], {}
    for i, key in enumerate(routes):
        if key is None:
            continue
        if key == "one zone":
            index[i] = -2
            continue
        if key not in seen:
            of_replica = np.array([zones.index(z) for z, n in key for _ in range(n)])
            seen[key] = len(rows)
            rows.append(of_replica[m % len(of_replica)])
        index[i] = seen[key]
    return np.array(index, dtype=int), np.array(rows, dtype=int).reshape(len(rows), len(m))


# ---- the whole request ------------------------------------------------------------------


def ideal_iteration(gpu_s: float, num_gpus: int, min_usd_per_gpu_hr: float) -> tuple[float, float]:
    """(iteration s, USD per iteration) at the least of a batch needing ``gpu_s`` GPU-seconds
    (each layer of each micro-batch on its fastest kind, times that kind's TP degree) on
    ``num_gpus`` GPUs: every GPU busy the whole iteration, with no bubble, link or sync, at the
    cheapest price."""
    return gpu_s / num_gpus, gpu_s * min_usd_per_gpu_hr / 3600
