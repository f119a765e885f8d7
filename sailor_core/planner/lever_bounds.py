"""What the lever phase (``levers``) can leave out, proven: the sync a placed shape ends on at the
least, which the ``pays`` rungs' bounds add (``least_sync_s``, ``synced_tight``), a two-stage
shape's pipeline and sync at one boundary together (``two_stage_s``), and the stronger
settings that cannot score ``MIN_GAIN`` better, which ``strengthen`` and ``relax`` do not try
(``zero_cannot_pay``, ``stronger_cannot_pay``).  docs/benchmarks/planner.md ("rungbound", "h0rest")."""

from __future__ import annotations

import math

from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.planner.search.shape_bound import ShapeBounds
from sailor_core.simulator import compose
from sailor_core.simulator.levers import zero_sync_factor
from sailor_core.simulator.memory import dp_synced_params
from sailor_core.simulator.stage import (boundary_transfer_s, endpoint, member_runs,
                                         stage_dp_sync_runs_least_s, stage_update_s, tied_sync_bytes, tied_sync_runs_s)
from sailor_core.simulator.tables import layer_table

# A stronger setting on a stage that fits without it is kept only when the plan's score gains more
# than this (relative): below it the lever is noise that a note could only call "+0.0 % faster".
MIN_GAIN = 1e-3


def synced_tight(bounds: ShapeBounds, space, shape, busiest: float, t_lb: float, sync_s: float):
    """``ShapeBounds.tight`` of a shape whose iteration lasts at least ``t_lb`` and ends, after its
    pipeline (at least ``floor_s``), on a sync of at least ``sync_s`` (``compose.iteration_s``)."""
    if sync_s > 0:
        t_lb = max(t_lb, bounds.time_lb(space, shape, busiest, t_lb)[1] + sync_s)
    return bounds.tight(space, shape, busiest, known=(t_lb, 0.0))


def least_sync_s(searcher: Searcher, placed, zero_stage: int) -> float:
    """The least gradient sync that ends an iteration of ``placed`` (stages of plain kinds, placed
    in their zones), whatever its split and with any ZeRO stage up to ``zero_stage``: the largest
    over its stages of the ring over its own zones (as the plan's stage runs it,
    ``stage.stage_dp_sync_runs_s``) of the least gradient the stage can hold
    (``_least_synced_params``), at its least (``stage.stage_dp_sync_runs_least_s``).

    The search's bounds take a ring over the fastest zones with room for it: a stage placed over
    a slow link (geo AE row 0: us-west1-b with us-central1's zones) simulated 2-3x its bound."""
    memo, last, worst = searcher.memos.model.least_syncs, len(placed) - 1, 0.0
    factors: dict[int, float] = {}  # id(regime) -> the least ZeRO factor (the stages share a few regimes)
    for index, (kind, zones) in enumerate(placed):
        where = "alone" if not last else "first" if index == 0 else "last" if index == last else "inner"
        key = (kind, zones, where)
        sync_s = memo.get(key)
        if sync_s is None:
            params = memo.get((kind, where))
            if params is None:
                params = memo[(kind, where)] = _least_synced_params(kind, where)
            sync_s = memo[key] = 0.0 if sum(n for _, n in zones) < 2 else stage_dp_sync_runs_least_s(
                searcher.network, params * kind.regime.grad_bytes_per_param,
                _runs(kind, zones))
        factor = factors.get(id(kind.regime))
        if factor is None:
            factor = factors[id(kind.regime)] = min(zero_sync_factor(z, kind.regime) for z in range(zero_stage + 1))
        sync_s *= factor
        if sync_s > worst:
            worst = sync_s
    return worst


