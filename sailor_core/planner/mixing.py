"""Mixing GPU types inside a stage: leftover GPUs join the busiest stage of a plan as extra
replicas while the simulated objective improves (see docs/planner.md)."""

from __future__ import annotations

from sailor_core.plan.types import RECOMPUTE_NONE
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import valid_tp_degrees
from sailor_core.planner.search import Evaluated, Searcher, better
from sailor_core.simulator.memory import inflight_microbatches


def mix_leftovers(searcher: Searcher, ev: Evaluated, max_added: int = 64) -> Evaluated:
    """Add leftover GPUs as extra replicas of the busiest stage while the objective improves.

    A replica only joins a stage if it is not slower than the stage's straggler on that
    stage's layers and fits its memory, so it takes micro-batches off the others.
    """
    if any(g[0].recompute != RECOMPUTE_NONE or g[0].zero_stage for st in ev.stages for g in st.groups):
        return ev  # leftovers would join without the stage's levers (planner/levers.py)
    best = ev
    added = 0
    tried: set = set()
    while added < max_added and searcher.stats.num_evaluated < searcher.req.max_evaluations:
        left = _leftover(searcher, best)
        if not left:
            break
        res = best.res
        order = sorted(range(len(best.stages)), key=lambda i: -res.busy_s[i])
        improved = None
        for si in order[:2]:
            improved = _join_stage(searcher, ev.mbs, best, si, left, tried)
            if improved is not None:
                break
        if improved is None:
            break
        best = improved
        added += 1
    return best


def _join_stage(searcher: Searcher, mbs: int, best: Evaluated, si: int, left: dict, tried: set) -> Evaluated | None:
    """``best`` with one more replica in stage ``si`` (the first of the three likeliest options
    not tried yet that improves it), or None."""
    stage = best.stages[si]
    for _, tp, _, gpu, zone, kind in sorted(_options(searcher, mbs, best, si, left), key=lambda o: o[:5])[:3]:
        key = (si, gpu, zone, tp, stage.dp_degree)
        if key in tried:
            continue
        tried.add(key)
        groups = list(stage.groups)
        if groups[-1][0] is kind and groups[-1][1] == zone:
            groups[-1] = (kind, zone, groups[-1][2] + 1)
        else:
            groups.append((kind, zone, 1))
        stages = list(best.stages)
        stages[si] = FastStage(stage.layer_start, stage.layer_end, tuple(groups))
        trial = searcher.evaluate(mbs, tuple(stages))
        if better(trial, best):
            return trial
    return None


def _options(searcher: Searcher, mbs: int, best: Evaluated, si: int, left: dict) -> list[tuple]:
    """Leftover (GPU, zone, TP) that may join stage ``si``: (not in one of its zones, TP, its
    time on the stage's layers, GPU, zone, kind), if it is not slower than the straggler and fits."""
    req = searcher.req
    num_mb = req.global_batch_size // mbs
    stage = best.stages[si]
    straggler_s = best.res.compute_s[si]
    options = []
    for (gpu, zone), count in sorted(left.items()):
        for tp in valid_tp_degrees(req.model, gpu, req.max_tp_degree):
            if tp > count:
                continue
            kind = searcher.kinds.get(gpu, tp, mbs)
            if kind is None:
                continue
            kind = searcher.kinds.in_regime_of(kind, best.stages[0].groups[0][0])
            t = kind.time_s(stage.layer_start, stage.layer_end)
            if t > straggler_s * (1 + 1e-9):
                continue
            d_new = stage.dp_degree + 1
            if d_new > num_mb:
                continue
            # The new replica comes last, so it gets the fewest micro-batches: check the most.
            k = inflight_microbatches(si, len(best.stages), -(-num_mb // d_new))
            if not kind.fits(stage.layer_start, stage.layer_end, k):
                continue
            zone_match = any(z == zone for _, z, _ in stage.groups)
            options.append((not zone_match, tp, t, gpu, zone, kind))
    return options


def _leftover(searcher: Searcher, ev: Evaluated) -> dict[tuple[str, str], int]:
    """GPUs per (type, zone) the plan leaves unused."""
    used: dict[tuple[str, str], int] = {}
    for stage in ev.stages:
        for k, z, n in stage.groups:
            used[(k.gpu, z)] = used.get((k.gpu, z), 0) + n * k.tp_degree
    return {k: n - used.get(k, 0) for k, n in searcher.req.availability.items() if n - used.get(k, 0) > 0}
