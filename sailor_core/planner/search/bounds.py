"""Lower bounds on a shape's iteration time and cost (see the package docstring)."""

from __future__ import annotations

import functools
import math

from sailor_core.planner.search.shapes import Segment

GRID = 8  # intervals of a segment's share of the blocks in the joint compute/sync bound


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
    import numpy as np

    if num_blocks <= 0:
        return np.zeros(len(sa))
    inv = np.where(sa > 0, sa / ra, 0.0) + np.where(sb > 0, sb / rb, 0.0)
    lo = num_blocks / inv
    hi = lo + np.where(sa > 0, ra + ha, 0.0) + np.where(sb > 0, rb + hb, 0.0)

    has_a, has_b = sa > 0, sb > 0
    ra1, rb1 = np.where(has_a, ra, 1.0), np.where(has_b, rb, 1.0)

    def fits(t):
        ka = np.where(has_a, np.floor(t / ra1 + 1e-9), 0.0)
        kb = np.where(has_b, np.floor(t / rb1 + 1e-9), 0.0)
        base = sa * ka + sb * kb
        # The last layer's stage loses the blocks its head time displaces (or cannot be it).
        loss_a = np.where(has_a & (t >= ha), ka - np.floor(np.maximum(t - ha, 0.0) / ra1 + 1e-9), np.inf)
        loss_b = np.where(has_b & (t >= hb), kb - np.floor(np.maximum(t - hb, 0.0) / rb1 + 1e-9), np.inf)
        return base - np.minimum(loss_a, loss_b) >= num_blocks

    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = fits(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return lo


def steady_links_s(num_microbatches: int, link_s: float, num_stages: int) -> float:
    """What links add, at the least, to the pipeline time of a segment beyond n sum(t) / s.

    In 1F1B (``schedule._longest``) a stage's path holds its step and (n - 1) times the mean
    of its and a neighbour's step plus their link l, so for the neighbours (t, t') with the
    largest sum an iteration lasts at least n (t + t') / 2 + (n - 1) l / 2, and at least
    n t_max.  The largest neighbour sum is at least (2 sum t - 2 t_max) / (s - 1); the least
    over t_max of the larger of the two is n sum(t) / s + (n - 1) l / 2 (s - 1) / s."""
    if num_stages < 2:
        return 0.0
    return (num_microbatches - 1) * link_s / 2 * (num_stages - 1) / num_stages


def pipeline_lines(floor_s, a1, k1, a2, k2, steps_a, steps_b, num_stages_a, num_stages_b, n_a, n_b, link_s):
    """Lower bounds on the pipeline time of a two-segment shape as lines in x, the share of the
    block work segment a does: (intercepts, slopes), numpy arrays with the lines on axis 0.

    ``floor_s``: a bound whatever the split.  Each segment's compute and links' steady state:
    a1 x + k1 and a2 (1 - x) + k2 (see ``joint_lb``).  Where the segments meet: in 1F1B
    (``schedule._longest``) each of the two boundary stages' paths holds its step and n - 1
    times the mean of both steps plus the link l, with its own n, so an iteration T lasts at
    least ((n_a + 1) t_a + (n_a - 1) t_b + (n_a - 1) l) / 2, and the same from b's side.  No
    stage is busier than T, so a boundary stage's step is at least its segment's step sum
    (x steps_a, (1 - x) steps_b: the work times the slowness) minus (stages - 1) T / n.  The
    least T meeting that is the largest of the linear solutions with each side counted or
    dropped: each a line in x.  ``PIPELINE_RISING`` / ``PIPELINE_FALLING`` name the lines
    that may rise / fall."""
    import numpy as np

    ones = np.ones_like(np.asarray(floor_s, dtype=float))
    us, vs = [floor_s * ones, k1 * ones, (a2 + k2) * ones], [0 * ones, a1 * ones, -a2 * ones]
    p, q = (num_stages_a - 1) / n_a, (num_stages_b - 1) / n_b
    for n, ca, cb in ((n_a, (n_a + 1) / 2, (n_a - 1) / 2), (n_b, (n_b - 1) / 2, (n_b + 1) / 2)):
        fixed = (n - 1) * link_s / 2
        d_a, d_b, d_ab = 1 + ca * p, 1 + cb * q, 1 + ca * p + cb * q
        us += [fixed * ones, fixed / d_a, (cb * steps_b + fixed) / d_b, (cb * steps_b + fixed) / d_ab]
        vs += [0 * ones, ca * steps_a / d_a, -cb * steps_b / d_b, (ca * steps_a - cb * steps_b) / d_ab]
    return np.array(us, dtype=float), np.array(vs, dtype=float)


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
    import numpy as np

    rise, fall = v > 0, v < 0
    i, j, i_rises, j_rises = line_pairs(len(u), rising, falling)
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
def line_pairs(num_lines: int, rising, falling):
    """Unordered pairs (i < j) of lines where one may rise while the other falls: (i, j, whether
    i may rise with j falling, whether j may rise with i falling), as numpy arrays."""
    import numpy as np

    may_rise = set(range(num_lines)) if rising is None else set(rising)
    may_fall = set(range(num_lines)) if falling is None else set(falling)
    pairs = [(a, b, a in may_rise and b in may_fall, b in may_rise and a in may_fall)
             for a in range(num_lines) for b in range(a + 1, num_lines)]
    pairs = [p for p in pairs if p[2] or p[3]]
    return (np.array([p[0] for p in pairs], dtype=int), np.array([p[1] for p in pairs], dtype=int),
            np.array([p[2] for p in pairs], dtype=bool), np.array([p[3] for p in pairs], dtype=bool))


@functools.lru_cache(maxsize=1 << 12)
def warm_up_coefficients(num_microbatches: int, num_stages: int) -> tuple[float, float]:
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
    import numpy as np

    if not isinstance(steps_s, np.ndarray):
        alpha, reached = warm_up_coefficients(int(num_microbatches), int(num_stages))
        return (steps_s - reached * link_s) / alpha
    n = np.asarray(num_microbatches, dtype=float)
    s = np.asarray(num_stages)
    keep = 1 - 1 / n
    reached = np.zeros(np.broadcast(n, s).shape)
    for k in range(int(np.max(s))):
        reached = np.where(k < s, reached * keep - k / n, reached)
    alpha = 1 - keep ** s
    return (steps_s - reached * link_s) / alpha


def pipe_work_rate(order: tuple[Segment, ...]) -> float:
    """Block work (in fastest-kind seconds per micro-batch) a pipeline of these segments, in this
    order, can hold per second of iteration.

    In 1F1B (``schedule._longest``) stage k's busiest replica needs at least
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
    import numpy as np

    held_a, held_b = inv_a * (1 - drain_a), inv_b * (1 - drain_b)  # each segment last, alone
    a_then_b = np.where(held_b >= inv_a, held_b, inv_a - (inv_a - held_b) * drain_a)
    b_then_a = np.where(held_a >= inv_b, held_a, inv_b - (inv_b - held_a) * drain_b)
    return np.maximum(a_then_b, b_then_a)
