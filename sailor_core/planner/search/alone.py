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
"""

from __future__ import annotations

from typing import Sequence


def blocked_pipeline_s(steps_s: float, num_microbatches: int, links_s: Sequence[float]) -> float:
    """A lower bound on the blocking 1F1B pipeline time of one segment (every stage's replicas
    get ``num_microbatches`` = n each) whose stage steps sum to at least ``steps_s``, with
    link k (between stages k and k + 1) taking at least ``links_s[k]``.

    Stage k's candidate ``T_k = B_k + G_k + b_k + S_k + w_k C_k`` (``pipeline_time``) is, under
    the blocking schedule, at least ``sum_{j<k} l_j + n t_k + (n - 1)(l_{k-1} + l_k) + l_k / 2``:
    its warm-up forwards, steady pairs and cool-down backwards are its n micro-batches, each
    paying both its links (``G_k >= f + l_k/2 + w (f + lam_in + lam_out)``, ``S_k >= (n - 1 - w)
    (t + l_in + l_out)``, ``C_k >= b + lam_in + lam_out``).  Every candidate bounds the pipeline;
    the split decides the ``t_k``, so the bound is the least level T with ``sum_k max(0, T -
    c_k) / n >= steps_s`` (c_k the link part): the steps poured over the stages' link parts."""
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
    costs.sort()
    need = steps_s * n
    total = 0.0
    last = len(costs) - 1
    for i in range(last):
        total += costs[i]
        level = (need + total) / (i + 1)
        if level <= costs[i + 1]:
            return level
    return (need + (total + costs[last])) / (last + 1)