def two_stage_s(searcher: Searcher, mbs: int, placed, zero_stage: int) -> float:
    """A lower bound on the iteration of every split of ``placed`` (two stages of equal replica counts, on
    the kinds it is evaluated on) with any ZeRO stage up to ``zero_stage``; 0 for other shapes.  The
    least over the split's boundary of its pipeline and its slowest stage's end together, where the
    shape's bounds and ``least_sync_s`` take each at its own least (the pipeline at a balanced
    split, the sync at the split syncing the fewest parameters, the links apart): on homogeneous AE
    row 0 each was 5-15 % under simulated, and a balanced split syncs half the model.

    1F1B (``pipeline_time``: ``T_k = B_k + G_k + b_k + S_k + w_k C_k``; ``G_k`` at least ``f_k``
    plus the round trip beyond k, ``S_k`` at least ``R_k - w_k t_k`` and, blocking, ``(n_k - 1 -
    w_k)`` times both links, ``C_k`` at least ``b_k`` and, blocking, half the links): with ``n``
    micro-batches a replica (at least ``ceil(M / D)``), ``w_0`` 0 or 1 and the link at most its
    slowest replica pair's (``stage.boundary_transfer_s``: the least over the zone pairs;
    ``_pipe_s``); then the slowest stage's end (``compose.iteration_s``): each stage's sync at its
    least for the bytes it holds (``stage.stage_dp_sync_runs_least_s``), at the least ZeRO factor,
    and the embedding group's sum, which ends both.  Boundaries are taken by their pipeline bound,
    the syncs computed until that alone reaches the least found."""
    if len(placed) != 2:
        return 0.0
    (k0, z0), (k1, z1) = placed
    d = sum(n for _, n in z0)
    if d != sum(n for _, n in z1):
        return 0.0
    n = -(-(searcher.req.global_batch_size // mbs) // d)
    regime = searcher.fast.regime_for(k0)
    blocking = compose.p2p_schedule(regime) == "blocking"
    t0, t1 = layer_table(k0.profile), layer_table(k1.profile)
    last = searcher.num_layers
    pairs = [(endpoint(a, k0.gpu, k0.tp_degree), endpoint(b, k1.gpu, k1.tp_degree)) for a, _ in z0 for b, _ in z1]
    links: dict[int, float] = {}
    pipes = []
    # (the tables' prefix sums read directly, as ``LayerTable.fwd_s`` and ``stage.boundary_bytes`` do)
    fc0, bc0, fc1, bc1, out0 = t0.fwd_cum, t0.bwd_cum, t1.fwd_cum, t1.bwd_cum, t0.output_bytes
    for e in range(1, last):
        f0 = fc0[e] - fc0[0]
        nbytes = out0[e - 1]
        link_s = links.get(nbytes)
        if link_s is None:
            link_s = links[nbytes] = min(boundary_transfer_s(searcher.network, nbytes, src, dst,
                                                             partitioned=compose.partitions_boundaries(regime))
                                         for src, dst in pairs)
        s1 = (fc1[last] - fc1[e]) + (bc1[last] - bc1[e])
        pipes.append((_pipe_s(f0 + (bc0[e] - bc0[0]), f0, s1, n, link_s, blocking), e))
    pipes.sort()
    tied_s = _tied_s(searcher, placed)
    if d < 2:
        return pipes[0][0] + tied_s
    factor = min(zero_sync_factor(z, k.regime) for z in range(zero_stage + 1) for k in (k0, k1))
    best = math.inf
    for pipe, e in pipes:
        if pipe >= best:
            break
        sync_s = max(_sync_s(searcher, k0, z0, 0, e), _sync_s(searcher, k1, z1, e, last)) * factor
        best = min(best, pipe + sync_s)
    return best + tied_s


def _pipe_s(s0: float, f0: float, s1: float, n: int, link_s: float, blocking: bool) -> float:
    """``two_stage_s``'s pipeline bound: stage steps ``s0`` (forward ``f0``) and ``s1``, ``n``
    micro-batches a replica, a link of at least ``link_s``.  Through the last stage ``t_0 + l +
    n t_1`` (blocking: ``t_0 + n (t_1 + l)``); through the first ``n t_0 - w f_0 + t_1 + l``
    (blocking: ``+ (n - w / 2) l``), the lesser over ``w`` 0 and 1."""
    if blocking:
        last = s0 + n * (s1 + link_s)
        first = min(n * s0 + s1 + n * link_s, n * s0 - f0 + s1 + (n - 0.5) * link_s)
    else:
        last = s0 + link_s + n * s1
        first = min(n * s0 + s1 + link_s, n * s0 - f0 + s1 + link_s)
    return max(last, first)


def _tied_s(searcher: Searcher, placed) -> float:
    """The embedding group's sum that ends both stages of a two-stage plan on ``placed``, as
    ``fastsim`` times it (``stage.tied_sync_runs_s``): the same for every split."""
    (k0, z0), (k1, z1) = placed
    thinnest = k0 if k0.tp_degree <= k1.tp_degree else k1
    tied_bytes = tied_sync_bytes(thinnest.profile, searcher.fast.regime_for(k0))
    runs = member_runs([((zone, kind.gpu, kind.tp_degree), n) for kind, zones in placed for zone, n in zones])
    return tied_sync_runs_s(searcher.network, tied_bytes, runs)


def _sync_s(searcher: Searcher, kind, zones, start: int, end: int) -> float:
    """``stage.stage_dp_sync_runs_least_s`` of layers [start, end) on ``kind`` over ``zones``."""
    memo, key = searcher.memos.model.least_syncs, (kind, zones, start, end)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = stage_dp_sync_runs_least_s(
            searcher.network, dp_synced_params(layer_table(kind.profile), start, end) * kind.regime.grad_bytes_per_param,
            _runs(kind, zones))
    return hit


def _runs(kind, zones) -> list:
    """``stage.member_runs`` of ``kind``'s replicas over ``zones`` ((zone, count) pairs)."""
    return member_runs([((zone, kind.gpu, kind.tp_degree), n) for zone, n in zones])


def _least_synced_params(kind, where: str) -> int:
    """The fewest parameters a stage on ``kind`` syncs (``memory.dp_synced_params``) in any split:
    the whole model ``alone``; else at least layer 0 on the ``first`` stage (less a tied matrix its
    embedding group sums), the last layer on the ``last``, one inner layer on the others."""
    table = layer_table(kind.profile)
    end = len(table.params_cum) - 1
    if where == "alone":
        return dp_synced_params(table, 0, end)
    if where == "first":
        return dp_synced_params(table, 0, 1)
    if where == "last":
        return dp_synced_params(table, end - 1, end)
    return min(dp_synced_params(table, i, i + 1) for i in range(1, end - 1))


def zero_cannot_pay(searcher: Searcher, ev: Evaluated) -> bool:
    """Whether ZeRO on any stage of ``ev`` cannot score ``MIN_GAIN`` better (``_pays``): where ZeRO
    syncs no fewer bytes than none (``zero_sync_factor`` at least 1: the regimes' weights are as
    wide as their gradients), all it can save is part of a stage's optimizer step
    (``_cannot_gain``).  The AE rows' steps are 0.1-1 ms of 2-9 s iterations, so ``strengthen``
    evaluated 2-4 plans a plan for nothing."""
    factors = _zero_factors(searcher, ev)
    if factors is None or min(factors[1:]) < factors[0]:
        return False
    saved = max((_update_s(stage) for stage in ev.stages if stage.dp_degree >= 2 and not stage_levers(stage)[1]),
                default=0.0)
    return _cannot_gain(searcher, ev, saved)


def stronger_cannot_pay(searcher: Searcher, ev: Evaluated, index: int, top: tuple[str, int]) -> bool:
    """Whether no setting ``relax`` tries after stage ``index``'s in ``ev`` (up to ``top``: more
    recomputation, or as much and a higher ZeRO stage) can score ``MIN_GAIN`` better: where the
    stage's ZeRO stage syncs the fewest bytes of any up to ``top``'s, all a later one can save is
    part of the stage's optimizer step (``_cannot_gain``; recomputation only adds time)."""
    factors = _zero_factors(searcher, ev)
    zero = stage_levers(ev.stages[index])[1]
    if factors is None or factors[zero] > min(factors[: top[1] + 1]):
        return False
    return _cannot_gain(searcher, ev, _update_s(ev.stages[index]))


def _zero_factors(searcher: Searcher, ev: Evaluated) -> tuple[float, ...] | None:
    """``zero_sync_factor`` of ZeRO stages 0-2 under ``ev``'s regime; None for a plan that does not
    fit, or a Pareto front asked for (it keeps every plan tried: a ZeRO one 0.07 % better is on it)."""
    if searcher.req.collect_pareto or not (ev.feasible and ev.res.fits):
        return None
    regime = searcher.fast.regime_for(ev.stages[0].groups[0][0])
    return tuple(zero_sync_factor(z, regime) for z in (0, 1, 2))


def _update_s(stage: FastStage) -> float:
    """The stage's optimizer step unsharded (``stage.stage_update_s``), its slowest kind's."""
    return max(stage_update_s(kind.profile, stage.layer_start, stage.layer_end) for kind, _, _ in stage.groups)


def _cannot_gain(searcher: Searcher, ev: Evaluated, saved_s: float) -> bool:
    """Whether a plan that differs from ``ev`` in stronger levers on its stages, none computing or
    syncing sooner (so its ring meets its last sends no sooner: ``compose.drain_contention_s``),
    at the same rent and no less egress, and saving at most ``saved_s`` of optimizer steps,
    cannot score ``MIN_GAIN`` better than ``ev`` (``_pays``)."""
    res = ev.res
    if saved_s >= res.iteration_time_s:
        return False
    t = res.iteration_time_s - saved_s
    best = searcher.req.ranking.score(throughput_samples_per_s=searcher.req.global_batch_size / t,
                                      usd_per_iteration=res.usd_per_iteration - res.usd_per_hour * saved_s / 3600)
    return best >= ev.score - (MIN_GAIN - 1e-9) * abs(ev.score)  # (a margin for rounding)


def stage_levers(stage: FastStage) -> tuple[str, int]:
    """(recomputation, ZeRO stage) of a stage of one lever setting."""
    kind = stage.groups[0][0]
    return kind.recompute, kind.zero_stage
