"""Bounds of a shape of one segment from the segment's own placement: placed alone (no stage
before it) its stages' zones are known before its split (``shapes.place_run``), where the bounds
of ``bounds`` take the fastest zones the type's pools allow.  Deep pipelines simulated 2-7
times their bound without this one and the search evaluated hundreds of them to prove them worse
(geo AE row 0: 325 shapes in its main search, 102 with it).

``blocked_pipeline_s``: frameworks whose sends block (``compose.p2p_schedule`` "blocking":
DeepSpeed's pipeline engine, the regimes of Sailor's measured runs) spend both directions of
both their links on every micro-batch, on top of their own step (``simulator.pipeline_time``),
so a stage pays its links ``n - 1`` times; the prefetch-based link bounds
(``bounds.steady_links_s``, ``bounds.warm_up_with_links_s``) count a quarter of that, over the
fastest link only.  (A ring bound over a stage's placed zones was tried too: it cost more to
compute for every segment than the evaluations it saved, docs/benchmarks/planner.md.)

``blocked_pair_many``: the same per-stage argument for shapes of two segments, whose stages'
zones are not known before placement, so every link is taken at its ``link_s``; in numpy, for the
two types' scoring (``scored._with_blocked_pair``).
"""

from __future__ import annotations

from typing import Sequence


def blocked_pipeline_s(steps_s: float, num_microbatches: int, links_s: Sequence[float]) -> float:
    """A lower bound on the blocking 1F1B pipeline time of one segment (every stage's replicas
    get ``num_microbatches`` = n each) whose stage steps sum to at least ``steps_s``, with
    link k (between stages k and k + 1) taking at least ``links_s[k]``.

    Stage k's candidate ``T_k = B_k + G_k + b_k + S_k + w_k C_k`` (``pipeline_time``) is, under
    the blocking schedule, at least ``c_k + n t_k``, ``c_k = sum_{j<k} l_j + (n - 1)(l_{k-1} +
    l_k) + l_k / 2``: its warm-up forwards, steady pairs and cool-down backwards are its n
    micro-batches, each paying both its links (``G_k >= f + l_k/2 + w (f + lam_in + lam_out)``,
    ``S_k >= (n - 1 - w) (t + l_in + l_out)``, ``C_k >= b + lam_in + lam_out``).  Every
    candidate bounds the pipeline, so T is at least every ``c_k`` (a stage's links are paid
    whatever its share: every stage holds a layer, as ``blocked_pair_many``'s), and the split
    decides the ``t_k``: ``sum_k (T - c_k) / n >= steps_s``, the steps poured over every stage's
    link part, ``T = max(max_k c_k, (n steps_s + sum_k c_k) / S)``.  (Whole blocks per stage
    would raise it further on the AE rows: not taken, docs/benchmarks/planner.md's sixteenth pass.)"""
    n = num_microbatches
    m = n - 1
    costs: list[float] = []
    append = costs.append
    before = l_in = 0.0
    for l_out in links_s:  # stage k's links: l_in = links_s[k - 1], l_out = links_s[k]
        append(before + m * (l_in + l_out) + l_out / 2)
        before += l_out
        l_in = l_out
    append(before + m * l_in)  # (the last stage: no link out, l_out = 0 adds exactly nothing)
    return max(max(costs), (steps_s * n + sum(costs)) / len(costs))


def blocked_pair_many(work_s: float, first: tuple, second: tuple, links_between):
    """A lower bound on the blocking 1F1B pipeline of shapes of two segments, in numpy, the lesser
    of their two orders: ``first``, ``second`` each (stages, micro-batches per replica, slowness,
    own link) as arrays, one entry per shape; ``links_between`` the link where they meet.

    Every stage k of a blocking pipeline is at least ``c_k + n_k t_k`` with ``c_k = sum_{j<k} l_j
    + (n_k - 1)(l_{k-1} + l_k) + l_k / 2`` (``blocked_pipeline_s``: its own micro-batches, whatever
    the other stages' counts), so the pipeline T is at least every ``c_k`` (every stage holds
    a layer, so it pays its links: a stage of no work would not), and the steps of a segment's stages hold its share of the reference
    work at its slowness, ``t_k >= (work on k) x slowness``: summed, ``sum_k (T - c_k) / (n_k
    slowness_k) >= W``.  The split (and each segment's share) is free, so the bound is the larger
    of the largest ``c_k`` and the level ``(W + sum_k w_k c_k) / sum_k w_k``, ``w_k = 1 / (n_k
    slowness_k)``.  Where a stage of few replicas meets many (a V100 stage of 171 micro-batches
    per replica before A100 stages of 43: each micro-batch pays the link both ways), the
    compute-and-prefetch bounds saw a quarter of the links and the floor row's two-type shapes
    simulated 1.6-2.6x their bound."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    return np.minimum(_blocked_ordered(work_s, first, second, links_between),
                      _blocked_ordered(work_s, second, first, links_between))


def _blocked_ordered(work_s: float, first: tuple, second: tuple, l_xy):
    """``blocked_pair_many`` of one order, ``first``'s stages then ``second``'s, each segment's
    stages as three classes (its first stage, its middle ones, its last), a class's link part
    that of its first stage (the least of the class: the links before a stage only add)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    sx, nx, slow_x, lxx = first
    sy, ny, slow_y, lyy = second
    mx, my = nx - 1, ny - 1
    one_x, one_y = sx == 1, sy == 1
    y0 = (sx - 1) * lxx + l_xy  # the links before the second segment's first stage
    cost = np.stack([
        np.where(one_x, mx * l_xy + l_xy / 2, mx * lxx + lxx / 2),  # the first's first stage
        lxx + 2 * mx * lxx + lxx / 2,  # its middle ones (sx - 2)
        (sx - 1) * lxx + mx * (lxx + l_xy) + l_xy / 2,  # its last (sx > 1)
        y0 + np.where(one_y, my * l_xy, my * (l_xy + lyy) + lyy / 2),  # the second's first stage
        y0 + lyy + 2 * my * lyy + lyy / 2,  # its middle ones (sy - 2)
        y0 + (sy - 1) * lyy + my * lyy])  # its last (sy > 1)
    count = np.stack([np.ones(len(sx)), np.maximum(sx - 2, 0), ~one_x, np.ones(len(sx)), np.maximum(sy - 2, 0), ~one_y])
    wx, wy = 1.0 / (nx * slow_x), 1.0 / (ny * slow_y)
    weight = count * np.stack([wx, wx, wx, wy, wy, wy])
    level = (work_s + (weight * cost).sum(axis=0)) / weight.sum(axis=0)
    return np.maximum(level, np.where(count > 0, cost, 0.0).max(axis=0))
